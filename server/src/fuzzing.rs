//! Entry points for the fuzz targets (`fuzz/`), not an API: the
//! coordinator's real gRPC services over an in-memory coordinator (no
//! journal, no worker pool, no reaper task), so a target can hand them any
//! request without a socket.

use loader_proto::keda::external_scaler_server::ExternalScaler;
use loader_proto::pb::{
    self, admin_service_server::AdminService, trainer_service_server::TrainerService,
    worker_service_server::WorkerService,
};

use crate::config::ServerConfig;
use crate::coordinator::Coordinator;
use crate::service::{admin::AdminApi, trainer::TrainerApi, worker::WorkerApi};

/// The four services `serve` mounts, over one fresh coordinator that keeps
/// everything in memory (`config.state_dir` must be None; a pool is ignored).
pub fn services(
    mut config: ServerConfig,
) -> (impl WorkerService, impl TrainerService, impl AdminService, impl ExternalScaler) {
    config.state_dir = None;
    config.worker_pool = None;
    // Without a journal `open` touches no file and cannot fail.
    let coordinator = Coordinator::open(config).expect("an in-memory coordinator opens");
    (
        WorkerApi(coordinator.clone()),
        TrainerApi(coordinator.clone()),
        AdminApi { coordinator: coordinator.clone(), pool: None },
        crate::service::keda::KedaScaler::new(coordinator),
    )
}

/// The check `AutoscaleRequest` gets before it reaches a pool (the services
/// above have none, so `Autoscale` stops at "no worker pool" there).
pub fn check_autoscale(r: &pb::AutoscaleRequest) -> Result<(), String> {
    if r.off {
        return Ok(());
    }
    let cooldown = std::time::Duration::from_millis(r.cooldown_ms);
    crate::autoscale::Policy::new(r.min, r.max, r.target_stall, cooldown).map(|_| ())
}
