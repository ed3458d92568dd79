//! Liveness of every connection hyper serves — requests after a
//! connection's first, SSE streams opened on a keep-alive connection,
//! `/v1/ws` sockets and session consumer sockets — by the same rule as the
//! fan-out writer's streams (`tcp_info.rs`): a client whose TCP answers,
//! however slowly it reads, is kept; one that has acknowledged nothing for
//! the bound while the server waits for it is dropped.
//!
//! [`Watched`] wraps the connection's socket below hyper (and below the
//! WebSocket once upgraded), so it sees every write, whichever handler
//! makes it. While the server owes the client nothing, the socket keeps
//! `TCP_USER_TIMEOUT` (`--tcp-user-timeout-ms`, set at accept): with keepalive
//! it bounds an idle client that vanished, as before. From the moment data
//! is handed to the socket (or a write has to wait), the connection judges
//! its client itself: `TCP_USER_TIMEOUT` is cleared (since Linux 5.11 it also
//! bounds a zero window and would cut a slow reader), and every quarter of
//! the bound a timer reads the socket's `tcp_info`:
//!
//! - the client is gone ([`tcp_info::judge`](crate::net::tcp_info::judge):
//!   data unacknowledged, or two probes unanswered, and no ACK at all for the
//!   bound): the socket is reset (linger 0, which frees its unsent data) and
//!   every later read or write fails with `TimedOut`, so hyper, the SSE body
//!   or the WebSocket task ends and releases what it holds;
//! - nothing is owed (everything sent and acknowledged, no probe out): the
//!   timer stops and `TCP_USER_TIMEOUT` is set again. No window probe can be
//!   pending then, and the next write clears it again before the kernel could
//!   send one, so the kernel's zero-window clock never runs with it set;
//! - otherwise: checked again a quarter bound later.
//!
//! The check runs when the timer wakes the connection's task, which then
//! polls the socket (hyper reads a connection to notice its close, and a
//! WebSocket task always waits on its next message or a write). Cost: a
//! timer (allocated on the first write, kept for reuse) and one netlink round
//! trip per quarter bound, only while the server waits for the client; two
//! `setsockopt` calls each time a connection goes from idle to owing.
//! When `tcp_info` cannot be read (not Linux, no `inet_diag`) or the bound is
//! 0, the wrapper does nothing and the socket keeps `TCP_USER_TIMEOUT`.

use crate::net::listener::Conn;
use crate::net::tcp_info::{self, TcpInfo};
use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Who judges the client at the moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Judge {
    /// The kernel: `TCP_USER_TIMEOUT` is set; nothing is owed to the client.
    Kernel,
    /// This wrapper: `TCP_USER_TIMEOUT` is cleared and the timer runs.
    Own,
    /// Neither: `tcp_info` cannot be read here, or the bound is 0.
    Off,
    /// The client was found gone; the socket is reset.
    Gone,
}

/// How many times hyper flushed a connection with nothing left in its own
/// buffer: hyper calls the socket's `poll_flush` only once every byte it
/// holds was handed to the socket. A response body whose last bytes must
/// reach the socket before it fails (hyper drops what it still buffers when
/// a body fails: an SSE stream whose journal read failed,
/// the SSE transport's `Feed::into_body`) waits for the next
/// flush. One per connection, shared by its [`Watched`] and, as an
/// extension, by each of its requests; one body at a time waits on it
/// (HTTP/1 answers in order).
#[derive(Clone, Default)]
pub(crate) struct Flushes(std::sync::Arc<FlushesInner>);

#[derive(Default)]
struct FlushesInner {
    count: std::sync::atomic::AtomicU64,
    waker: futures::task::AtomicWaker,
}

impl Flushes {
    /// Flushes so far.
    pub(crate) fn count(&self) -> u64 {
        self.0.count.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Waits until a flush after the `seen`-th (a [`Flushes::count`]
    /// read after the body's last bytes were taken by hyper): everything
    /// hyper had then is in the socket. Forever on a connection that
    /// never flushes again (its client does not read); the caller bounds it.
    pub(crate) async fn after(&self, seen: u64) {
        std::future::poll_fn(|cx| {
            if self.count() > seen {
                return Poll::Ready(());
            }
            self.0.waker.register(cx.waker());
            if self.count() > seen {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }

    fn flushed(&self) {
        self.0
            .count
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.0.waker.wake();
    }
}

/// A connection's socket that judges its client's liveness by progress
/// (see the module doc): what hyper reads and writes.
pub(crate) struct Watched {
    conn: Conn,
    /// Counts hyper's flushes (for bodies that must know their bytes left).
    flushes: Flushes,
    /// `--tcp-user-timeout-ms`.
    bound_ms: u32,
    judge: Judge,
    /// The check timer: made on the first write, reset while [`Judge::Own`].
    timer: Option<Pin<Box<Sleep>>>,
    /// Closed by its owner with a [lingering close](crate::net::linger::linger):
    /// its drop has nothing left to do.
    lingered: bool,
}

impl Watched {
    /// The connection it watches.
    pub(crate) fn conn(&self) -> &Conn {
        &self.conn
    }

    /// The connection's flush count, for its requests.
    pub(crate) fn flushes(&self) -> Flushes {
        self.flushes.clone()
    }

    /// Wraps `conn` with `bound_ms` (`--tcp-user-timeout-ms`; 0: no bound,
    /// the wrapper does nothing).
    pub(crate) fn new(conn: Conn, bound_ms: u64) -> Self {
        Watched {
            conn,
            flushes: Flushes::default(),
            bound_ms: u32::try_from(bound_ms).unwrap_or(u32::MAX),
            judge: if bound_ms == 0 {
                Judge::Off
            } else {
                Judge::Kernel
            },
            timer: None,
            lingered: false,
        }
    }

    /// Notes that the owner closed the connection with a lingering close
    /// ([`crate::net::linger::linger`]), so its drop need not.
    pub(crate) fn lingered(&mut self) {
        self.lingered = true;
    }

    /// How often the client is checked while something is owed to it.
    fn period(&self) -> Duration {
        Duration::from_millis(u64::from(self.bound_ms / 4).max(1))
    }

    /// The socket's `tcp_info`, if it can be read.
    fn info(&self) -> io::Result<TcpInfo> {
        let tcp = self.conn.tcp();
        tcp_info::lookup(tcp.local_addr()?, tcp.peer_addr()?)
    }

    /// Data was handed to the socket, or a write waits: from now on the
    /// server waits for the client, and judges it itself.
    fn owing(&mut self, cx: &mut Context<'_>) {
        if self.judge != Judge::Kernel {
            return;
        }
        // First time: can this socket's tcp_info be read at all?
        if self.timer.is_none() && self.info().is_err() {
            self.judge = Judge::Off;
            return;
        }
        let sock = socket2::SockRef::from(self.conn.tcp());
        if sock.set_tcp_user_timeout(None).is_err() {
            return;
        }
        self.judge = Judge::Own;
        let at = Instant::now() + self.period();
        match &mut self.timer {
            Some(t) => t.as_mut().reset(at),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(at))),
        }
        self.arm(cx);
    }

    /// Registers the task to be woken by the timer.
    fn arm(&mut self, cx: &mut Context<'_>) {
        if let Some(t) = &mut self.timer {
            // A deadline already past is handled by the next `check`.
            let _ = t.as_mut().poll(cx);
        }
    }

    /// Runs the check if its time has come. `Err` once the client is gone.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.judge {
            Judge::Gone => return Err(gone()),
            Judge::Own => {}
            Judge::Kernel | Judge::Off => return Ok(()),
        }
        let Some(timer) = &mut self.timer else {
            return Ok(());
        };
        if timer.as_mut().poll(cx).is_pending() {
            return Ok(());
        }
        match self.info() {
            Ok(i) if tcp_info::judge(&i, self.bound_ms) => {
                tracing::debug!("a client stopped acknowledging: dropped");
                self.judge = Judge::Gone;
                // Reset, not FIN: the unsent data is freed at once.
                let _ = socket2::SockRef::from(self.conn.tcp()).set_linger(Some(Duration::ZERO));
                return Err(gone());
            }
            Ok(i) if i.unacked == 0 && i.notsent == 0 && i.probes == 0 => {
                let sock = socket2::SockRef::from(self.conn.tcp());
                let bound = Duration::from_millis(u64::from(self.bound_ms));
                if sock.set_tcp_user_timeout(Some(bound)).is_ok() {
                    self.judge = Judge::Kernel;
                    return Ok(());
                }
            }
            // Still owed (or unreadable for a moment): look again later.
            Ok(_) | Err(_) => {}
        }
        let at = Instant::now() + self.period();
        if let Some(t) = &mut self.timer {
            t.as_mut().reset(at);
        }
        self.arm(cx);
        Ok(())
    }

    /// After a write's outcome: data handed over, or a wait, means owing.
    fn wrote<T>(&mut self, cx: &mut Context<'_>, r: &Poll<io::Result<T>>, n: impl Fn(&T) -> bool) {
        match r {
            Poll::Pending => self.owing(cx),
            Poll::Ready(Ok(v)) if n(v) => self.owing(cx),
            Poll::Ready(_) => {}
        }
    }
}

fn gone() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the client acknowledged nothing for --tcp-user-timeout-ms while the server waited for it",
    )
}

/// A connection dropped by a layer above (an upgraded WebSocket's, when its
/// task ends) closes without a reset while its client is still sending
/// ([`crate::net::linger::on_drop`]); one its owner closed already, or
/// found gone and reset on purpose, closes as it is.
impl Drop for Watched {
    fn drop(&mut self) {
        if !self.lingered && self.judge != Judge::Gone {
            crate::net::linger::on_drop(self.conn.tcp());
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.conn).poll_read(cx, buf)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        let r = Pin::new(&mut self.conn).poll_write(cx, buf);
        self.wrote(cx, &r, |n| *n > 0);
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        let r = Pin::new(&mut self.conn).poll_write_vectored(cx, bufs);
        self.wrote(cx, &r, |n| *n > 0);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.conn.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        let r = Pin::new(&mut self.conn).poll_flush(cx);
        if matches!(r, Poll::Ready(Ok(()))) {
            self.flushes.flushed();
        }
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.conn).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::listener::GaplessListener;
    use crate::ServerConfig;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn user_timeout(w: &Watched) -> Option<Duration> {
        socket2::SockRef::from(w.conn.tcp())
            .tcp_user_timeout()
            .expect("TCP_USER_TIMEOUT")
    }

    /// A write hands the judging to the connection (the user timeout is
    /// cleared); once the client has read and acknowledged everything, the
    /// next check hands it back to the kernel (the user timeout is set again).
    #[tokio::test]
    async fn owing_clears_the_user_timeout_and_nothing_owed_sets_it_again() {
        let config = ServerConfig {
            tcp_user_timeout_ms: 400,
            ..ServerConfig::default()
        };
        let inner = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = inner.local_addr().expect("addr");
        let mut listener = GaplessListener::new(inner, config);
        let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (conn, _) = listener.accept().await;
        let mut w = Watched::new(conn, 400);
        let bound = Some(Duration::from_millis(400));
        assert_eq!(user_timeout(&w), bound, "set at accept");
        w.write_all(b"hello").await.expect("write");
        if w.judge == Judge::Off {
            eprintln!("SKIP: no sock_diag here");
            return;
        }
        assert_eq!(w.judge, Judge::Own);
        assert_eq!(
            user_timeout(&w),
            None,
            "cleared while the client owes an answer"
        );
        let mut got = [0u8; 5];
        client.read_exact(&mut got).await.expect("read");
        // The check runs when the timer (a quarter bound) wakes a read.
        let mut buf = [0u8; 8];
        let _ = tokio::time::timeout(Duration::from_millis(300), w.read(&mut buf)).await;
        assert_eq!(w.judge, Judge::Kernel);
        assert_eq!(user_timeout(&w), bound, "set again once nothing is owed");
        // A live client is never judged gone, and the connection still works.
        client.write_all(b"ping").await.expect("client write");
        let n = w.read(&mut buf).await.expect("read");
        assert_eq!(&buf[..n], b"ping");
    }
}
