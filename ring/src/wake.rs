//! How a consumer thread blocked in `next()` sleeps: in one `epoll_wait`
//! over a doorbell (an eventfd) and the sockets of the ring's workers,
//! watched for hang-ups only.
//!
//! Why not simply block on the event channel: a batch from the ring would
//! then cost three cross-thread wake-ups (epoll wakes a runtime thread for
//! the worker's report, that thread wakes the consumer through the channel,
//! and the dropped batch wakes a runtime thread again to write the grant).
//! On a virtual machine each wake-up of a sleeping thread costs both sides
//! several microseconds of scheduler work and VM exits, which made up most
//! of the client's CPU per batch. Here the consumer thread itself reads and
//! checks the workers' reports; the grant is written by the thread that
//! frees the slot (see `trainer::grant`).
//!
//! The eventfd is rung by the background tasks after they send the consumer
//! an event, only while the consumer is parked (a task that sends while the
//! consumer is busy pays no system call), and by the ring's workers when the
//! count of reports the consumer asked for is reached (see
//! [`crate::doorbell`]): the consumer sleeps through several reports
//! instead of waking for each, which is why the sockets' data does not wake
//! it.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// The epoll token of the doorbell; ring connections use their `ConnId`,
/// which starts at 1 and never reaches it.
const BELL: u64 = u64::MAX;

/// What one wait saw.
#[derive(Debug, Default)]
pub struct Ready {
    /// Ring connections whose socket hung up (or failed).
    pub hung_up: Vec<u64>,
    /// Ring connections whose socket can take grants that did not fit
    /// before (see `Book::flush`).
    pub writable: Vec<u64>,
    /// Nothing at all happened before the timeout.
    pub timed_out: bool,
}

impl Ready {
    fn clear(&mut self) {
        self.hung_up.clear();
        self.writable.clear();
        self.timed_out = false;
    }
}

/// The consumer's epoll set: the doorbell and the ring's worker sockets.
/// Every wake-up reads the ring's sockets (see `Inbox::read_all`).
#[derive(Debug)]
pub struct WaitSet {
    /// Level-triggered, so a socket left with unread bytes is reported again.
    epoll: Epoll,
    /// Rung by background tasks after they send the consumer an event, and
    /// by ring workers (who hold a copy) when the reports asked for are in.
    bell: EventFd,
    /// The consumer is (about to be) asleep in `wait`: senders must ring.
    parked: AtomicBool,
}

impl WaitSet {
    /// An epoll set holding only the doorbell.
    pub fn new() -> io::Result<Self> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        let bell = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
        epoll.add(&bell, EpollEvent::new(EpollFlags::EPOLLIN, BELL))?;
        Ok(Self {
            epoll,
            bell,
            parked: AtomicBool::new(false),
        })
    }

    /// Called by a background task after it sent the consumer an event:
    /// wakes the consumer if it sleeps in [`WaitSet::wait`].
    #[inline]
    pub fn ring(&self) {
        // Pairs with the fence in `wait`: either the consumer sees the event
        // in the channel after parking, or this sees it parked.
        fence(Ordering::SeqCst);
        if self.parked.load(Ordering::Relaxed) {
            // A full counter (never: it is drained on every wake) would only
            // mean the consumer is already woken.
            let _ = self.bell.write(1);
        }
    }

    /// The doorbell's descriptor, lent to ring workers over SCM_RIGHTS.
    pub fn bell_fd(&self) -> BorrowedFd<'_> {
        self.bell.as_fd()
    }

    /// Reports `socket` under `token` from now on: when it hangs up, and
    /// when writable too with `writable`. Data arriving does not wake the
    /// set: the ring's doorbell does.
    pub fn watch(
        &self,
        socket: BorrowedFd<'_>,
        token: u64,
        writable: bool,
    ) -> io::Result<()> {
        self.epoll
            .add(socket, EpollEvent::new(interest(writable), token))?;
        Ok(())
    }

    /// Changes whether `socket` is also reported when writable.
    pub fn rewatch(
        &self,
        socket: BorrowedFd<'_>,
        token: u64,
        writable: bool,
    ) -> io::Result<()> {
        let mut event = EpollEvent::new(interest(writable), token);
        self.epoll.modify(socket, &mut event)?;
        Ok(())
    }

    /// Stops reporting `socket` (closing it would too; this is explicit).
    pub fn forget(&self, socket: BorrowedFd<'_>) {
        let _ = self.epoll.delete(socket);
    }

    /// Blocks until a watched socket is ready, the doorbell rings, or
    /// `timeout` passes; `Duration::ZERO` only looks. With `park`, senders
    /// ring the doorbell meanwhile; `pending` is asked after parking whether
    /// an event already waits, so none can be missed.
    pub fn wait(
        &self,
        timeout: Duration,
        park: bool,
        pending: impl FnOnce() -> bool,
        ready: &mut Ready,
    ) -> io::Result<()> {
        ready.clear();
        if park {
            self.parked.store(true, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            if pending() {
                self.parked.store(false, Ordering::Relaxed);
                return Ok(());
            }
        }
        let mut events = [EpollEvent::empty(); 8];
        // Rounded up: a sub-millisecond rest must not become a busy loop.
        let millis = timeout.as_micros().div_ceil(1000);
        let timeout = EpollTimeout::try_from(millis).unwrap_or(EpollTimeout::MAX);
        let n = loop {
            match self.epoll.wait(&mut events, timeout) {
                Err(Errno::EINTR) => continue,
                other => break other,
            }
        };
        self.parked.store(false, Ordering::Relaxed);
        let n = n?;
        ready.timed_out = n == 0;
        for e in &events[..n] {
            let flags = e.events();
            match e.data() {
                BELL => {
                    // Non-blocking: an already drained counter is no error.
                    let _ = self.bell.read();
                }
                token => {
                    if flags.intersects(
                        EpollFlags::EPOLLIN
                            | EpollFlags::EPOLLRDHUP
                            | EpollFlags::EPOLLHUP
                            | EpollFlags::EPOLLERR,
                    ) {
                        ready.hung_up.push(token);
                    }
                    if flags.contains(EpollFlags::EPOLLOUT) {
                        ready.writable.push(token);
                    }
                }
            }
        }
        Ok(())
    }
}

fn interest(writable: bool) -> EpollFlags {
    // Hang-ups only (EPOLLHUP and EPOLLERR are always reported): a report's
    // bytes wake no one; the worker rings the doorbell when it is time.
    let mut flags = EpollFlags::EPOLLRDHUP;
    if writable {
        flags |= EpollFlags::EPOLLOUT;
    }
    flags
}

/// A shared wait set as a descriptor an async runtime can watch.
#[derive(Debug)]
pub struct WaitFd(Arc<WaitSet>);

impl WaitFd {
    /// Registers `wait` with the current tokio runtime: readable while
    /// something in the set is ready. Call on a runtime.
    pub fn register(wait: Arc<WaitSet>) -> io::Result<AsyncFd<Self>> {
        // SAFETY: the descriptor is the epoll fd that `WaitSet` owns and
        // never replaces; the `Arc` inside the `AsyncFd` keeps that `WaitSet`
        // (and so the descriptor) open for the whole life of the `AsyncFd`,
        // and `as_raw_fd` always returns that same descriptor.
        let fd = unsafe { AsyncFd::register_with_interest(Self(wait), Interest::READABLE) }?;
        Ok(fd)
    }
}

impl AsRawFd for WaitFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl AsRawFd for WaitSet {
    /// The epoll descriptor, readable while something in the set is ready:
    /// what an async consumer registers with its runtime.
    fn as_raw_fd(&self) -> RawFd {
        self.epoll.0.as_raw_fd()
    }
}

impl AsFd for WaitSet {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.epoll.0.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::time::Instant;

    use super::*;

    #[tokio::test]
    async fn a_registered_wait_set_is_readable_once_a_socket_hangs_up() {
        let set = Arc::new(WaitSet::new().expect("wait set"));
        let fd = WaitFd::register(Arc::clone(&set)).expect("register");
        let (a, mut b) = UnixStream::pair().expect("pair");
        set.watch(a.as_fd(), 3, false).expect("watch");
        b.write_all(b"x").expect("write");
        let mut ready = Ready::default();
        set.wait(Duration::ZERO, false, || false, &mut ready)
            .expect("wait");
        assert!(ready.timed_out, "data alone wakes no one");
        drop(b);
        let guard = tokio::time::timeout(Duration::from_secs(20), fd.readable())
            .await
            .expect("readable in time")
            .expect("readable");
        let mut ready = Ready::default();
        set.wait(Duration::ZERO, false, || false, &mut ready)
            .expect("wait");
        assert_eq!(ready.hung_up, vec![3]);
        drop(guard);
    }

    #[test]
    fn a_ring_wakes_only_a_parked_waiter_and_sockets_report_their_token() {
        let set = Arc::new(WaitSet::new().expect("wait set"));
        let mut ready = Ready::default();
        // Not parked: a ring is free and leaves nothing behind.
        set.ring();
        set.wait(Duration::ZERO, false, || false, &mut ready)
            .expect("wait");
        assert!(ready.timed_out);

        let ringer = {
            let set = Arc::clone(&set);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                set.ring();
            })
        };
        let started = Instant::now();
        set.wait(Duration::from_secs(20), true, || false, &mut ready)
            .expect("wait");
        assert!(!ready.timed_out && ready.hung_up.is_empty());
        assert!(started.elapsed() < Duration::from_secs(10));
        ringer.join().expect("ringer");
        // Drained: the next look sees nothing.
        set.wait(Duration::ZERO, false, || false, &mut ready)
            .expect("wait");
        assert!(ready.timed_out);

        // An event that arrived before parking is noticed without sleeping.
        set.wait(Duration::from_secs(20), true, || true, &mut ready)
            .expect("wait");
        assert!(!ready.timed_out);

        let (a, b) = UnixStream::pair().expect("pair");
        set.watch(a.as_fd(), 7, false).expect("watch");
        set.rewatch(a.as_fd(), 7, true).expect("rewatch");
        set.wait(Duration::ZERO, false, || false, &mut ready)
            .expect("wait");
        assert_eq!(
            (ready.hung_up.clone(), ready.writable.clone()),
            (vec![], vec![7])
        );
        drop(b);
        set.wait(Duration::from_secs(20), false, || false, &mut ready)
            .expect("wait");
        assert_eq!(ready.hung_up, vec![7], "hung up");
        set.forget(a.as_fd());
        set.wait(Duration::ZERO, false, || false, &mut ready)
            .expect("wait");
        assert!(ready.timed_out);
    }
}
