//! Which of a server's connections are open: evidence that a peer is gone.
//!
//! A lease says a trainer is gone only after it has been silent for the
//! lease's length. When a trainer process dies (SIGKILL, an OOM kill, a
//! crash), the kernel closes its sockets at once, and the server reads the
//! end of its connection: a surer and much earlier sign. The coordinator
//! keeps, for each trainer session, the connection it last heard the
//! session on; when that connection has closed and the session has not
//! been heard from since, its process is gone (or cut off, which a
//! reconnection's first heartbeat would undo). A resumed run uses this not
//! to wait a lease for the sessions of the run it continues.
//!
//! A connection is named by its two addresses, which no two open TCP
//! connections share. Only connections this server accepted are known: a
//! call's connection that the table does not hold (a test calling the
//! service directly) is never evidence of anything.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};

/// One accepted TCP connection, by its addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Connection {
    local: SocketAddr,
    remote: SocketAddr,
}

impl Connection {
    fn of_info(info: &TcpConnectInfo) -> Option<Self> {
        Some(Self { local: info.local_addr?, remote: info.remote_addr? })
    }

    /// The peer's address, for logs.
    pub fn remote(&self) -> SocketAddr {
        self.remote
    }
}

/// The connections a server has open. Cloning shares the table.
#[derive(Clone, Debug, Default)]
pub struct Connections(Arc<Mutex<HashMap<Connection, usize>>>);

impl Connections {
    fn table(&self) -> MutexGuard<'_, HashMap<Connection, usize>> {
        // Counters only: a panic elsewhere leaves them consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open connection `request` arrived on, over plain TCP or TLS;
    /// None when this server did not accept it (or it closed already).
    pub fn of<T>(&self, request: &tonic::Request<T>) -> Option<Connection> {
        let ext = request.extensions();
        let info = ext
            .get::<TcpConnectInfo>()
            .or_else(|| ext.get::<TlsConnectInfo<TcpConnectInfo>>().map(TlsConnectInfo::get_ref))?;
        Connection::of_info(info).filter(|c| self.is_open(c))
    }

    /// Whether `connection` is still open.
    pub fn is_open(&self, connection: &Connection) -> bool {
        self.table().contains_key(connection)
    }

    /// How many connections are open.
    pub fn open(&self) -> usize {
        self.table().values().sum()
    }

    /// Counts `io`'s connection open until the returned value is dropped,
    /// which the server does when the connection ends.
    pub(crate) fn track<IO>(&self, io: IO) -> Tracked<IO>
    where
        IO: Connected<ConnectInfo = TcpConnectInfo>,
    {
        let connection = Connection::of_info(&io.connect_info());
        if let Some(c) = connection {
            *self.table().entry(c).or_default() += 1;
        }
        Tracked { io, connection, table: self.clone() }
    }

    fn closed(&self, connection: &Connection) {
        let mut table = self.table();
        if let Some(n) = table.get_mut(connection) {
            *n -= 1;
            if *n == 0 {
                table.remove(connection);
            }
        }
    }
}

/// A connection counted open in a [`Connections`] table while it lives.
#[derive(Debug)]
pub(crate) struct Tracked<IO> {
    io: IO,
    connection: Option<Connection>,
    table: Connections,
}

impl<IO> Drop for Tracked<IO> {
    fn drop(&mut self) {
        if let Some(c) = &self.connection {
            self.table.closed(c);
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Tracked<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Tracked<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<IO: Connected<ConnectInfo = TcpConnectInfo>> Connected for Tracked<IO> {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// A connection is open from its acceptance until its end is dropped,
    /// and a request that names it is recognised only meanwhile.
    #[tokio::test]
    async fn a_connection_is_open_until_dropped() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut client = TcpStream::connect(addr).await.expect("connect");
        let (accepted, _) = listener.accept().await.expect("accept");
        let table = Connections::default();
        let mut tracked = table.track(accepted);
        let info = tracked.connect_info();
        let mut request = tonic::Request::new(());
        request.extensions_mut().insert(info.clone());
        let c = table.of(&request).expect("the request's connection is known");
        assert_eq!(c.remote(), client.local_addr().expect("client addr"));
        assert!(table.is_open(&c) && table.open() == 1);
        // Bytes pass through both ways.
        client.write_all(b"ping").await.expect("write");
        let mut got = [0u8; 4];
        tracked.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"ping");
        tracked.write_all(b"pong").await.expect("write back");
        client.read_exact(&mut got).await.expect("read back");
        assert_eq!(&got, b"pong");
        drop(tracked);
        assert!(!table.is_open(&c) && table.open() == 0);
        assert!(table.of(&request).is_none(), "a closed connection is not handed out");
        let mut unknown = tonic::Request::new(());
        unknown.extensions_mut().insert(info);
        assert!(Connections::default().of(&unknown).is_none(), "another server's table knows nothing of it");
    }
}
