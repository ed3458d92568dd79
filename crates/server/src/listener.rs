//! The accept side: socket options and the connection limit.
//!
//! Every accepted socket gets TCP keepalive and `TCP_USER_TIMEOUT` (so a client
//! that vanishes without a FIN is dropped, whether or not heartbeats are in
//! flight) and `TCP_NODELAY`. Past `max_connections`, a connection is answered
//! `503` with a JSON body naming the limit, and closed.

use crate::ServerConfig;
use bytes::Bytes;
use socket2::{SockRef, TcpKeepalive};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A TCP listener that applies socket options and the connection limit.
pub struct GaplessListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    config: ServerConfig,
}

impl GaplessListener {
    /// Wraps a bound listener.
    pub fn new(inner: TcpListener, config: ServerConfig) -> Self {
        GaplessListener {
            inner,
            permits: Arc::new(Semaphore::new(config.max_connections.max(1))),
            config,
        }
    }

    fn tune(&self, tcp: &TcpStream) -> io::Result<()> {
        tcp.set_nodelay(true)?;
        let sock = SockRef::from(tcp);
        if self.config.tcp_keepalive_ms > 0 {
            let every = Duration::from_millis(self.config.tcp_keepalive_ms);
            let ka = TcpKeepalive::new()
                .with_time(every)
                .with_interval(every)
                .with_retries(3);
            sock.set_tcp_keepalive(&ka)?;
        }
        if self.config.tcp_user_timeout_ms > 0 {
            sock.set_tcp_user_timeout(Some(Duration::from_millis(
                self.config.tcp_user_timeout_ms,
            )))?;
        }
        Ok(())
    }
}

/// An accepted connection holding its slot under the connection limit.
pub struct Conn {
    tcp: TcpStream,
    /// Bytes already read that reads return first (see [`Conn::unread`]).
    unread: Bytes,
    permit: OwnedSemaphorePermit,
}

impl Conn {
    /// The socket, for writers that bypass the HTTP server.
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Puts `bytes` back: the next reads return them before anything new
    /// from the socket (so hyper can parse a request head read elsewhere).
    pub fn unread(&mut self, bytes: Bytes) {
        self.unread = bytes;
    }

    /// Takes the socket off this runtime's I/O driver (dropping any unread
    /// bytes), to be [attached](Detached::attach) on another runtime.
    ///
    /// # Errors
    /// Failing to deregister the socket.
    pub fn detach(self) -> io::Result<Detached> {
        Ok(Detached {
            tcp: self.tcp.into_std()?,
            permit: self.permit,
        })
    }
}

/// A connection between runtimes: still holding its slot, registered on none.
pub struct Detached {
    tcp: std::net::TcpStream,
    permit: OwnedSemaphorePermit,
}

impl Detached {
    /// Registers the socket on the current runtime's I/O driver.
    ///
    /// # Errors
    /// Failing to register the socket (outside a runtime, or out of resources).
    pub fn attach(self) -> io::Result<Conn> {
        Ok(Conn {
            tcp: TcpStream::from_std(self.tcp)?,
            unread: Bytes::new(),
            permit: self.permit,
        })
    }
}

impl GaplessListener {
    /// Accepts the next connection within the limit (answering those past it with 503).
    pub async fn accept(&mut self) -> (Conn, SocketAddr) {
        loop {
            let (tcp, addr) = match self.inner.accept().await {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: wait a little rather than spin.
                    tracing::error!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if let Err(e) = self.tune(&tcp) {
                tracing::debug!(error = %e, "could not set socket options");
            }
            match self.permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    return (
                        Conn {
                            tcp,
                            unread: Bytes::new(),
                            permit,
                        },
                        addr,
                    )
                }
                Err(_) => {
                    let max = self.config.max_connections;
                    tokio::spawn(refuse(tcp, max));
                }
            }
        }
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

async fn refuse(mut tcp: TcpStream, max: usize) {
    let body = format!(
        "{{\"error\":\"limit_reached\",\"message\":\"the server holds its maximum of {max} connections (--max-connections); retry later\"}}"
    );
    let resp = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = tcp.write_all(resp.as_bytes()).await;
        let _ = tcp.shutdown().await;
    })
    .await;
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.unread.is_empty() {
            let n = self.unread.len().min(buf.remaining());
            buf.put_slice(&self.unread.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}
