//! The `kubernetes` backend (`loader-server --worker-pool kubernetes
//! --worker-deployment NAME`): the pool is the worker Deployment, sized
//! through its `scale` subresource with the `kube` client (in-cluster
//! service account, or a kubeconfig outside a cluster).
//!
//! Growing patches `spec.replicas` up. Shrinking patches it down and
//! Kubernetes picks the pods to delete; each gets SIGTERM, on which a
//! worker stops taking tasks and delivers or hands back what it holds
//! before it exits (within the pod's termination grace period), so nothing
//! is lost or delivered twice. The coordinator's service account needs
//! `get` and `patch` on `deployments/scale` (the Helm chart's Role); a
//! refusal is a one-line `PermissionDenied` naming the verb and resource.

use k8s_openapi::api::apps::v1::Deployment as K8sDeployment;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Config};
use loader_proto::pb;

use crate::config::KubernetesPoolConfig;
use crate::error::CoordinatorError;

/// The worker Deployment.
pub(crate) struct Deployment {
    api: Api<K8sDeployment>,
    name: String,
    namespace: String,
}

impl std::fmt::Debug for Deployment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deployment").field("name", &self.name).field("namespace", &self.namespace).finish()
    }
}

impl Deployment {
    /// A client for the Deployment `config` names, from the in-cluster
    /// environment or the kubeconfig (`KUBECONFIG`).
    pub(crate) async fn connect(config: &KubernetesPoolConfig) -> Result<Self, CoordinatorError> {
        // More than one rustls crypto provider is compiled into this binary,
        // so rustls cannot pick one itself: use ring (an error only means
        // one was installed already).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client_config = Config::infer()
            .await
            .map_err(|e| CoordinatorError::ScaleFailed(format!("kubernetes: no cluster configuration: {e}")))?;
        let namespace = config.namespace.clone().unwrap_or_else(|| client_config.default_namespace.clone());
        let client = Client::try_from(client_config)
            .map_err(|e| CoordinatorError::ScaleFailed(format!("kubernetes: cannot make a client: {e}")))?;
        Ok(Self {
            api: Api::namespaced(client, &namespace),
            name: config.deployment.clone(),
            namespace,
        })
    }

    /// The replicas the Deployment asks for now.
    pub(crate) async fn replicas(&self) -> Result<u32, CoordinatorError> {
        let scale = self.api.get_scale(&self.name).await.map_err(|e| self.failed("get", e))?;
        let replicas = scale.spec.and_then(|s| s.replicas).unwrap_or(0);
        Ok(u32::try_from(replicas).unwrap_or(0))
    }

    /// Sets the Deployment's replicas to `workers`.
    pub(crate) async fn scale(&self, workers: u32) -> Result<pb::ScaleWorkersResponse, CoordinatorError> {
        let previous = self.replicas().await?;
        if workers != previous {
            let patch = serde_json::json!({ "spec": { "replicas": workers } });
            self.api
                .patch_scale(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| self.failed("patch", e))?;
        }
        tracing::info!(deployment = %self.name, namespace = %self.namespace, previous, workers, "worker Deployment scaled");
        Ok(pb::ScaleWorkersResponse {
            previous,
            workers,
            started: workers.saturating_sub(previous),
            // Kubernetes picks the pods; each drains on its SIGTERM.
            draining: Vec::new(),
        })
    }

    /// One line for a failed call: a refusal (401/403) is PermissionDenied.
    fn failed(&self, verb: &str, e: kube::Error) -> CoordinatorError {
        let what = format!("deployments/scale {}/{}", self.namespace, self.name);
        match e {
            kube::Error::Api(status) if status.code == 401 || status.code == 403 => CoordinatorError::ScaleRefused(format!(
                "kubernetes refused to {verb} {what}: {} (the coordinator's service account needs get and patch on deployments/scale)",
                status.message
            )),
            kube::Error::Api(status) => {
                CoordinatorError::ScaleFailed(format!("kubernetes: cannot {verb} {what}: {} ({})", status.message, status.code))
            }
            other => CoordinatorError::ScaleFailed(format!("kubernetes: cannot {verb} {what}: {other}")),
        }
    }
}
