//! KEDA's external scaler (`externalscaler.ExternalScaler`) on the
//! coordinator's port: KEDA's `external` trigger asks it how many workers
//! the worker Deployment should run, and HPA applies the answer.
//!
//! The metric is the number of workers the trainers' stall asks for, with a
//! target of 1 per replica, so HPA's `ceil(value / target)` is that number:
//! the current workers plus one while the stall since KEDA's last poll is
//! above `targetStall` (trigger metadata, default 5%), minus one while it is
//! under half of it and the workers are mostly idle (the same rule as the
//! coordinator's own autoscaler, `crate::autoscale`), else unchanged. KEDA's
//! polling interval and HPA's stabilization window are the cool-down.
//! `IsActive` is true while a trainer session is open (KEDA scales to its
//! minimum, possibly zero, otherwise).

use std::pin::Pin;
use std::sync::Mutex;

use futures::Stream;
use loader_proto::keda::{
    self, GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec, MetricValue,
    ScaledObjectRef, external_scaler_server::ExternalScaler,
};
use tonic::{Request, Response, Status};

use crate::autoscale::{IDLE_BUSY, Load, interval};
use crate::coordinator::Coordinator;
use crate::error::CoordinatorError;

/// The metric's name unless the trigger's `metricName` says otherwise.
pub(crate) const METRIC: &str = "loader_desired_workers";

/// The target stall unless the trigger's `targetStall` says otherwise.
const TARGET_STALL: f64 = 0.05;

#[derive(Debug)]
pub(crate) struct KedaScaler {
    coordinator: Coordinator,
    /// The counters at the previous `GetMetrics`.
    last: Mutex<Option<Load>>,
}

impl KedaScaler {
    pub(crate) fn new(coordinator: Coordinator) -> Self {
        Self { coordinator, last: Mutex::new(None) }
    }

    /// Workers the stall asks for now (see the module docs).
    fn desired(&self, target: f64) -> f64 {
        let workers = self.coordinator.list_workers().iter().filter(|w| !w.draining).count() as u32;
        let now = Load::read(&self.coordinator, workers);
        let previous = self
            .last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .replace(now.clone());
        let Some(i) = previous.as_ref().and_then(|p| interval(p, &now)) else {
            return f64::from(workers);
        };
        let desired = if i.stall > target {
            workers + 1
        } else if i.stall < target / 2.0 && now.busy < IDLE_BUSY {
            workers.saturating_sub(1)
        } else {
            workers
        };
        f64::from(desired)
    }
}

/// The trigger's `targetStall` (a share, `0.05`, or a percentage, `5%`).
fn target_stall(r: &ScaledObjectRef) -> Result<f64, CoordinatorError> {
    let Some(given) = r.scaler_metadata.get("targetStall") else {
        return Ok(TARGET_STALL);
    };
    let parsed = match given.trim().strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|v| v / 100.0),
        None => given.trim().parse::<f64>(),
    };
    match parsed {
        Ok(v) if v > 0.0 && v < 1.0 => Ok(v),
        _ => Err(CoordinatorError::BadScaling(format!(
            "KEDA trigger metadata targetStall {given:?}: give a share between 0 and 1 (0.05) or a percentage (5%)"
        ))),
    }
}

fn metric_name(r: &ScaledObjectRef) -> String {
    r.scaler_metadata.get("metricName").filter(|m| !m.is_empty()).cloned().unwrap_or_else(|| METRIC.to_owned())
}

#[tonic::async_trait]
impl ExternalScaler for KedaScaler {
    async fn is_active(&self, _request: Request<ScaledObjectRef>) -> Result<Response<IsActiveResponse>, Status> {
        let result = !self.coordinator.list_sessions().is_empty();
        Ok(Response::new(IsActiveResponse { result }))
    }

    type StreamIsActiveStream = Pin<Box<dyn Stream<Item = Result<IsActiveResponse, Status>> + Send>>;

    async fn stream_is_active(
        &self,
        _request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        Err(Status::unimplemented(
            "the coordinator is a pull scaler: use the KEDA trigger type `external`, not `external-push`",
        ))
    }

    async fn get_metric_spec(&self, request: Request<ScaledObjectRef>) -> Result<Response<GetMetricSpecResponse>, Status> {
        let r = request.into_inner();
        target_stall(&r)?;
        let spec = MetricSpec { metric_name: metric_name(&r), target_size: 1, target_size_float: 1.0 };
        Ok(Response::new(GetMetricSpecResponse { metric_specs: vec![spec] }))
    }

    async fn get_metrics(&self, request: Request<GetMetricsRequest>) -> Result<Response<GetMetricsResponse>, Status> {
        let r = request.into_inner();
        let object = r.scaled_object_ref.unwrap_or_default();
        let target = target_stall(&object)?;
        let desired = self.desired(target);
        let name = if r.metric_name.is_empty() { metric_name(&object) } else { r.metric_name };
        let value = MetricValue { metric_name: name, metric_value: desired as i64, metric_value_float: desired };
        Ok(Response::new(GetMetricsResponse { metric_values: vec![value] }))
    }
}

/// The service, ready to add to the coordinator's server.
pub(crate) fn server(coordinator: Coordinator) -> keda::external_scaler_server::ExternalScalerServer<KedaScaler> {
    keda::external_scaler_server::ExternalScalerServer::new(KedaScaler::new(coordinator))
}
