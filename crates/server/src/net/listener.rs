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
//!
//! **Behind a trusted proxy** (`--trusted-proxy`, `forwarded.rs`) the peer's
//! address says nothing about the client: a proxy carries many clients over
//! a pool of keep-alive connections, and one client's requests may arrive on
//! any of them. So a connection from a trusted peer is counted only under
//! `max_connections`, and `max_connections_per_ip` counts, per forwarded
//! client address, the **requests in flight** instead: a request holds its
//! client's place from its head until its response ends (the whole stream,
//! for SSE), or until the connection closes when the request takes it over
//! (a WebSocket upgrade, or a stream the first-head reader writes to the
//! socket). An idle keep-alive connection counts for nobody. A request past
//! the cap gets the same answer as a refused connection (`busy.rs`), but the
//! connection stays open for the proxy's other clients. Each refusal under
//! the per-IP cap is logged at `warn` at most once a minute per address,
//! naming the setting, and counted in `gapless_connections_refused_total`.

use crate::net::forwarded::TrustedProxies;
use crate::ServerConfig;
use axum::http::HeaderMap;
use bytes::Bytes;
use socket2::{SockRef, TcpKeepalive};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Most refused connections answered at once; more are closed unanswered.
pub(crate) const REFUSING_MAX: usize = 256;

/// A TCP listener that applies socket options and the connection limits.
pub(crate) struct GaplessListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    refusing: Arc<Semaphore>,
    per_ip: Arc<PerIp>,
    trusted: Arc<TrustedProxies>,
    config: ServerConfig,
}

/// How often the per-IP refusal of one address is logged at most.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// Most addresses remembered as warned about (memory stays bounded whatever
/// the number of refused addresses; past it, older entries are forgotten).
const WARNED_MAX: usize = 4096;

/// Open connections (from a trusted proxy: requests in flight) per client
/// address, and when each refused address was last warned about.
#[derive(Default)]
struct PerIp {
    counts: parking_lot::Mutex<HashMap<IpAddr, usize>>,
    warned: parking_lot::Mutex<HashMap<IpAddr, Instant>>,
}

impl PerIp {
    /// Counts a connection from `ip` unless it already holds `max` (0: no limit).
    fn enter(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<IpGuard> {
        if max == 0 {
            return Some(IpGuard(None));
        }
        let mut map = self.counts.lock();
        let n = map.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(IpGuard(Some((self.clone(), ip))))
    }

    /// The refusal of `ip` past `max`: counted, and logged at `warn` unless
    /// `ip` was warned about less than [`WARN_EVERY`] ago. `via`: the trusted
    /// proxy it came through.
    fn refuse(&self, ip: IpAddr, via: Option<IpAddr>, max: usize, close: bool) -> Refused {
        crate::metrics::connection_refused("per_ip");
        let now = Instant::now();
        let warn = {
            let mut warned = self.warned.lock();
            if warned.len() >= WARNED_MAX {
                warned.retain(|_, at| now.duration_since(*at) < WARN_EVERY);
            }
            match warned.get(&ip) {
                Some(at) if now.duration_since(*at) < WARN_EVERY => false,
                _ if warned.len() >= WARNED_MAX => false,
                _ => {
                    warned.insert(ip, now);
                    true
                }
            }
        };
        if warn {
            let proxy = match via {
                Some(p) if p != ip => format!(" (through the trusted proxy {p})"),
                _ => String::new(),
            };
            let hint = if via.is_some() {
                "raise --max-connections-per-ip (0: no limit) if this client is legitimate"
            } else {
                "raise --max-connections-per-ip (0: no limit); behind a reverse proxy, set \
                 --trusted-proxy to the proxy's address so the cap counts each client behind it \
                 (docs/deploy.md)"
            };
            tracing::warn!(
                client = %ip,
                limit = max,
                "refusing connections from {ip}{proxy}: it holds the maximum of {max} \
                 (--max-connections-per-ip); {hint}; said at most once a minute per address"
            );
        }
        Refused {
            why: format!(
                "this address holds the maximum of {max} connections (--max-connections-per-ip); retry later"
            ),
            close,
        }
    }
}

/// Releases a connection's count for its address.
struct IpGuard(Option<(Arc<PerIp>, IpAddr)>);

impl Drop for IpGuard {
    fn drop(&mut self) {
        if let Some((per_ip, ip)) = self.0.take() {
            let mut map = per_ip.counts.lock();
            if let Some(n) = map.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&ip);
                }
            }
        }
    }
}

/// Why a connection (or, on a trusted proxy's connection, one request) was
/// refused: the limit and its flag, for the answer (`busy.rs`).
#[derive(Debug, Clone)]
pub(crate) struct Refused {
    /// What the answer says: the limit, its flag, and to retry later.
    pub why: String,
    /// Whether the connection closes after the answer: true for a connection
    /// past a limit; false for a request refused on a trusted proxy's
    /// connection, which carries other clients' requests too.
    pub close: bool,
}

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

/// A connection from a trusted proxy: counts each request under the per-IP
/// cap by its forwarded client address (see the module doc). Cloned into
/// each request's service; one allocation per such connection, none for
/// other connections.
#[derive(Clone)]
pub(crate) struct Proxied(Arc<ProxiedInner>);

struct ProxiedInner {
    per_ip: Arc<PerIp>,
    trusted: Arc<TrustedProxies>,
    max: usize,
    peer: IpAddr,
    /// The place of the request that took the connection over, kept until it closes.
    held: parking_lot::Mutex<Option<ClientSlot>>,
}

/// One request's place under the per-IP cap for its forwarded client; the
/// place is freed when this is dropped.
pub(crate) struct ClientSlot {
    _guard: IpGuard,
}

impl Proxied {
    /// The client of a request with `headers` (`forwarded.rs`), and its place
    /// under `--max-connections-per-ip`.
    ///
    /// # Errors
    /// (In the pair.) [`Refused`] with `close: false` when that client already
    /// has the maximum of requests in flight; logged as the module doc says.
    pub(crate) fn admit(&self, headers: &HeaderMap) -> (IpAddr, Result<ClientSlot, Refused>) {
        let p = &self.0;
        let client = p.trusted.client(p.peer, headers);
        let slot = match p.per_ip.enter(client, p.max) {
            Some(guard) => Ok(ClientSlot { _guard: guard }),
            None => Err(p.per_ip.refuse(client, Some(p.peer), p.max, false)),
        };
        (client, slot)
    }

    /// Keeps `slot` until the connection closes: for the request that takes
    /// the connection over (a WebSocket upgrade, a stream written to the
    /// socket), after which the connection carries no other request.
    pub(crate) fn hold(&self, slot: ClientSlot) {
        *self.0.held.lock() = Some(slot);
    }
}

impl GaplessListener {
    /// Wraps a bound listener.
    pub(crate) fn new(inner: TcpListener, config: ServerConfig) -> Self {
        GaplessListener {
            inner,
            // 0: no limit, as for every connection limit.
            permits: Arc::new(Semaphore::new(match config.max_connections {
                0 => Semaphore::MAX_PERMITS,
                n => n.min(Semaphore::MAX_PERMITS),
            })),
            refusing: Arc::new(Semaphore::new(REFUSING_MAX)),
            per_ip: Arc::new(PerIp::default()),
            trusted: Arc::new(config.trusted_proxies.clone()),
            config,
        }
    }

    /// A slot for a connection from `ip` under the limits. A trusted proxy's
    /// connection is counted only under `max_connections` (its requests are
    /// counted per client: [`Proxied`]).
    fn admit(&self, ip: IpAddr) -> Result<(Slot, Option<Proxied>), Refused> {
        // One key and one spelling per client: an IPv4 peer on a dual-stack
        // socket arrives as `::ffff:a.b.c.d`, which the cap counts and the
        // log names as `a.b.c.d` (the form --trusted-proxy matches).
        let ip = ip.to_canonical();
        let max_per_ip = self.config.max_connections_per_ip;
        let proxied = self.trusted.contains(ip).then(|| {
            Proxied(Arc::new(ProxiedInner {
                per_ip: self.per_ip.clone(),
                trusted: self.trusted.clone(),
                max: max_per_ip,
                peer: ip,
                held: parking_lot::Mutex::new(None),
            }))
        });
        let ip_guard = if proxied.is_some() {
            IpGuard(None)
        } else {
            match self.per_ip.enter(ip, max_per_ip) {
                Some(guard) => guard,
                None => return Err(self.per_ip.refuse(ip, None, max_per_ip, true)),
            }
        };
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => Ok((
                Slot::Admitted {
                    _permit: permit,
                    _ip: ip_guard,
                },
                proxied,
            )),
            Err(_) => {
                crate::metrics::connection_refused("connections");
                Err(Refused {
                    why: format!(
                        "the server holds its maximum of {} connections (--max-connections); retry later",
                        self.config.max_connections
                    ),
                    close: true,
                })
            }
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
pub(crate) struct Conn {
    tcp: TcpStream,
    /// Bytes already read that reads return first (see [`Conn::unread`]).
    unread: Bytes,
    slot: Slot,
    proxied: Option<Proxied>,
}

impl Conn {
    /// For a connection from a trusted proxy, what counts its requests by
    /// their forwarded client (`None` for any other connection).
    pub(crate) fn proxied(&self) -> Option<&Proxied> {
        self.proxied.as_ref()
    }

    /// Why this connection is refused (`None`: it is admitted).
    pub(crate) fn refused(&self) -> Option<&Refused> {
        match &self.slot {
            Slot::Refused { why, .. } => Some(why),
            Slot::Admitted { .. } => None,
        }
    }

    /// The socket, for writers that bypass the HTTP server.
    pub(crate) fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Puts `bytes` back: the next reads return them before anything new
    /// from the socket (so hyper can parse a request head read elsewhere).
    pub(crate) fn unread(&mut self, bytes: Bytes) {
        self.unread = bytes;
    }

    /// Takes the socket off this runtime's I/O driver (dropping any unread
    /// bytes), to be [attached](Detached::attach) on another runtime.
    ///
    /// # Errors
    /// Failing to deregister the socket.
    pub(crate) fn detach(self) -> io::Result<Detached> {
        Ok(Detached {
            tcp: self.tcp.into_std()?,
            slot: self.slot,
            proxied: self.proxied,
        })
    }
}

/// A connection between runtimes: still holding its slot, registered on none.
pub(crate) struct Detached {
    tcp: std::net::TcpStream,
    slot: Slot,
    proxied: Option<Proxied>,
}

/// What keeps a connection's place (its slot under the limits; from a
/// trusted proxy, its client's count) while a stream written straight to
/// the socket holds it: a [`Conn`] without its read-back buffer, which a
/// stream never reads (32 bytes less in every stream's task).
pub(crate) struct Place {
    _permit: OwnedSemaphorePermit,
    /// Admitted connections only (a refused one is answered, never streamed).
    _ip: IpGuard,
    _proxied: Option<Proxied>,
}

impl Detached {
    /// The socket, registered on the current runtime's I/O driver, and what
    /// keeps the connection's place: for a stream the server only writes.
    ///
    /// # Errors
    /// Failing to register the socket (outside a runtime, or out of resources).
    pub(crate) fn attach_stream(self) -> io::Result<(TcpStream, Place)> {
        Ok((
            TcpStream::from_std(self.tcp)?,
            match self.slot {
                Slot::Admitted { _permit, _ip } => Place {
                    _permit,
                    _ip,
                    _proxied: self.proxied,
                },
                Slot::Refused { _permit, .. } => Place {
                    _permit,
                    _ip: IpGuard(None),
                    _proxied: self.proxied,
                },
            },
        ))
    }
}

impl GaplessListener {
    /// Accepts the next connection: admitted within the limits, or marked
    /// [`Refused`] past them (see the module doc).
    pub(crate) async fn accept(&mut self) -> (Conn, SocketAddr) {
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
            let (slot, proxied) = match self.admit(addr.ip()) {
                Ok(admitted) => admitted,
                Err(why) => match self.refusing.clone().try_acquire_owned() {
                    Ok(permit) => (
                        Slot::Refused {
                            _permit: permit,
                            why,
                        },
                        None,
                    ),
                    // Too many refusals in flight: close without an answer.
                    Err(_) => continue,
                },
            };
            return (
                Conn {
                    tcp,
                    unread: Bytes::new(),
                    slot,
                    proxied,
                },
                addr,
            );
        }
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
