//! The worker pool: workers the coordinator sizes itself, as `loaderctl
//! scale` asks or, with autoscaling on (`loaderctl autoscale`), as
//! `crate::autoscale`'s policy decides from the trainers' stall once a
//! second.
//!
//! # Layout
//! - `local`: `loader-worker` processes on the coordinator's host, drained
//!   (least outstanding work first) when the pool shrinks.
//! - `kubernetes` (feature `kubernetes`): the replicas of the worker
//!   Deployment, through its scale subresource; Kubernetes picks the pods
//!   to remove and each drains on its SIGTERM.

mod local;
#[cfg(feature = "kubernetes")]
mod kubernetes;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use loader_proto::pb;

use crate::autoscale::{Autoscaler, Load, MAX_WORKERS, Policy};
use crate::config::WorkerPoolConfig;
use crate::coordinator::Coordinator;
use crate::error::CoordinatorError;

/// How often the autoscaler looks at the load: a few heartbeats' worth of
/// stall reports between two looks, and a cooldown (seconds) that is a
/// whole number of looks.
const AUTOSCALE_EVERY: Duration = Duration::from_secs(1);

/// Where the pool's workers run.
#[derive(Debug)]
enum Backend {
    Local(local::Processes),
    #[cfg(feature = "kubernetes")]
    Kubernetes(kubernetes::Deployment),
}

/// The coordinator's worker pool.
#[derive(Debug)]
pub(crate) struct WorkerPool {
    backend: Backend,
    /// The autoscaling policy and its memory, while autoscaling is on.
    autoscaler: Mutex<Option<Autoscaler>>,
}

impl WorkerPool {
    /// The pool `config` describes; local workers will register at `url`.
    pub(crate) async fn open(config: &WorkerPoolConfig, url: String) -> Result<Self, CoordinatorError> {
        let backend = match config {
            WorkerPoolConfig::Local(local) => Backend::Local(local::Processes::new(local.clone(), url)),
            #[cfg(feature = "kubernetes")]
            WorkerPoolConfig::Kubernetes(k) => Backend::Kubernetes(kubernetes::Deployment::connect(k).await?),
        };
        Ok(Self { backend, autoscaler: Mutex::new(None) })
    }

    /// Starts what the pool starts with (local workers), and its
    /// background tasks, which end with `stop`.
    pub(crate) fn start(
        self: &Arc<Self>,
        coordinator: &Coordinator,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Result<(), CoordinatorError> {
        if let Some(p) = self.local() {
            p.scale(coordinator, p.initial())?;
            let pool = Arc::clone(self);
            let until = stop.clone();
            tokio::spawn(async move {
                if let Some(p) = pool.local() {
                    p.reap(until).await;
                }
            });
        }
        tokio::spawn(Arc::clone(self).run_autoscaler(coordinator.clone(), stop.clone()));
        Ok(())
    }

    /// Runs `workers` workers.
    pub(crate) async fn scale(&self, coordinator: &Coordinator, workers: u32) -> Result<pb::ScaleWorkersResponse, CoordinatorError> {
        if workers > MAX_WORKERS {
            return Err(CoordinatorError::BadScaling(format!(
                "{workers} workers: a pool runs at most {MAX_WORKERS}"
            )));
        }
        match &self.backend {
            Backend::Local(p) => p.scale(coordinator, workers),
            #[cfg(feature = "kubernetes")]
            Backend::Kubernetes(d) => d.scale(workers).await,
        }
    }

    /// Workers the pool runs now.
    async fn running(&self) -> Result<u32, CoordinatorError> {
        match &self.backend {
            Backend::Local(p) => Ok(p.running()),
            #[cfg(feature = "kubernetes")]
            Backend::Kubernetes(d) => d.replicas().await,
        }
    }

    /// Turns autoscaling on with `policy`, or off.
    pub(crate) fn autoscale(&self, policy: Option<Policy>) {
        let mut slot = self.autoscaler.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match policy {
            Some(p) => {
                tracing::info!(min = p.min, max = p.max, target_stall = p.target_stall, cooldown = ?p.cooldown, "autoscaling on");
                *slot = Some(Autoscaler::new(p));
            }
            None => {
                if slot.take().is_some() {
                    tracing::info!("autoscaling off");
                }
            }
        }
    }

    /// Applies the autoscaling policy every [`AUTOSCALE_EVERY`] until `stop`.
    async fn run_autoscaler(self: Arc<Self>, coordinator: Coordinator, stop: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(AUTOSCALE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            if self.autoscaler.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).is_none() {
                continue;
            }
            let workers = match self.running().await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!("autoscale: {e}");
                    continue;
                }
            };
            let load = Load::read(&coordinator, workers);
            let decision = match self.autoscaler.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).as_mut() {
                Some(a) => a.decide(load),
                None => None,
            };
            if let Some(d) = decision {
                tracing::info!(workers = d.workers, "autoscale: {}", d.reason);
                if let Err(e) = self.scale(&coordinator, d.workers).await {
                    tracing::warn!("autoscale: {e}");
                }
            }
        }
    }

    /// The local processes, when the pool runs workers itself (a build
    /// without the `kubernetes` feature has no other backend).
    fn local(&self) -> Option<&local::Processes> {
        match &self.backend {
            Backend::Local(p) => Some(p),
            #[cfg(feature = "kubernetes")]
            Backend::Kubernetes(_) => None,
        }
    }

    /// Stops what the pool started (local workers); a Deployment keeps
    /// its replicas.
    pub(crate) async fn stop(&self) {
        if let Some(p) = self.local() {
            p.stop().await;
        }
    }
}
