//! A loopback relay in front of an S3 server (moto) that answers as a
//! failing store would, for the failures a real store has and moto has
//! not: throttling (`503 Slow Down`), a refused access (`403` with S3's
//! `AccessDenied` body), and silence (a request read and never answered).
//! With no fault, bytes pass both ways untouched.
//!
//! The fault is switched at run time, for the next N requests or until
//! switched again. A switch closes every connection opened before it, so a
//! client's pooled keep-alive connections meet the new fault on their next
//! request instead of passing it by. A faulty answer closes its connection
//! (`Connection: close`): each request a client retries is a new one.
//! Every loop checks the stop flag that dropping the relay sets, and the
//! drop joins every thread.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often a waiting loop looks at the flags.
const TICK: Duration = Duration::from_millis(5);
/// Longest request head read; a longer one closes its connection (S3
/// requests are a few hundred bytes).
const MAX_HEAD: usize = 64 << 10;
/// Longest a write may block (a peer that stopped reading), so that every
/// thread ends soon after the relay stops.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// What the relay does with the requests it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Nothing: bytes pass to the server and back.
    None,
    /// `503 Slow Down`, S3's answer to a client over its request rate (a
    /// server error: clients retry it).
    SlowDown,
    /// `403 Forbidden` with an `AccessDenied` body: credentials or a bucket
    /// policy that refuse the read (not retried).
    AccessDenied,
    /// The request is read and never answered; the connection stays open
    /// until the next switch or the relay's end.
    Silent,
}

impl Fault {
    const ALL: [Fault; 4] = [Fault::None, Fault::SlowDown, Fault::AccessDenied, Fault::Silent];

    fn index(self) -> usize {
        Self::ALL.iter().position(|&f| f == self).expect("every fault is listed")
    }
}

/// What the relay's threads share.
#[derive(Debug)]
struct Shared {
    /// The S3 server.
    target: SocketAddr,
    /// The fault in force ([`Fault::index`]).
    fault: AtomicU8,
    /// Faulty answers left before the relay passes bytes again (`u64::MAX`:
    /// until switched).
    left: AtomicU64,
    /// Bumped by each switch: a connection opened before it closes.
    generation: AtomicU64,
    /// Requests given each fault (its index); `Fault::None` counts those
    /// passed after a fault's budget ran out.
    given: [AtomicU64; 4],
    /// Every thread ends when set.
    stop: AtomicBool,
}

impl Shared {
    fn fault(&self) -> Fault {
        Fault::ALL[usize::from(self.fault.load(Ordering::SeqCst))]
    }

    fn switch(&self, fault: Fault, answers: u64) {
        self.left.store(answers, Ordering::SeqCst);
        self.fault.store(fault.index() as u8, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// What one request read now gets: the fault in force while its budget
    /// lasts (the last one switches the relay back to passing bytes).
    fn take(&self) -> Fault {
        let fault = self.fault();
        let given = match fault {
            Fault::None => Fault::None,
            _ => match self.left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)) {
                Ok(1) => {
                    self.switch(Fault::None, u64::MAX);
                    fault
                }
                Ok(_) => fault,
                Err(_) => Fault::None,
            },
        };
        self.given[given.index()].fetch_add(1, Ordering::SeqCst);
        given
    }

    /// True once the connection of `generation` must close.
    fn over(&self, generation: u64) -> bool {
        self.stop.load(Ordering::SeqCst) || self.generation.load(Ordering::SeqCst) != generation
    }
}

/// A running relay; stops and joins its threads on drop.
#[derive(Debug)]
pub struct FaultRelay {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl FaultRelay {
    /// Listens on `127.0.0.1:0` in front of the server at `endpoint`
    /// (`http://127.0.0.1:PORT`), passing bytes until told otherwise.
    pub fn start(endpoint: &str) -> FaultRelay {
        let target = endpoint.trim_start_matches("http://").trim_end_matches('/');
        let target: SocketAddr = target.parse().unwrap_or_else(|e| panic!("relay target {endpoint}: {e}"));
        assert!(target.ip().is_loopback(), "the fault relay only fronts a loopback server, not {target}");
        let listener = TcpListener::bind("127.0.0.1:0").expect("relay bind");
        listener.set_nonblocking(true).expect("relay nonblocking");
        let addr = listener.local_addr().expect("relay address");
        let shared = Arc::new(Shared {
            target,
            fault: AtomicU8::new(Fault::None.index() as u8),
            left: AtomicU64::new(u64::MAX),
            generation: AtomicU64::new(0),
            given: Default::default(),
            stop: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("e2e-fault-relay".into())
            .spawn(move || {
                let mut connections: Vec<JoinHandle<()>> = Vec::new();
                while !s.stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            let s = Arc::clone(&s);
                            connections.retain(|c| !c.is_finished());
                            connections.push(std::thread::spawn(move || connection(client, &s)));
                        }
                        Err(_) => std::thread::sleep(TICK),
                    }
                }
                for c in connections {
                    let _ = c.join();
                }
            })
            .expect("spawn relay thread");
        FaultRelay { addr, shared, accept: Some(accept) }
    }

    /// The endpoint a client is given instead of the server's.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request gets `fault` until the next switch.
    pub fn set(&self, fault: Fault) {
        self.shared.switch(fault, u64::MAX);
    }

    /// The next `answers` requests get `fault`; then bytes pass again.
    pub fn set_for(&self, fault: Fault, answers: u64) {
        assert!(answers > 0, "a fault for no request");
        self.shared.switch(fault, answers);
    }

    /// Requests that got `fault` so far.
    pub fn given(&self, fault: Fault) -> u64 {
        self.shared.given[fault.index()].load(Ordering::SeqCst)
    }
}

impl Drop for FaultRelay {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// One client connection: bytes pass while there is no fault; else its
/// request is read and given the fault.
fn connection(client: TcpStream, shared: &Shared) {
    let generation = shared.generation.load(Ordering::SeqCst);
    let _ = client.set_read_timeout(Some(TICK));
    let _ = client.set_write_timeout(Some(WRITE_TIMEOUT));
    if shared.fault() == Fault::None {
        return pass(client, &[], generation, shared);
    }
    let Some(head) = read_head(&client, generation, shared) else { return };
    match shared.take() {
        Fault::None => pass(client, &head, generation, shared),
        Fault::Silent => hold(client, generation, shared),
        fault => answer(client, &head, fault),
    }
}

/// The request head (through its blank line), or None when the client
/// closed first, it is too long, or the connection must close.
fn read_head(mut client: &TcpStream, generation: u64, shared: &Shared) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !shared.over(generation) && head.len() <= MAX_HEAD {
        match client.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => {
                head.extend_from_slice(&buf[..n]);
                if head.windows(4).any(|w| w == b"\r\n\r\n") {
                    return Some(head);
                }
            }
            Err(e) if waiting(&e) => {}
            Err(_) => return None,
        }
    }
    None
}

/// Answers the request in `head` as S3 does for `fault`, and closes.
fn answer(mut client: TcpStream, head: &[u8], fault: Fault) {
    let (status, code, message) = match fault {
        Fault::SlowDown => ("503 Slow Down", "SlowDown", "Please reduce your request rate."),
        _ => ("403 Forbidden", "AccessDenied", "Access Denied"),
    };
    // Multi-line, as S3's are: a client's message must still be one line.
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error>\n  <Code>{code}</Code>\n  <Message>{message}</Message>\n  \
         <RequestId>fault-relay</RequestId>\n</Error>\n"
    );
    // A HEAD answer announces its body's length and sends none.
    let sent = if head.starts_with(b"HEAD ") { "" } else { body.as_str() };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nx-amz-request-id: fault-relay\r\n\
         Connection: close\r\n\r\n{sent}",
        body.len()
    );
    let _ = client.write_all(response.as_bytes());
    let _ = client.shutdown(Shutdown::Both);
}

/// Keeps the connection open, answering nothing, until the client gives up
/// or the connection must close.
fn hold(mut client: TcpStream, generation: u64, shared: &Shared) {
    let mut buf = [0u8; 4096];
    while !shared.over(generation) {
        match client.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if waiting(&e) => {}
            Err(_) => break,
        }
    }
    let _ = client.shutdown(Shutdown::Both);
}

/// Sends `head` (already read from the client) to the server, then pumps
/// both ways until either side closes or the connection must close.
fn pass(client: TcpStream, head: &[u8], generation: u64, shared: &Shared) {
    let Ok(mut server) = TcpStream::connect_timeout(&shared.target, Duration::from_secs(1)) else { return };
    let _ = server.set_read_timeout(Some(TICK));
    let _ = server.set_write_timeout(Some(WRITE_TIMEOUT));
    if server.write_all(head).is_err() {
        return;
    }
    let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else { return };
    std::thread::scope(|s| {
        s.spawn(|| pump(server2, client2, generation, shared));
        pump(client, server, generation, shared);
    });
}

/// Copies `from` to `to`; closes both when either side is done or the
/// connection must close.
fn pump(mut from: TcpStream, mut to: TcpStream, generation: u64, shared: &Shared) {
    let mut buf = vec![0u8; 64 << 10];
    while !shared.over(generation) {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if waiting(&e) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// A read that timed out (its tick passed) rather than failed.
fn waiting(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted)
}
