//! Security with real processes: every RPC of every service refuses a call
//! without a token, with a wrong one and with each other role's; a trainer
//! cannot act for another's session; TLS refuses plaintext clients and
//! clients trusting another CA in one line; a whole job runs over mutual
//! TLS with tokens.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt as _};
use loader_e2e::{Cluster, Proc, Scope, TestCa, binary, run, write_secret};
use loader_process::grpc::{Channel, endpoint};
use loader_process::security::tls::ClientTls;
use loader_process::security::{ClientSecurity, OpenSecrets, Role, SessionKeys, Token};
use loader_proto::keda::external_scaler_client::ExternalScalerClient;
use loader_proto::keda::{GetMetricsRequest, ScaledObjectRef};
use loader_proto::pb::admin_service_client::AdminServiceClient;
use loader_proto::pb::batch_service_client::BatchServiceClient;
use loader_proto::pb::trainer_service_client::TrainerServiceClient;
use loader_proto::pb::worker_service_client::WorkerServiceClient;
use loader_proto::pb::{self, FetchRequest};
use tonic::{Code, Status};

const WORKER: &str = "worker-token-0123456789abcdef";
const TRAINER: &str = "trainer-token-0123456789abcdef";
const ADMIN: &str = "admin-token-0123456789abcdef";
const WRONG: &str = "not-a-token-0123456789abcdef";
/// One call's limit.
const CALL: Duration = Duration::from_secs(10);

fn token_env() -> Vec<(String, String)> {
    [("LOADER_WORKER_TOKEN", WORKER), ("LOADER_TRAINER_TOKEN", TRAINER), ("LOADER_ADMIN_TOKEN", ADMIN)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn with_token(token: Option<&str>) -> ClientSecurity {
    ClientSecurity { tls: None, token: token.map(|t| Token::new(t, "test").expect("token")) }
}

type Call = fn(Channel) -> BoxFuture<'static, Result<(), Status>>;

/// Every RPC of the coordinator, with the role it needs.
const COORDINATOR: &[(&str, Role, Call)] = &[
    ("WorkerService/RegisterWorker", Role::Worker, |c| {
        async move { WorkerServiceClient::new(c).register_worker(pb::RegisterWorkerRequest::default()).await.map(drop) }.boxed()
    }),
    ("WorkerService/Heartbeat", Role::Worker, |c| {
        async move { WorkerServiceClient::new(c).heartbeat(pb::WorkerHeartbeatRequest::default()).await.map(drop) }.boxed()
    }),
    ("WorkerService/Deregister", Role::Worker, |c| {
        async move { WorkerServiceClient::new(c).deregister(pb::DeregisterRequest::default()).await.map(drop) }.boxed()
    }),
    ("WorkerService/GetBlob", Role::Worker, |c| {
        async move { WorkerServiceClient::new(c).get_blob(pb::GetBlobRequest::default()).await.map(drop) }.boxed()
    }),
    ("TrainerService/PutBlob", Role::Trainer, |c| {
        async move { TrainerServiceClient::new(c).put_blob(pb::PutBlobRequest::default()).await.map(drop) }.boxed()
    }),
    ("TrainerService/CreateOrAttachJob", Role::Trainer, |c| {
        async move {
            TrainerServiceClient::new(c).create_or_attach_job(pb::CreateOrAttachJobRequest::default()).await.map(drop)
        }
        .boxed()
    }),
    ("TrainerService/OpenSession", Role::Trainer, |c| {
        async move { TrainerServiceClient::new(c).open_session(pb::OpenSessionRequest::default()).await.map(drop) }.boxed()
    }),
    ("TrainerService/Heartbeat", Role::Trainer, |c| {
        async move { TrainerServiceClient::new(c).heartbeat(pb::SessionHeartbeatRequest::default()).await.map(drop) }.boxed()
    }),
    ("TrainerService/Routes", Role::Trainer, |c| {
        async move { TrainerServiceClient::new(c).routes(pb::RoutesRequest::default()).await.map(drop) }.boxed()
    }),
    ("TrainerService/CloseSession", Role::Trainer, |c| {
        async move { TrainerServiceClient::new(c).close_session(pb::CloseSessionRequest::default()).await.map(drop) }.boxed()
    }),
    ("AdminService/ListWorkers", Role::Admin, |c| {
        async move { AdminServiceClient::new(c).list_workers(pb::ListWorkersRequest::default()).await.map(drop) }.boxed()
    }),
    ("AdminService/ListJobs", Role::Admin, |c| {
        async move { AdminServiceClient::new(c).list_jobs(pb::ListJobsRequest::default()).await.map(drop) }.boxed()
    }),
    ("AdminService/DrainWorker", Role::Admin, |c| {
        async move { AdminServiceClient::new(c).drain_worker(pb::DrainWorkerRequest::default()).await.map(drop) }.boxed()
    }),
    ("AdminService/ScaleWorkers", Role::Admin, |c| {
        async move { AdminServiceClient::new(c).scale_workers(pb::ScaleWorkersRequest::default()).await.map(drop) }.boxed()
    }),
    ("AdminService/Autoscale", Role::Admin, |c| {
        async move { AdminServiceClient::new(c).autoscale(pb::AutoscaleRequest::default()).await.map(drop) }.boxed()
    }),
    ("AdminService/ListSessions", Role::Admin, |c| {
        async move { AdminServiceClient::new(c).list_sessions(pb::ListSessionsRequest::default()).await.map(drop) }.boxed()
    }),
    ("ExternalScaler/IsActive", Role::Admin, |c| {
        async move { ExternalScalerClient::new(c).is_active(ScaledObjectRef::default()).await.map(drop) }.boxed()
    }),
    ("ExternalScaler/StreamIsActive", Role::Admin, |c| {
        async move { ExternalScalerClient::new(c).stream_is_active(ScaledObjectRef::default()).await.map(drop) }.boxed()
    }),
    ("ExternalScaler/GetMetricSpec", Role::Admin, |c| {
        async move { ExternalScalerClient::new(c).get_metric_spec(ScaledObjectRef::default()).await.map(drop) }.boxed()
    }),
    ("ExternalScaler/GetMetrics", Role::Admin, |c| {
        async move { ExternalScalerClient::new(c).get_metrics(GetMetricsRequest::default()).await.map(drop) }.boxed()
    }),
];

/// A worker's one RPC, with a valid session key (so that only the token decides).
fn fetch(channel: Channel) -> BoxFuture<'static, Result<(), Status>> {
    let keys = SessionKeys::from_worker_token(&Token::new(WORKER, "test").expect("token"));
    let opening = FetchRequest { job_id: 1, consumer: 0, session_id: 1, credits: 0, session_key: keys.key(1, 0, 1) };
    async move { BatchServiceClient::new(channel).fetch(futures::stream::iter([opening])).await.map(drop) }.boxed()
}

/// What a call with `token` to an RPC that needs `needed` must get, on a
/// server that knows the tokens of `known` roles.
fn expected(token: Option<&str>, needed: Role, known: &[Role]) -> Option<Code> {
    let role = match token {
        Some(WORKER) => Some(Role::Worker),
        Some(TRAINER) => Some(Role::Trainer),
        Some(ADMIN) => Some(Role::Admin),
        _ => None,
    };
    match role {
        Some(r) if r == needed => None,
        Some(r) if known.contains(&r) => Some(Code::PermissionDenied),
        _ => Some(Code::Unauthenticated),
    }
}

fn call(runtime: &tokio::runtime::Runtime, url: &str, token: Option<&str>, rpc: Call) -> Result<(), Status> {
    runtime.block_on(async {
        let channel = endpoint(url, &with_token(token)).expect("url").connect_lazy();
        tokio::time::timeout(CALL, rpc(channel)).await.expect("the call was answered")
    })
}

#[test]
fn every_rpc_checks_the_callers_role() {
    run(Duration::from_secs(120), |scope| {
        let mut builder = Cluster::builder().secured(false, with_token(Some(ADMIN)));
        for (k, v) in token_env() {
            builder = builder.env(k, v);
        }
        let cluster = builder.workers(1).start(&scope);
        let worker_url = format!("http://{}", cluster.workers[0].addr());
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let tokens = [None, Some(WRONG), Some(WORKER), Some(TRAINER), Some(ADMIN)];
        let mut table = Vec::new();
        // (url, roles its tokens grant, the calls tried on it)
        type Server<'a> = (String, &'a [Role], Vec<(&'a str, Role, Call)>);
        let servers: Vec<Server<'_>> = vec![
            (cluster.url(), &Role::ALL, COORDINATOR.to_vec()),
            // A worker knows the worker token (its own) and the trainer
            // token (it checks fetches); not the admin token.
            (worker_url, &[Role::Worker, Role::Trainer], vec![("BatchService/Fetch", Role::Trainer, fetch as Call)]),
        ];
        for (url, known, rpcs) in &servers {
            for (name, needed, rpc) in rpcs {
                for token in tokens {
                    let got = call(&runtime, url, token, *rpc).err();
                    let want = expected(token, *needed, known);
                    let label = match token {
                        None => "no token",
                        Some(WRONG) => "a wrong token",
                        Some(WORKER) => "the worker token",
                        Some(TRAINER) => "the trainer token",
                        _ => "the admin token",
                    };
                    match want {
                        Some(code) => {
                            let status = got.as_ref().unwrap_or_else(|| panic!("{name} with {label}: let through"));
                            assert_eq!(status.code(), code, "{name} with {label}: {}", status.message());
                            assert!(!status.message().contains('\n') && !status.message().is_empty(), "{name}");
                        }
                        None => {
                            if let Some(status) = &got {
                                assert!(
                                    !matches!(status.code(), Code::Unauthenticated | Code::PermissionDenied),
                                    "{name} with {label}: refused: {status:?}"
                                );
                            }
                        }
                    }
                    table.push(format!("{name:<34} {label:<18} {:?}", got.map_or(Code::Ok, |s| s.code())));
                }
            }
        }
        // Health checks stay open (Kubernetes probes send no token).
        let health = runtime.block_on(async {
            let channel = endpoint(&cluster.url(), &with_token(None)).expect("url").connect_lazy();
            let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
            client.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await
        });
        assert!(health.is_ok(), "{health:?}");
        eprintln!("{}", table.join("\n"));
        assert_eq!(table.len(), (COORDINATOR.len() + 1) * tokens.len());
    });
}

#[test]
fn a_trainer_acts_only_for_its_own_session() {
    run(Duration::from_secs(120), |scope| {
        let mut builder = Cluster::builder().secured(false, with_token(Some(ADMIN)));
        for (k, v) in token_env() {
            builder = builder.env(k, v);
        }
        let cluster = builder.workers(1).start(&scope);
        let worker_url = format!("http://{}", cluster.workers[0].addr());
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let trainer = || endpoint(&cluster.url(), &with_token(Some(TRAINER))).expect("url").connect_lazy();
            let mut client = TrainerServiceClient::new(trainer());
            let spec = loader_client::spec::synthetic(64, &[4], loader_client::Dtype::U8)
                .batch_size(8)
                .consumers(2)
                .build()
                .expect("spec");
            let job = client
                .create_or_attach_job(pb::CreateOrAttachJobRequest { protocol_version: loader_proto::PROTOCOL_VERSION, spec: Some(spec) })
                .await
                .expect("job")
                .into_inner()
                .job
                .expect("job");
            let open = |consumer| pb::OpenSessionRequest {
                protocol_version: loader_proto::PROTOCOL_VERSION,
                job_id: job.job_id,
                consumer,
                node: "t".into(),
                ..Default::default()
            };
            let mine = client.open_session(open(0)).await.expect("open 0").into_inner();
            let theirs = client.open_session(open(1)).await.expect("open 1").into_inner();
            assert_eq!(mine.session_key.len(), 32);
            assert_ne!(mine.session_key, theirs.session_key);
            // My key on their session: refused, on every session call.
            let heartbeat = pb::SessionHeartbeatRequest {
                protocol_version: loader_proto::PROTOCOL_VERSION,
                session_id: theirs.session_id,
                session_key: mine.session_key.clone(),
                ..Default::default()
            };
            let e = client.heartbeat(heartbeat.clone()).await.expect_err("their session, my key");
            assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
            assert!(e.message().contains("session key"), "{}", e.message());
            let e = client
                .routes(pb::RoutesRequest { session_id: theirs.session_id, session_key: mine.session_key.clone() })
                .await
                .expect_err("routes");
            assert_eq!(e.code(), Code::PermissionDenied);
            let e = client
                .close_session(pb::CloseSessionRequest {
                    protocol_version: loader_proto::PROTOCOL_VERSION,
                    session_id: theirs.session_id,
                    session_key: String::new(),
                    ..Default::default()
                })
                .await
                .expect_err("close");
            assert_eq!(e.code(), Code::PermissionDenied);
            // With its own key, each goes through.
            client
                .heartbeat(pb::SessionHeartbeatRequest { session_key: theirs.session_key.clone(), ..heartbeat })
                .await
                .expect("own key");
            // A worker refuses a fetch of consumer 1 with session 0's key.
            let worker = endpoint(&worker_url, &with_token(Some(TRAINER))).expect("url").connect_lazy();
            let opening = FetchRequest {
                job_id: job.job_id,
                consumer: 1,
                session_id: mine.session_id,
                credits: 1,
                session_key: mine.session_key.clone(),
            };
            let e = BatchServiceClient::new(worker).fetch(futures::stream::iter([opening])).await.expect_err("fetch");
            assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        });
    });
}

/// `loaderctl` with `args` and `env`; its exit code and output.
fn loaderctl(scope: &Scope, args: &[&str], env: &[(&str, &Path)]) -> (i32, Vec<String>, Vec<String>) {
    let mut command = Command::new(binary("loaderctl"));
    command.args(args);
    for (k, v) in env {
        command.env(k, v);
    }
    let mut proc = Proc::spawn_capturing_stderr(scope, "loaderctl", command, false);
    let status = proc.wait_exit(Duration::from_secs(60)).expect("loaderctl exits");
    (status.code().unwrap_or(-1), proc.stdout(), proc.stderr())
}

fn one_error_line(stderr: &[String]) -> String {
    let errors: Vec<&String> = stderr.iter().filter(|l| l.starts_with("loaderctl: error:")).collect();
    assert_eq!(errors.len(), 1, "one error line: {stderr:?}");
    eprintln!("{}", errors[0]);
    errors[0].clone()
}

#[test]
fn tls_refuses_plaintext_and_foreign_ca_clients_in_one_line() {
    run(Duration::from_secs(120), |scope| {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = TestCa::new(dir.path(), "ca");
        let other = TestCa::new(dir.path(), "other");
        let server = ca.leaf("server");
        let admin_tls =
            ClientSecurity { tls: Some(ClientTls { ca: ca.cert(), identity: None, open_secrets: OpenSecrets::Refuse }), token: None };
        let cluster = Cluster::builder()
            .secured(true, admin_tls)
            .env("LOADER_TLS_CERT", server.cert.display().to_string())
            .env("LOADER_TLS_KEY", server.key.display().to_string())
            .env("LOADER_TLS_CA", ca.cert().display().to_string())
            .workers(1)
            .start(&scope);
        let addr = cluster.server.addr().to_owned();

        // TLS with the right CA works, also for a host:port address.
        let (code, stdout, stderr) = loaderctl(&scope, &["status", "--coordinator", &addr, "--json"], &[("LOADER_TLS_CA", &ca.cert())]);
        assert_eq!(code, 0, "{stderr:?}");
        assert!(stdout.concat().contains("https://"), "the worker advertises https: {stdout:?}");

        // Plaintext against TLS.
        let plain = format!("http://{addr}");
        let (code, _, stderr) = loaderctl(&scope, &["status", "--coordinator", &plain], &[]);
        assert_eq!(code, 1);
        let line = one_error_line(&stderr);
        assert!(line.contains(&plain), "names the address: {line}");
        assert!(line.contains("TLS"), "says TLS: {line}");

        // Another CA.
        let (code, _, stderr) =
            loaderctl(&scope, &["status", "--coordinator", &addr, "--tls-ca", &other.cert().display().to_string()], &[]);
        assert_eq!(code, 1);
        let line = one_error_line(&stderr);
        assert!(line.contains(&format!("https://{addr}")), "names the address: {line}");
        assert!(line.contains("not signed by the CA in --tls-ca"), "{line}");

        // TLS against a plaintext coordinator.
        let plain_cluster = Cluster::builder().start(&scope);
        let (code, _, stderr) = loaderctl(
            &scope,
            &["status", "--coordinator", &format!("https://{}", plain_cluster.server.addr())],
            &[("LOADER_TLS_CA", &ca.cert())],
        );
        assert_eq!(code, 1);
        let line = one_error_line(&stderr);
        assert!(line.contains("does not speak TLS"), "{line}");

        // https:// with no CA configured.
        let (code, _, stderr) = loaderctl(&scope, &["status", "--coordinator", &format!("https://{addr}")], &[]);
        assert_eq!(code, 1);
        assert!(one_error_line(&stderr).contains("--tls-ca"), "{stderr:?}");
    });
}

#[test]
fn a_job_runs_over_mutual_tls_with_tokens() {
    run(Duration::from_secs(180), |scope| {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = TestCa::new(dir.path(), "ca");
        let other = TestCa::new(dir.path(), "other");
        let server = ca.leaf("server");
        let trainer = ca.leaf("trainer");
        let stranger = other.leaf("stranger");
        let expired = ca.expired_leaf("expired");
        let token_file = dir.path().join("trainer.token");
        write_secret(&token_file, format!("{TRAINER}\n").as_bytes());
        let admin = ClientSecurity {
            tls: Some(ClientTls {
                ca: ca.cert(),
                identity: Some((trainer.cert.clone(), trainer.key.clone())),
                open_secrets: OpenSecrets::Refuse,
            }),
            token: Some(Token::new(ADMIN, "test").expect("token")),
        };
        let mut builder = Cluster::builder()
            .secured(true, admin)
            .env("LOADER_TLS_CERT", server.cert.display().to_string())
            .env("LOADER_TLS_KEY", server.key.display().to_string())
            .env("LOADER_TLS_CLIENT_CA", ca.cert().display().to_string())
            .env("LOADER_TLS_CA", ca.cert().display().to_string());
        for (k, v) in token_env() {
            builder = builder.env(k, v);
        }
        let cluster = builder.workers(2).start(&scope);
        let url = cluster.url();
        let ca_cert = ca.cert();
        let dump = dir.path().join("dump");
        let job = [
            "consume", "--coordinator", &url, "--samples", "2000", "--shape", "64", "--batch-size", "32", "--epochs", "2",
            "--transport", "grpc", "--json", "--dump",
        ];
        let mut args: Vec<&str> = job.to_vec();
        let dump_arg = dump.display().to_string();
        args.push(&dump_arg);
        let tls_env: [(&str, &Path); 4] = [
            ("LOADER_TLS_CA", &ca_cert),
            ("LOADER_TLS_CERT", &trainer.cert),
            ("LOADER_TLS_KEY", &trainer.key),
            ("LOADER_TRAINER_TOKEN_FILE", &token_file),
        ];
        let (code, stdout, stderr) = loaderctl(&scope, &args, &tls_env);
        assert_eq!(code, 0, "{stderr:?}");
        // Every batch, in order, exactly once: 2000/32 = 63 per epoch.
        let seqs: Vec<u64> = std::fs::read_to_string(&dump)
            .expect("dump")
            .lines()
            .map(|l| l.split(' ').next().expect("seq").parse().expect("number"))
            .collect();
        assert_eq!(seqs, (0..126).collect::<Vec<_>>(), "{stdout:?}");

        // Without a client certificate, or with one from another CA: refused.
        for (label, cert, key) in [("no certificate", None, None), ("another CA's", Some(&stranger.cert), Some(&stranger.key))] {
            let mut env: Vec<(&str, &Path)> = vec![("LOADER_TLS_CA", &ca_cert), ("LOADER_TRAINER_TOKEN_FILE", &token_file)];
            if let (Some(c), Some(k)) = (cert, key) {
                env.extend([("LOADER_TLS_CERT", c.as_path()), ("LOADER_TLS_KEY", k.as_path())]);
            }
            let (code, _, stderr) = loaderctl(&scope, &args, &env);
            assert_eq!(code, 1, "{label}: {stderr:?}");
            let line = one_error_line(&stderr);
            assert!(line.contains(&url), "{label}: names the address: {line}");
        }
        // The right CA's certificate, expired: the refusal names that (the
        // server only hangs up under TLS 1.3; the client knows its own).
        let env: [(&str, &Path); 4] = [
            ("LOADER_TLS_CA", &ca_cert),
            ("LOADER_TLS_CERT", &expired.cert),
            ("LOADER_TLS_KEY", &expired.key),
            ("LOADER_TRAINER_TOKEN_FILE", &token_file),
        ];
        let (code, _, stderr) = loaderctl(&scope, &args, &env);
        assert_eq!(code, 1, "{stderr:?}");
        let line = one_error_line(&stderr);
        assert!(line.contains("expired on") && line.contains(&expired.cert.display().to_string()), "{line}");
        assert!(!line.contains("signed by its CA"), "does not blame the CA: {line}");
        // The right certificate but no token: refused, naming the token.
        let (code, _, stderr) = loaderctl(&scope, &args, &tls_env[..3]);
        assert_eq!(code, 1);
        assert!(one_error_line(&stderr).contains("LOADER_TRAINER_TOKEN"), "{stderr:?}");
    });
}

/// Starts `name` with `args` and `env` and waits for it to exit (it must:
/// each is refused at start-up); its exit code and stderr.
fn refused_at_start(scope: &Scope, name: &str, args: &[&str], env: &[(&str, &Path)]) -> (i32, Vec<String>) {
    let mut command = Command::new(binary(name));
    command.args(args).env_remove("LOADER_ALLOW_OPEN_SECRETS");
    for (k, v) in env {
        command.env(k, v);
    }
    let mut proc = Proc::spawn_capturing_stderr(scope, name, command, false);
    let status = proc.wait_exit(Duration::from_secs(30)).unwrap_or_else(|| panic!("{name} exits"));
    (status.code().unwrap_or(-1), proc.stderr())
}

#[test]
fn secret_files_others_can_read_are_refused_in_one_line_unless_allowed() {
    use std::os::unix::fs::PermissionsExt as _;
    run(Duration::from_secs(120), |scope| {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = TestCa::new(dir.path(), "ca");
        let server = ca.leaf("server");
        let chmod = |path: &Path, mode| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        let token = |name: &str, value: &str| {
            let path = dir.path().join(name);
            write_secret(&path, format!("{value}\n").as_bytes());
            path
        };
        let (worker, trainer, admin) = (token("worker", WORKER), token("trainer", TRAINER), token("admin", ADMIN));
        chmod(&admin, 0o644);
        let tokens: [(&str, &Path); 3] = [
            ("LOADER_WORKER_TOKEN_FILE", &worker),
            ("LOADER_TRAINER_TOKEN_FILE", &trainer),
            ("LOADER_ADMIN_TOKEN_FILE", &admin),
        ];
        let open_token = format!("LOADER_ADMIN_TOKEN_FILE {}: mode 0644 lets group or others read this secret; chmod 600 it", admin.display());

        // The coordinator, a worker and loaderctl each refuse it at start, in one line.
        let (code, stderr) = refused_at_start(&scope, "loader-server", &["--listen", "127.0.0.1:0"], &tokens);
        assert_eq!(code, 1, "{stderr:?}");
        let lines: Vec<&String> = stderr.iter().filter(|l| l.contains("error")).collect();
        assert_eq!(lines.len(), 1, "one line: {stderr:?}");
        assert!(lines[0].starts_with(&format!("loader-server: error: {open_token}")), "{stderr:?}");
        assert!(lines[0].contains("--allow-open-secrets"), "{stderr:?}");

        chmod(&admin, 0o600);
        chmod(&trainer, 0o660);
        let (code, stderr) = refused_at_start(
            &scope,
            "loader-worker",
            &["--coordinator", "http://127.0.0.1:1", "--listen", "127.0.0.1:0"],
            &tokens[..2],
        );
        assert_ne!(code, 0, "{stderr:?}");
        let lines: Vec<&String> = stderr.iter().filter(|l| l.contains("error")).collect();
        assert_eq!(lines.len(), 1, "one line: {stderr:?}");
        assert!(lines[0].contains(&format!("LOADER_TRAINER_TOKEN_FILE {}: mode 0660", trainer.display())), "{stderr:?}");
        chmod(&trainer, 0o600);

        // A TLS private key is a secret too (its certificate is not).
        chmod(&server.key, 0o604);
        chmod(&server.cert, 0o644);
        let (code, stderr) = refused_at_start(
            &scope,
            "loader-server",
            &["--listen", "127.0.0.1:0", "--tls-cert", &server.cert.display().to_string(), "--tls-key", &server.key.display().to_string()],
            &[],
        );
        assert_eq!(code, 1, "{stderr:?}");
        assert!(stderr.concat().contains(&format!("--tls-key {}: mode 0604", server.key.display())), "{stderr:?}");

        // With every file private, a cluster runs; loaderctl refuses an
        // open admin token, and takes it with the flag or its variable.
        chmod(&server.key, 0o600);
        let mut builder = Cluster::builder().secured(false, with_token(Some(ADMIN)));
        for (k, v) in tokens {
            builder = builder.env(k, v.display().to_string());
        }
        let cluster = builder.workers(1).start(&scope);
        chmod(&admin, 0o644);
        let status = ["status", "--coordinator", &cluster.url()];
        let (code, _, stderr) = loaderctl(&scope, &status, &tokens[2..]);
        assert_eq!(code, 1, "{stderr:?}");
        assert!(one_error_line(&stderr).contains(&open_token), "{stderr:?}");
        let (code, _, stderr) = loaderctl(&scope, &[&status[..], &["--allow-open-secrets"][..]].concat(), &tokens[2..]);
        assert_eq!(code, 0, "{stderr:?}");
        let allow = Path::new("1");
        let (code, _, stderr) = loaderctl(&scope, &status, &[tokens[2], ("LOADER_ALLOW_OPEN_SECRETS", allow)]);
        assert_eq!(code, 0, "{stderr:?}");
    });
}

#[test]
fn limits_refuse_oversized_requests_and_admin_floods() {
    run(Duration::from_secs(120), |scope| {
        let cluster = Cluster::start(&scope, 0);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let channel = endpoint(&cluster.url(), &with_token(None)).expect("url").connect_lazy();
            // A spec of 5 MiB: refused at its length prefix.
            let spec = pb::JobSpec { name: "x".repeat(5 << 20), ..Default::default() };
            let e = TrainerServiceClient::new(channel.clone())
                .create_or_attach_job(pb::CreateOrAttachJobRequest { protocol_version: 1, spec: Some(spec) })
                .await
                .expect_err("too large");
            assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
            assert!(e.message().contains("over this server's limit of 4194304 bytes"), "{}", e.message());
            // The connection is still good for a normal call.
            AdminServiceClient::new(channel.clone()).list_workers(pb::ListWorkersRequest::default()).await.expect("list");
            // A job name of 100,000 characters (under the size limit):
            // refused by the spec's validation, naming the field.
            let spec = pb::JobSpec { name: "x".repeat(100_000), ..Default::default() };
            let request = pb::CreateOrAttachJobRequest { protocol_version: loader_proto::PROTOCOL_VERSION, spec: Some(spec) };
            let e = TrainerServiceClient::new(channel.clone())
                .create_or_attach_job(request)
                .await
                .expect_err("name too long");
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            assert!(
                e.message().contains("name: 100000 bytes is longer than the 255 a job name may have"),
                "{}",
                e.message()
            );

            // Admin calls past the budget (200 a second) are refused;
            // the trainer's calls are not counted against it.
            let mut admin = AdminServiceClient::new(channel.clone());
            let mut refused = 0;
            for _ in 0..600 {
                if let Err(e) = admin.list_workers(pb::ListWorkersRequest::default()).await {
                    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
                    assert!(e.message().contains("admin calls are limited to 200 a second"), "{}", e.message());
                    refused += 1;
                }
            }
            assert!(refused > 0, "600 admin calls in a burst: none refused");
            let mut trainer = TrainerServiceClient::new(channel);
            for _ in 0..50 {
                let r = trainer.routes(pb::RoutesRequest::default()).await;
                assert!(r.as_ref().is_err_and(|e| e.code() == Code::NotFound), "{r:?}");
            }
        });
    });
}

/// The coordinator's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Opens `n` connections to `url` at once, each making one call, and
/// closes them all; the coordinator's RSS at the peak.
fn churn(runtime: &tokio::runtime::Runtime, url: &str, security: &ClientSecurity, pid: u32, n: usize) -> u64 {
    let call = || {
        let target = endpoint(url, security).expect("url");
        async move {
            let deadline = tokio::time::Instant::now() + CALL;
            let channel = loader_process::grpc::channel::connect(&target, deadline).await.expect("connect");
            let r = TrainerServiceClient::new(channel.clone()).routes(pb::RoutesRequest::default()).await;
            assert!(r.as_ref().is_err_and(|e| e.code() == Code::NotFound), "{r:?}");
            channel
        }
    };
    let open: Vec<Channel> = runtime.block_on(futures::future::join_all((0..n).map(|_| call())));
    let peak = rss_kib(pid);
    drop(open);
    peak
}

/// The RSS once it is at most `limit` KiB, or after 10 s.
fn settled_rss(pid: u32, limit: u64) -> u64 {
    let closed = std::time::Instant::now();
    let mut now = rss_kib(pid);
    loader_e2e::wait_until("the coordinator's RSS to settle", Duration::from_secs(15), || {
        now = rss_kib(pid);
        now <= limit || closed.elapsed() > Duration::from_secs(10)
    });
    now
}

#[test]
fn connections_that_close_give_the_coordinator_its_memory_back() {
    // Issue 52: 2,000 connections opened at once, each making one call, and
    // closed. Plaintext: the coordinator comes back within 1.2x of its RSS
    // before them (without its periodic trim it stayed at 3.7x when this
    // ran beside the other tests of this file). TLS: a second 2,000 leave it about where the first did
    // (what each connection held is freed; glibc keeps a high-water mark of
    // about 5 MB from the first burst: docs/reliability.md).
    run(Duration::from_secs(180), |scope| {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let plain = Cluster::start(&scope, 0);
        let (pid, url, security) = (plain.server.pid(), plain.url(), with_token(None));
        churn(&runtime, &url, &security, pid, 1);
        std::thread::sleep(Duration::from_secs(1));
        let start = rss_kib(pid);
        let peak = churn(&runtime, &url, &security, pid, 2000);
        let after = settled_rss(pid, start * 6 / 5);
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
        let said = format!("plaintext: coordinator RSS {start} KiB before, {peak} KiB with 2,000 open, {after} KiB after ({fds} fds open)");
        eprintln!("{said}");
        assert!(peak > start * 3 / 2, "the connections took no memory: the test measured nothing; {said}");
        assert!(after <= start * 6 / 5, "not back within 1.2x; {said}");

        let dir = tempfile::tempdir().expect("tempdir");
        let ca = TestCa::new(dir.path(), "ca");
        let server = ca.leaf("server");
        let security =
            ClientSecurity { tls: Some(ClientTls { ca: ca.cert(), identity: None, open_secrets: OpenSecrets::Refuse }), token: None };
        let tls = Cluster::builder()
            .secured(true, security.clone())
            .env("LOADER_TLS_CERT", server.cert.display().to_string())
            .env("LOADER_TLS_KEY", server.key.display().to_string())
            .workers(0)
            .start(&scope);
        let (pid, url) = (tls.server.pid(), tls.url());
        churn(&runtime, &url, &security, pid, 1);
        std::thread::sleep(Duration::from_secs(1));
        let start = rss_kib(pid);
        churn(&runtime, &url, &security, pid, 2000);
        let first = settled_rss(pid, start * 6 / 5);
        churn(&runtime, &url, &security, pid, 2000);
        let second = settled_rss(pid, first);
        let said = format!("TLS: coordinator RSS {start} KiB before, {first} KiB after 2,000 connections, {second} KiB after 2,000 more");
        eprintln!("{said}");
        // Measured: +5% after the second 2,000, +2% more after four more
        // rounds: a high-water mark settling, not memory per connection.
        assert!(second <= first + first / 10, "the second 2,000 connections left more behind; {said}");
    });
}
