//! Keeps one `Fetch` stream open to every worker the coordinator lists for
//! this session: polls `Routes`, opens streams to new workers, drops streams
//! to workers that left, and re-opens a stream that ended while its worker is
//! still listed.
//!
//! A worker whose stream fails for want of a path (refused, reset, silent
//! past the channel's keepalive) is *unreachable* from here, though its
//! heartbeats may still reach the coordinator: the session's heartbeats list
//! it, so the coordinator moves this trainer's batches to other workers,
//! until a stream to it opens again.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt;
use loader_proto::pb::{Route, RoutesRequest};
use tokio::sync::Notify;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::batch::Expected;
use crate::connect;
use crate::error::LoaderError;
use crate::event::{Event, EventTx};
use crate::fetch::{self, FetchStream, StreamParams};
use crate::gap::Listed;
use crate::session::Session;

/// How often the routes are polled: new workers are picked up this fast.
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// The same worker's stream failure is logged as a warning at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The routes task's state.
#[derive(Debug)]
pub(crate) struct Routes {
    /// For the session id and the coordinator client.
    session: Arc<Session>,
    /// Identity checks for every stream.
    expected: Expected,
    /// Credits per new stream.
    prefetch: u32,
    /// Where streams deliver.
    events: EventTx,
    /// The consumer waits on a gap while holding batches: some worker may be
    /// out of credits with the missing batch still queued behind them.
    stalled: Arc<Notify>,
    /// Open streams by worker address.
    streams: HashMap<String, FetchStream>,
    /// When a stream failure was last logged as a warning, per worker.
    warned: HashMap<String, Instant>,
    /// The workers of the last successful poll, for the consumer.
    listed: Arc<Listed>,
    /// Worker ids by address, as of the last poll.
    ids: HashMap<String, u64>,
    /// Workers this trainer cannot reach, by address, with their ids.
    unreachable: HashMap<String, u64>,
}

impl Routes {
    /// The state for a fresh session.
    pub(crate) fn new(
        session: Arc<Session>,
        expected: Expected,
        prefetch: u32,
        events: EventTx,
        stalled: Arc<Notify>,
    ) -> Self {
        Self {
            session,
            expected,
            prefetch,
            events,
            stalled,
            streams: HashMap::new(),
            warned: HashMap::new(),
            listed: Arc::default(),
            ids: HashMap::new(),
            unreachable: HashMap::new(),
        }
    }

    /// The workers the coordinator lists, as of the last poll.
    pub(crate) fn listed(&self) -> Arc<Listed> {
        Arc::clone(&self.listed)
    }

    /// Polls until `stop` or until the job fails. Streams stop with it.
    pub(crate) async fn run(mut self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let stalled = self.stalled.clone();
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {
                    if !self.poll(&stop).await {
                        return;
                    }
                }
                () = stalled.notified() => self.unstick(),
            }
        }
    }

    /// One poll; false when the job failed and polling should stop.
    async fn poll(&mut self, stop: &CancellationToken) -> bool {
        let (session_id, session_key) = self.session.credentials();
        let mut client = self.session.client();
        let reply = connect::attempt(
            self.session.address(),
            "Routes",
            client.routes(RoutesRequest { session_id, session_key: session_key.to_string() }),
        )
        .await;
        match reply {
            Ok(r) => {
                if !r.job_error.is_empty() {
                    let _ = self
                        .events
                        .send(Event::Fatal(LoaderError::JobFailed(r.job_error)));
                    return false;
                }
                self.listed
                    .replace(r.routes.iter().map(|r| r.address.clone()));
                self.reconcile(&r.routes, session_id, &session_key, stop);
            }
            Err(e) if e.code() == Some(tonic::Code::NotFound) => {
                // The coordinator restarted (or the lease expired): the
                // heartbeat task reopens the session; streams follow the new
                // id on the next successful poll.
                tracing::debug!(error = %e, "routes: session unknown; asking for a reopen");
                self.session.request_reopen();
            }
            Err(e) => {
                // The heartbeat task reports fatal errors and warns about
                // outages; here a failed poll only delays new streams.
                tracing::debug!(error = %e, "routes poll failed");
            }
        }
        true
    }

    fn reconcile(&mut self, routes: &[Route], session_id: u64, session_key: &Arc<str>, stop: &CancellationToken) {
        self.ids = routes.iter().map(|r| (r.address.clone(), r.worker_id)).collect();
        let warned = &mut self.warned;
        let (ids, unreachable) = (&self.ids, &mut self.unreachable);
        self.streams.retain(|address, stream| {
            let listed = routes.iter().any(|r| &r.address == address);
            if stream.opened.load(Ordering::Relaxed)
                && let Some(worker_id) = unreachable.remove(address)
            {
                tracing::info!(%address, worker_id, "this trainer reaches the worker again");
            }
            if stream.task.is_finished() {
                match (&mut stream.task).now_or_never() {
                    Some(Ok(Err(e))) if no_path(&e) && ids.contains_key(address) => {
                        let worker_id = ids[address];
                        if unreachable.insert(address.clone(), worker_id).is_none() {
                            tracing::warn!(
                                %address,
                                worker_id,
                                error = %e,
                                "cannot reach the worker; the coordinator moves this trainer's batches to other workers while it stays unreachable"
                            );
                        } else {
                            tracing::debug!(%address, error = %e, "worker still unreachable");
                        }
                    }
                    Some(Ok(Err(e))) => {
                        let now = Instant::now();
                        let quiet = warned.get(address).is_some_and(|t| now.duration_since(*t) < WARN_EVERY);
                        if quiet {
                            tracing::debug!(%address, error = %e, "fetch stream failed");
                        } else {
                            warned.insert(address.clone(), now);
                            tracing::warn!(%address, error = %e, "fetch stream failed; reopening while the worker is listed");
                        }
                    }
                    Some(Err(join)) => tracing::warn!(%address, error = %join, "fetch task ended abnormally"),
                    Some(Ok(Ok(()))) | None => {}
                }
                return false;
            }
            // Dropping a stream stops its task.
            listed && stream.session_id == session_id
        });
        self.unreachable.retain(|address, _| self.ids.contains_key(address));
        let mut cut: Vec<u64> = self.unreachable.values().copied().collect();
        cut.sort_unstable();
        self.session.progress().set_unreachable(cut);
        for route in routes {
            if !self.streams.contains_key(&route.address) {
                let params = StreamParams {
                    expected: self.expected,
                    session_id,
                    session_key: Arc::clone(session_key),
                    prefetch: self.prefetch,
                };
                let stream = fetch::spawn(
                    route.address.clone(),
                    params,
                    self.events.clone(),
                    stop.child_token(),
                );
                tracing::debug!(address = %route.address, worker_id = route.worker_id, "opening fetch stream");
                self.streams.insert(route.address.clone(), stream);
            }
        }
    }

    /// Grants one extra credit to every stream whose worker holds none. Only
    /// needed when a re-produced batch sits behind later batches of the same
    /// worker that already fill the consumer's window. Capped at `prefetch`
    /// extra credits per stream, so a stream's window at most doubles.
    fn unstick(&mut self) {
        for (address, stream) in &mut self.streams {
            if stream.credits.held() == 0 && stream.extra_credits < self.prefetch {
                tracing::debug!(%address, "consumer stuck on a gap; granting an extra credit");
                stream.extra_credits += 1;
                stream.credits.grant(1);
            }
        }
    }
}

/// True when a stream failed for want of a path to its worker (nothing
/// answered, the connection was refused or reset, or it went silent past
/// the channel's keepalive), not because the worker refused the call.
fn no_path(e: &LoaderError) -> bool {
    matches!(e.code(), Some(Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Cancelled))
}
