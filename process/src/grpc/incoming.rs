//! Accepted connections for a server: plain TCP, or TLS handshaken here so
//! that each handshake takes the certificate of the moment (files are
//! re-read when they change), a failed one is logged with the peer's
//! address instead of disappearing, and rustls reads through a
//! [`ReadAhead`] socket.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use super::connections::{Connections, Tracked};
use super::read_ahead::{ReadAhead, SERVER_READ_AHEAD};
use crate::security::tls::{RELOAD_INTERVAL, ReloadingTls};

/// Longest a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// First byte of every TLS connection (a handshake record).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;
/// Encrypted bytes rustls may hold for the socket before a write waits.
/// Its default, 64 KiB, cut each 1 MiB HTTP/2 frame of a batch into 16
/// `writev` calls and as many bursts of small TCP segments; at 1 MiB a
/// frame is one call, and a trainer reading large batches from a worker
/// uses less CPU (`bench/ab/tls_overhead.sh`, docs/benchmarks.md).
const SEND_BUFFER: usize = 1 << 20;
/// Handshaken connections waiting for the server to take them.
const QUEUE: usize = 64;

/// TLS connections accepted on `listener`, handshaken with `tls`'s
/// configuration of the moment; the files are checked for changes every
/// [`RELOAD_INTERVAL`]. Each connection counts open in `connections` from
/// its acceptance. Accepting stops when the stream is dropped.
pub(crate) fn tls(
    listener: TcpListener,
    tls: Arc<ReloadingTls>,
    connections: Connections,
) -> ReceiverStream<io::Result<TlsStream<Tracked<ReadAhead>>>> {
    let (tx, rx) = mpsc::channel(QUEUE);
    tokio::spawn(async move {
        let mut reload = tokio::time::interval(RELOAD_INTERVAL);
        reload.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = tx.closed() => break,
                _ = reload.tick() => {
                    let tls = Arc::clone(&tls);
                    // Reading files blocks; keep it off the runtime's threads.
                    let _ = tokio::task::spawn_blocking(move || tls.check()).await;
                }
                accepted = listener.accept() => match accepted {
                    Ok((tcp, peer)) => {
                        let acceptor = TlsAcceptor::from(tls.current());
                        let tx = tx.clone();
                        let connections = connections.clone();
                        tokio::spawn(async move {
                            if let Some(stream) = handshake(acceptor, tcp, peer, &connections).await {
                                let _ = tx.send(Ok(stream)).await;
                            }
                        });
                    }
                    // Out of file descriptors and the like: say so, pause,
                    // and go on accepting.
                    Err(e) => {
                        tracing::warn!("accepting a connection failed: {e}");
                        tokio::time::sleep(crate::retry::ACCEPT_ERROR_PAUSE).await;
                    }
                },
            }
        }
    });
    ReceiverStream::new(rx)
}

async fn handshake(
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
    connections: &Connections,
) -> Option<TlsStream<Tracked<ReadAhead>>> {
    let _ = tcp.set_nodelay(true);
    let mut first = [0u8; 1];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tcp.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] != TLS_HANDSHAKE_RECORD => {
            tracing::warn!("connection from {peer} refused: it is not TLS (a plaintext client? this server requires TLS)");
            return None;
        }
        Ok(Ok(1)) => {}
        _ => return None,
    }
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(connections.track(ReadAhead::new(tcp, SERVER_READ_AHEAD)))).await {
        Ok(Ok(mut stream)) => {
            stream.get_mut().1.set_buffer_limit(Some(SEND_BUFFER));
            Some(stream)
        }
        Ok(Err(e)) => {
            tracing::warn!("TLS handshake with {peer} failed: {e}");
            None
        }
        Err(_) => {
            tracing::warn!("TLS handshake with {peer} took over {}s; closed", HANDSHAKE_TIMEOUT.as_secs());
            None
        }
    }
}
