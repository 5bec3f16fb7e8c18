//! A stand-in for a Kubernetes API server, for the coordinator's
//! `kubernetes` worker pool: it answers the two calls the pool makes (get
//! and merge-patch of `deployments/<name>/scale`) with responses in the API
//! server's own shapes, kept in `tests/data/kube/` (a `Scale` object, and
//! the `Status` of an RBAC refusal), and records every request. No API
//! server runs on the machines these tests run on.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// One request the API server got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeRequest {
    /// GET or PATCH.
    pub method: String,
    /// The path asked for.
    pub path: String,
    /// Its Content-Type, for a PATCH.
    pub content_type: String,
    /// Its body.
    pub body: String,
}

#[derive(Debug)]
struct Cluster {
    /// The Deployment's replicas.
    replicas: u32,
    /// Answer every call with the recorded RBAC refusal.
    forbid: bool,
    /// What was asked.
    requests: Vec<KubeRequest>,
}

/// The stand-in API server, serving until dropped.
#[derive(Debug)]
pub struct KubeApi {
    addr: SocketAddr,
    state: Arc<Mutex<Cluster>>,
    runtime: tokio::runtime::Runtime,
    kubeconfig: tempfile::NamedTempFile,
}

fn recorded(name: &str) -> serde_json::Value {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/kube").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

async fn scale(
    State(state): State<Arc<Mutex<Cluster>>>,
    UrlPath((namespace, name)): UrlPath<(String, String)>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut cluster = state.lock().unwrap_or_else(|p| p.into_inner());
    cluster.requests.push(KubeRequest {
        method: method.to_string(),
        path: format!("/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"),
        content_type: headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned(),
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    if cluster.forbid {
        return (StatusCode::FORBIDDEN, json(recorded("forbidden.json"))).into_response();
    }
    if method == Method::PATCH {
        let patch: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        match patch["spec"]["replicas"].as_u64() {
            Some(n) => cluster.replicas = n as u32,
            None => return (StatusCode::UNPROCESSABLE_ENTITY, "no spec.replicas").into_response(),
        }
    }
    let mut answer = recorded("scale.json");
    answer["metadata"]["name"] = name.into();
    answer["metadata"]["namespace"] = namespace.into();
    answer["spec"]["replicas"] = cluster.replicas.into();
    answer["status"]["replicas"] = cluster.replicas.into();
    (StatusCode::OK, json(answer)).into_response()
}

fn json(v: serde_json::Value) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], v.to_string())
}

impl KubeApi {
    /// Serves a cluster whose worker Deployment has `replicas`; with
    /// `forbid`, every call gets the recorded 403.
    pub fn start(replicas: u32, forbid: bool) -> KubeApi {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let state = Arc::new(Mutex::new(Cluster { replicas, forbid, requests: Vec::new() }));
        let app = Router::new()
            .route("/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale", get(scale).patch(scale))
            .with_state(Arc::clone(&state));
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
        let addr = listener.local_addr().expect("addr");
        runtime.spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let mut kubeconfig = tempfile::NamedTempFile::new().expect("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: http://{addr}\n\
             contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: ml\n\
             current-context: test\nusers:\n- name: test\n  user:\n    token: test-token\n"
        );
        std::io::Write::write_all(&mut kubeconfig, text.as_bytes()).expect("write kubeconfig");
        KubeApi { addr, state, runtime, kubeconfig }
    }

    /// A kubeconfig pointing at this server (namespace `ml`).
    pub fn kubeconfig(&self) -> &Path {
        self.kubeconfig.path()
    }

    /// The Deployment's replicas now.
    pub fn replicas(&self) -> u32 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).replicas
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<KubeRequest> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).requests.clone()
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        let _ = &self.runtime;
        self.addr
    }
}
