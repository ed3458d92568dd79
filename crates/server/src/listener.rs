//! The accept side: socket options and the connection limits.
//!
//! Every accepted socket gets TCP keepalive and `TCP_USER_TIMEOUT` (so a client
//! that vanishes without a FIN is dropped, whether or not heartbeats are in
//! flight) and `TCP_NODELAY`. A stream socket later trades the user timeout
//! for a check by progress that keeps slow readers (`tcp_info.rs`). A connection past `max_connections`, or past
//! `max_connections_per_ip` for its address, is still accepted but marked
//! [`Refused`]: it may carry one request, which is answered by the router's
//! busy rule (`busy.rs`: probes served, SSE told to retry, the rest 503) and
//! the connection is closed. At most [`REFUSING_MAX`] refusals are in
//! flight; past that a connection is closed at once.

use crate::ServerConfig;
use bytes::Bytes;
use socket2::{SockRef, TcpKeepalive};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Most refused connections answered at once; more are closed unanswered.
pub const REFUSING_MAX: usize = 256;

/// A TCP listener that applies socket options and the connection limits.
pub struct GaplessListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    refusing: Arc<Semaphore>,
    per_ip: Arc<PerIp>,
    config: ServerConfig,
}

/// Open connections per client address.
#[derive(Default)]
struct PerIp(parking_lot::Mutex<HashMap<IpAddr, usize>>);

impl PerIp {
    /// Counts a connection from `ip` unless it already holds `max` (0: no limit).
    fn enter(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<IpGuard> {
        if max == 0 {
            return Some(IpGuard(None));
        }
        let mut map = self.0.lock();
        let n = map.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(IpGuard(Some((self.clone(), ip))))
    }
}

/// Releases a connection's count for its address.
struct IpGuard(Option<(Arc<PerIp>, IpAddr)>);

impl Drop for IpGuard {
    fn drop(&mut self) {
        if let Some((per_ip, ip)) = self.0.take() {
            let mut map = per_ip.0.lock();
            if let Some(n) = map.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&ip);
                }
            }
        }
    }
}

/// Why a connection was refused: the limit and its flag, for the answer.
#[derive(Debug, Clone)]
pub struct Refused(pub String);

/// What holds a connection's place: its slot under the limits, or its place
/// among the refusals being answered.
enum Slot {
    Admitted {
        _permit: OwnedSemaphorePermit,
        _ip: IpGuard,
    },
    Refused {
        _permit: OwnedSemaphorePermit,
        why: Refused,
    },
}

impl GaplessListener {
    /// Wraps a bound listener.
    pub fn new(inner: TcpListener, config: ServerConfig) -> Self {
        GaplessListener {
            inner,
            permits: Arc::new(Semaphore::new(config.max_connections.max(1))),
            refusing: Arc::new(Semaphore::new(REFUSING_MAX)),
            per_ip: Arc::new(PerIp::default()),
            config,
        }
    }

    fn admit(&self, ip: IpAddr) -> Result<Slot, Refused> {
        let Some(ip_guard) = self.per_ip.enter(ip, self.config.max_connections_per_ip) else {
            return Err(Refused(format!(
                "this address holds the maximum of {} connections (--max-connections-per-ip); retry later",
                self.config.max_connections_per_ip
            )));
        };
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => Ok(Slot::Admitted {
                _permit: permit,
                _ip: ip_guard,
            }),
            Err(_) => Err(Refused(format!(
                "the server holds its maximum of {} connections (--max-connections); retry later",
                self.config.max_connections
            ))),
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

/// An accepted connection holding its slot under the connection limits
/// (or its place among the refusals).
pub struct Conn {
    tcp: TcpStream,
    /// Bytes already read that reads return first (see [`Conn::unread`]).
    unread: Bytes,
    slot: Slot,
}

impl Conn {
    /// Why this connection is refused (`None`: it is admitted).
    pub fn refused(&self) -> Option<&Refused> {
        match &self.slot {
            Slot::Refused { why, .. } => Some(why),
            Slot::Admitted { .. } => None,
        }
    }

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
            slot: self.slot,
        })
    }
}

/// A connection between runtimes: still holding its slot, registered on none.
pub struct Detached {
    tcp: std::net::TcpStream,
    slot: Slot,
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
            slot: self.slot,
        })
    }
}

impl GaplessListener {
    /// Accepts the next connection: admitted within the limits, or marked
    /// [`Refused`] past them (see the module doc).
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
            let slot = match self.admit(addr.ip()) {
                Ok(slot) => slot,
                Err(why) => match self.refusing.clone().try_acquire_owned() {
                    Ok(permit) => Slot::Refused {
                        _permit: permit,
                        why,
                    },
                    // Too many refusals in flight: close without an answer.
                    Err(_) => continue,
                },
            };
            return (
                Conn {
                    tcp,
                    unread: Bytes::new(),
                    slot,
                },
                addr,
            );
        }
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
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
