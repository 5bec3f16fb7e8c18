//! A trainer in the test process: the Rust SDK consuming a job on a thread
//! of its own, recording what arrived and when, and checks of what it saw.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use loader_client::{JobSpec, LoaderBuilder, Transport};
use loader_job::sampler::Plan;

/// One batch as the trainer received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// Sequence number.
    pub seq: u64,
    /// Dataset indices it holds.
    pub indices: Vec<u64>,
    /// Shared memory or gRPC.
    pub transport: Transport,
    /// When `next()` returned it.
    pub at: Instant,
}

/// A consuming trainer thread.
#[derive(Debug)]
pub struct Trainer {
    /// Batches yielded so far.
    progress: Arc<AtomicU64>,
    /// What the thread ended with: every batch, or the error that ended it.
    done: mpsc::Receiver<Result<Vec<Received>, String>>,
}

impl Trainer {
    /// Builds a loader for `job` from `builder` and consumes it to the end
    /// on a new thread.
    pub fn spawn(builder: LoaderBuilder, job: JobSpec) -> Trainer {
        Self::spawn_paced(builder, job, Duration::ZERO)
    }

    /// [`Trainer::spawn`], spending `step` on each batch after it arrives,
    /// as a training step would: the loader must keep up with that pace.
    pub fn spawn_paced(builder: LoaderBuilder, job: JobSpec, step: Duration) -> Trainer {
        let progress = Arc::new(AtomicU64::new(0));
        let (tx, done) = mpsc::channel();
        let counter = progress.clone();
        std::thread::Builder::new()
            .name("e2e-trainer".into())
            .spawn(move || {
                let result = (|| {
                    let loader = builder.job(job).build().map_err(|e| format!("build: {e}"))?;
                    let mut seen = Vec::new();
                    for batch in loader {
                        let batch = batch.map_err(|e| format!("after {} batches: {e}", seen.len()))?;
                        seen.push(Received {
                            seq: batch.seq(),
                            indices: batch.indices().to_vec(),
                            transport: batch.transport(),
                            at: Instant::now(),
                        });
                        counter.fetch_add(1, Ordering::Relaxed);
                        if !step.is_zero() {
                            std::thread::sleep(step);
                        }
                    }
                    Ok(seen)
                })();
                let _ = tx.send(result);
            })
            .expect("spawn trainer thread");
        Trainer { progress, done }
    }

    /// Batches yielded so far.
    pub fn yielded(&self) -> u64 {
        self.progress.load(Ordering::Relaxed)
    }

    /// Waits until at least `n` batches were yielded; panics after `limit`.
    pub fn wait_for(&self, n: u64, limit: Duration) {
        crate::wait::wait_for(&format!("the trainer yielding {n} batches"), limit, || {
            let yielded = self.yielded();
            if yielded >= n { Ok(()) } else { Err(format!("{yielded} yielded")) }
        });
    }

    /// Waits for the end of the job; panics after `limit` or when the
    /// loader ended with an error.
    pub fn join(self, limit: Duration) -> Vec<Received> {
        self.finish(limit).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Waits up to `limit` for the end of the job: every batch, or what went
    /// wrong (the loader's error, or no end in time; the thread is then
    /// left to end with the processes it talks to).
    pub fn finish(self, limit: Duration) -> Result<Vec<Received>, String> {
        match self.done.recv_timeout(limit) {
            Ok(Ok(seen)) => Ok(seen),
            Ok(Err(e)) => Err(format!("the trainer failed: {e}")),
            Err(_) => Err(format!("the trainer did not finish within {limit:?} ({} batches yielded)", self.yielded())),
        }
    }
}

/// Asserts that `seen` is exactly the sequence numbers `seqs` of `consumer`,
/// in order, each with the indices the plan gives it.
pub fn assert_exact(seen: &[(u64, Vec<u64>)], plan: &Plan, consumer: u32, seqs: std::ops::Range<u64>) {
    let got: Vec<u64> = seen.iter().map(|(s, _)| *s).collect();
    let want: Vec<u64> = seqs.collect();
    if got != want {
        let first = got.iter().zip(&want).position(|(g, w)| g != w).unwrap_or(got.len().min(want.len()));
        panic!(
            "sequence differs from {:?}..{:?} at position {first}: got {:?} (len {}), want {:?} (len {})",
            want.first(),
            want.last().map(|l| l + 1),
            &got[first.saturating_sub(2)..(first + 3).min(got.len())],
            got.len(),
            &want[first.saturating_sub(2)..(first + 3).min(want.len())],
            want.len()
        );
    }
    for (seq, indices) in seen {
        assert_eq!(indices, &plan.batch_indices(consumer, *seq), "indices of batch {seq}");
    }
}

/// [`assert_exact`] for what a [`Trainer`] received.
pub fn assert_received(seen: &[Received], plan: &Plan, consumer: u32, seqs: std::ops::Range<u64>) {
    let pairs: Vec<(u64, Vec<u64>)> = seen.iter().map(|r| (r.seq, r.indices.clone())).collect();
    assert_exact(&pairs, plan, consumer, seqs);
}
