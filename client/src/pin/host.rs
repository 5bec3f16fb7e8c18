//! The host backend: "device" memory is host memory, and each copy runs on
//! a small thread pool after a short pseudo-random delay, so copies
//! complete asynchronously and out of order, as a GPU's may relative to
//! the trainer. Every rule of the stage (slot returned after the event,
//! device pool, in-order delivery) is exercised by it on machines with no
//! GPU; `device="host"` selects it.

use std::cell::UnsafeCell;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;

use crate::error::LoaderError;

/// Threads that run copies: more than one, so copies overtake each other.
const COPY_THREADS: usize = 3;

/// Longest delay before a copy starts, so completion order is shuffled.
const MAX_JITTER: Duration = Duration::from_micros(500);

/// A host buffer standing in for device memory.
pub(crate) struct HostMemory {
    /// Written by one copy at a time (the stage lends a buffer to one copy
    /// and reads it only after that copy's event), read after the event.
    bytes: Box<[UnsafeCell<u8>]>,
}

// SAFETY: the cells are written only by the copy the stage queued into
// this buffer, and read (`read`) only after that copy's event completed,
// which orders the write before the read (the event's mutex); the stage
// never queues two copies into one buffer at once.
unsafe impl Sync for HostMemory {}

impl std::fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMemory")
            .field("len", &self.bytes.len())
            .finish()
    }
}

impl HostMemory {
    /// `len` zeroed bytes.
    fn new(len: usize) -> Self {
        Self {
            bytes: (0..len).map(|_| UnsafeCell::new(0)).collect(),
        }
    }

    /// Capacity in bytes.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Address of the first byte, as a device pointer would be given.
    pub(crate) fn ptr(&self) -> u64 {
        self.bytes.as_ptr() as u64
    }

    /// The first `len` bytes. Call only after the event of the last copy
    /// into this buffer completed.
    pub(crate) fn read(&self, len: usize) -> Vec<u8> {
        let len = len.min(self.bytes.len());
        // SAFETY: `len` is within the buffer; `UnsafeCell<u8>` has the
        // layout of `u8`; the caller waited for the copy's event, so no
        // write to these cells runs concurrently (see the `Sync` impl).
        unsafe { std::slice::from_raw_parts(self.bytes.as_ptr().cast::<u8>(), len) }.to_vec()
    }
}

/// The completion of one copy: set by the thread that ran it.
#[derive(Debug, Default)]
pub(crate) struct HostEvent {
    /// Whether the copy is done.
    done: Mutex<bool>,
    /// Wakes `wait`.
    cond: Condvar,
}

impl HostEvent {
    /// True once the copy ran.
    pub(crate) fn is_done(&self) -> bool {
        self.done.lock().map(|d| *d).unwrap_or(true)
    }

    /// Blocks until the copy ran. Bounded: the pool runs every queued job
    /// (a pool that lost its threads completes them as dropped, below).
    pub(crate) fn wait(&self) {
        let Ok(mut done) = self.done.lock() else {
            return;
        };
        while !*done {
            match self.cond.wait(done) {
                Ok(d) => done = d,
                Err(_) => return,
            }
        }
    }

    fn set(&self) {
        if let Ok(mut done) = self.done.lock() {
            *done = true;
        }
        self.cond.notify_all();
    }
}

/// One queued copy: what it reads, where it writes, what it signals.
struct Job {
    /// The batch's bytes, kept alive by the job as well as by the stage.
    src: Bytes,
    /// The destination.
    dst: Arc<HostMemory>,
    /// Signalled when the bytes are in `dst`.
    event: Arc<HostEvent>,
    /// How long to wait before copying.
    delay: Duration,
}

impl Job {
    fn run(self) {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let len = self.src.len().min(self.dst.len());
        // SAFETY: the stage lends `dst` to this copy alone until the event
        // is set (see `HostMemory`'s `Sync` impl); `len` fits both buffers;
        // the source is shared memory no one writes while the batch is held.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.src.as_ptr(),
                self.dst.bytes.as_ptr().cast::<u8>().cast_mut(),
                len,
            );
        }
        self.event.set();
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // A job dropped unrun (the pool is gone) must not leave a waiter
        // blocked forever; after `run` this is a no-op.
        self.event.set();
    }
}

/// How jobs run.
enum Mode {
    /// On the thread pool, after a delay.
    Threads(Mutex<Sender<Job>>),
    /// Held until a test runs them, in the order it picks.
    #[cfg(test)]
    Manual(Mutex<Vec<Option<Job>>>),
}

/// The host backend; see the module doc.
pub(crate) struct HostBackend {
    /// Where queued copies go.
    mode: Mode,
    /// State of the delay generator (xorshift).
    jitter: Mutex<u64>,
}

impl std::fmt::Debug for HostBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBackend").finish_non_exhaustive()
    }
}

impl HostBackend {
    /// Starts the copy threads; they end when the backend is dropped.
    pub(crate) fn start() -> Result<Self, LoaderError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..COPY_THREADS {
            let rx = Arc::clone(&rx);
            std::thread::Builder::new()
                .name(format!("loader-hostcopy-{i}"))
                .spawn(move || copy_thread(&rx))
                .map_err(|e| LoaderError::Runtime(format!("cannot start a copy thread: {e}")))?;
        }
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9e37_79b9, |d| d.as_nanos() as u64)
            | 1;
        Ok(Self {
            mode: Mode::Threads(Mutex::new(tx)),
            jitter: Mutex::new(seed),
        })
    }

    /// A backend whose copies run only when the test says (`run_job`).
    #[cfg(test)]
    pub(crate) fn manual() -> Self {
        Self {
            mode: Mode::Manual(Mutex::new(Vec::new())),
            jitter: Mutex::new(1),
        }
    }

    /// Runs the `index`-th queued copy (in queueing order); false when
    /// there is no such copy or it ran already.
    #[cfg(test)]
    pub(crate) fn run_job(&self, index: usize) -> bool {
        let Mode::Manual(jobs) = &self.mode else {
            return false;
        };
        let job = jobs
            .lock()
            .ok()
            .and_then(|mut j| j.get_mut(index).and_then(Option::take));
        job.map(Job::run).is_some()
    }

    /// Runs every queued copy not run yet, the latest first.
    #[cfg(test)]
    pub(crate) fn run_pending_reversed(&self) {
        let Mode::Manual(jobs) = &self.mode else {
            return;
        };
        let pending: Vec<Job> = jobs
            .lock()
            .map(|mut j| j.iter_mut().rev().filter_map(Option::take).collect())
            .unwrap_or_default();
        pending.into_iter().for_each(Job::run);
    }

    /// Host memory of `len` bytes.
    pub(crate) fn alloc(&self, len: usize) -> Arc<HostMemory> {
        Arc::new(HostMemory::new(len))
    }

    /// Queues a copy of `src` into `dst`; the event completes when it ran.
    pub(crate) fn copy(
        &self,
        src: &Bytes,
        dst: &Arc<HostMemory>,
    ) -> Result<Arc<HostEvent>, LoaderError> {
        let event = Arc::new(HostEvent::default());
        let job = Job {
            src: src.clone(),
            dst: Arc::clone(dst),
            event: Arc::clone(&event),
            delay: self.next_delay(),
        };
        match &self.mode {
            Mode::Threads(tx) => {
                let sent = tx.lock().map(|tx| tx.send(job).is_ok()).unwrap_or(false);
                if !sent {
                    return Err(LoaderError::Runtime(
                        "the host copy threads are gone".into(),
                    ));
                }
            }
            #[cfg(test)]
            Mode::Manual(jobs) => {
                if let Ok(mut jobs) = jobs.lock() {
                    jobs.push(Some(job));
                }
            }
        }
        Ok(event)
    }

    fn next_delay(&self) -> Duration {
        let Ok(mut x) = self.jitter.lock() else {
            return Duration::ZERO;
        };
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        Duration::from_nanos(*x % MAX_JITTER.as_nanos() as u64)
    }
}

/// One copy thread: runs jobs until the backend (the sender) is dropped.
fn copy_thread(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        match job {
            Ok(job) => job.run(),
            Err(_) => return,
        }
    }
}
