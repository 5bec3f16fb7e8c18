//! One `BatchService.Fetch` stream to one worker: opens it with the session's
//! identity and the first credits, validates every frame, and forwards the
//! batches to the consumer with a credit to give back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use loader_proto::batch::TableCache;
use loader_process::grpc::streaming;
use loader_proto::pb::{BatchFrame, FetchRequest};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::batch::{Batch, Expected};
use crate::connect;
use loader_process::security::Role;
use crate::error::LoaderError;
use crate::event::{Credit, CreditLine, Event, EventTx};

/// `BatchService.Fetch`, as tonic's generated client names it.
const FETCH: &str = "/loader.v1.BatchService/Fetch";

/// A running stream, owned by the routes task.
#[derive(Debug)]
pub(crate) struct FetchStream {
    /// The session it was opened for; a reopened session needs new streams.
    pub(crate) session_id: u64,
    /// To grant extra credits when the consumer is stuck on a gap.
    pub(crate) credits: CreditLine,
    /// Credits granted beyond `prefetch` to get past a stall; capped.
    pub(crate) extra_credits: u32,
    /// Ends with `Ok` when the worker closes the stream, `Err` when it fails.
    pub(crate) task: JoinHandle<Result<(), LoaderError>>,
    /// Set once the worker answered the call: the path to it works.
    pub(crate) opened: Arc<AtomicBool>,
    /// Stops the task when the stream is dropped.
    _stop: DropGuard,
}

/// What a stream needs to know about its session.
#[derive(Debug, Clone)]
pub(crate) struct StreamParams {
    /// Identity checks for every frame.
    pub(crate) expected: Expected,
    /// The session the worker should deliver for.
    pub(crate) session_id: u64,
    /// Its key, which the worker checks when tokens are on.
    pub(crate) session_key: std::sync::Arc<str>,
    /// Credits granted when the stream opens.
    pub(crate) prefetch: u32,
}

/// Opens a stream to the worker at `address` on the current runtime.
pub(crate) fn spawn(
    address: String,
    params: StreamParams,
    events: EventTx,
    stop: CancellationToken,
) -> FetchStream {
    let (tx, rx) = mpsc::unbounded_channel();
    let credits = CreditLine::new(tx);
    credits.open(FetchRequest {
        job_id: params.expected.job_id,
        consumer: params.expected.stream,
        session_id: params.session_id,
        credits: params.prefetch,
        session_key: params.session_key.to_string(),
    });
    let line = credits.clone();
    let task_stop = stop.clone();
    let expected = params.expected;
    let opened = Arc::new(AtomicBool::new(false));
    let answered = Arc::clone(&opened);
    let task = tokio::spawn(async move {
        let result = tokio::select! {
            r = run(&address, expected, rx, &line, &events, &answered) => r,
            () = task_stop.cancelled() => Ok(()),
        };
        if let Err(e @ LoaderError::BadBatch { .. }) = result {
            // A worker that lies about batches is a bug, not a hiccup.
            let _ = events.send(Event::Fatal(e));
            return Ok(());
        }
        result
    });
    FetchStream {
        session_id: params.session_id,
        credits,
        extra_credits: 0,
        task,
        opened,
        _stop: stop.drop_guard(),
    }
}

async fn run(
    address: &str,
    expected: Expected,
    requests: mpsc::UnboundedReceiver<FetchRequest>,
    line: &CreditLine,
    events: &EventTx,
    opened: &AtomicBool,
) -> Result<(), LoaderError> {
    // Pinged while the stream is open: a silent path to the worker fails
    // the stream in seconds, and the routes task reports the worker.
    let channel = connect::endpoint(address, Role::Trainer)?.keepalive().connect_lazy();
    // Read without tonic's codec: a batch within one HTTP/2 frame stays
    // where the socket read put it (see `loader_process::grpc::streaming`).
    let mut frames = streaming::call(&channel, FETCH, UnboundedReceiverStream::new(requests))
        .await
        .map_err(|s| LoaderError::rpc(address, "Fetch", s))?;
    opened.store(true, Ordering::Relaxed);
    tracing::debug!(%address, "fetch stream open");
    let mut tables = TableCache::default();
    while let Some(frame) = frames
        .message::<BatchFrame>()
        .await
        .map_err(|s| LoaderError::rpc(address, "Fetch", s))?
    {
        let credit = Credit::for_frame(line);
        let batch = Batch::from_frame(frame.data, &expected, address, &mut tables)?.traced(&frame.traceparent);
        if events.send(Event::Batch(batch, credit)).is_err() {
            // The consumer is gone; nothing left to do.
            return Ok(());
        }
    }
    tracing::debug!(%address, "worker closed the fetch stream");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fetch_path_is_the_generated_services() {
        let service = loader_proto::pb::batch_service_server::SERVICE_NAME;
        assert_eq!(FETCH, format!("/{service}/Fetch"));
    }
}
