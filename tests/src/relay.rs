//! A TCP relay on loopback whose path a test can freeze, for a grey failure
//! of one link: frozen, no byte moves either way on any connection, old or
//! new, and nothing is reset or closed (the relay stops reading, so the
//! senders' windows fill), as through a port blackholed both ways; thawed,
//! bytes flow again. A worker advertises the relay's address, so its
//! trainers' streams pass the relay while its own heartbeats to the
//! coordinator do not. It can also be slow ([`Relay::slow`]): each
//! connection passes at most so many bytes a second each way, so that a
//! large response takes seconds while a small one passes at once. The
//! kernel here has no netem and tests need no iptables; every loop checks
//! the stop flag the relay's drop sets.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often an idle or frozen loop looks at the flags.
const TICK: Duration = Duration::from_millis(5);

/// What the relay's threads share.
#[derive(Debug, Default)]
struct Shared {
    /// Where connections go; set once the target listens.
    target: Mutex<Option<SocketAddr>>,
    /// No byte moves while set.
    frozen: AtomicBool,
    /// Bytes a second each connection passes each way, at most (0: no cap).
    rate: AtomicU64,
    /// Every thread ends when set.
    stop: AtomicBool,
}

/// A running relay; stops its threads on drop.
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Relay {
    /// Listens on `127.0.0.1:0`; connections wait for [`Relay::to`].
    pub fn start() -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("relay bind");
        listener.set_nonblocking(true).expect("relay nonblocking");
        let addr = listener.local_addr().expect("relay address");
        let shared = Arc::new(Shared::default());
        let s = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("e2e-relay".into())
            .spawn(move || {
                while !s.stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            let s = Arc::clone(&s);
                            std::thread::spawn(move || connection(client, &s));
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(TICK),
                        Err(_) => std::thread::sleep(TICK),
                    }
                }
            })
            .expect("spawn relay thread");
        Relay { addr, shared, accept: Some(accept) }
    }

    /// The relay's address, for the worker to advertise.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sends connections to `target` (`host:port`).
    pub fn to(&self, target: &str) {
        let target: SocketAddr = target.parse().unwrap_or_else(|e| panic!("relay target {target}: {e}"));
        *self.shared.target.lock().expect("relay lock") = Some(target);
    }

    /// Stops every byte, both ways, on every connection.
    pub fn freeze(&self) {
        self.shared.frozen.store(true, Ordering::Relaxed);
    }

    /// Lets bytes flow again.
    pub fn thaw(&self) {
        self.shared.frozen.store(false, Ordering::Relaxed);
    }

    /// Passes at most `bytes_per_s` bytes a second on each connection,
    /// each way, from now on.
    pub fn slow(&self, bytes_per_s: u64) {
        self.shared.rate.store(bytes_per_s, Ordering::Relaxed);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// One client connection: waits for a target and a thawed path, then pumps
/// both ways until either side closes or the relay stops.
fn connection(client: TcpStream, shared: &Arc<Shared>) {
    let server = loop {
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let target = *shared.target.lock().expect("relay lock");
        match target {
            Some(target) if !shared.frozen.load(Ordering::Relaxed) => match TcpStream::connect(target) {
                Ok(server) => break server,
                Err(_) => return,
            },
            _ => std::thread::sleep(TICK),
        }
    };
    let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else { return };
    let s = Arc::clone(shared);
    let back = std::thread::spawn(move || pump(server2, client2, &s));
    pump(client, server, shared);
    let _ = back.join();
}

/// Copies `from` to `to` while the path is thawed; closes both when either
/// side is done.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let _ = from.set_read_timeout(Some(TICK));
    let mut buf = vec![0u8; 64 << 10];
    while !shared.stop.load(Ordering::Relaxed) {
        if shared.frozen.load(Ordering::Relaxed) {
            std::thread::sleep(TICK);
            continue;
        }
        // Slow: a tick's worth of bytes at a time, then the rest of the tick.
        let rate = shared.rate.load(Ordering::Relaxed);
        let most = match rate {
            0 => buf.len(),
            rate => usize::try_from(rate / 200).unwrap_or(usize::MAX).clamp(1, buf.len()),
        };
        match from.read(&mut buf[..most]) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                if rate > 0 {
                    std::thread::sleep(Duration::from_secs_f64(n as f64 / rate as f64));
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
