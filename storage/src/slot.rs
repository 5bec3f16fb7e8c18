//! [`Slot`]: the answer to one request, filled by the storage runtime and
//! waited for by the workers' threads.
//!
//! A fetch is started once (a chunk of an object, a prefetched image) and
//! may be waited for by any number of readers, on any thread, async or
//! not: they block on a condition variable until the runtime fills the
//! slot, or until [`WAIT`] has passed (the store's own retries end well
//! before).

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::StorageError;
use crate::error::ErrorKind;

/// Longest a read waits for its request (the store's own retries end sooner).
const WAIT: Duration = Duration::from_secs(300);

/// One request's answer: not yet, or its result.
#[derive(Debug)]
pub(crate) struct Slot<T> {
    state: Mutex<Option<Result<T, StorageError>>>,
    ready: Condvar,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Self { state: Mutex::new(None), ready: Condvar::new() }
    }
}

impl<T: Clone> Slot<T> {
    fn state(&self) -> MutexGuard<'_, Option<Result<T, StorageError>>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Answers the request and wakes every reader waiting for it.
    pub(crate) fn fill(&self, result: Result<T, StorageError>) {
        *self.state() = Some(result);
        self.ready.notify_all();
    }

    /// Whether the answer is there.
    pub(crate) fn is_filled(&self) -> bool {
        self.state().is_some()
    }

    /// The answer, once there; `url` names the object if none comes.
    pub(crate) fn wait(&self, url: &str) -> Result<T, StorageError> {
        let guard = self.state();
        let (guard, _) = self.ready.wait_timeout_while(guard, WAIT, |s| s.is_none()).unwrap_or_else(|p| p.into_inner());
        match &*guard {
            Some(result) => result.clone(),
            None => Err(StorageError::new(url, ErrorKind::Unavailable, format!("no answer within {} s", WAIT.as_secs()))),
        }
    }
}
