//! The lingering close: how a connection closes while its client may still
//! be sending, so the last answer is read rather than lost to a reset.
//!
//! Closing a socket with unread bytes makes the kernel send a reset instead
//! of a FIN, and a client that sees the reset while still writing (or
//! before it has read what arrived) loses the server's last answer: "other
//! side closed", "connection reset", or a WebSocket's 1006 instead of the
//! 1009 it was sent. That happens whenever the server answers before it has
//! read what the client sends: an early HTTP refusal (413 over a limit,
//! 401/403, 415, a refused head) and a WebSocket message over
//! `--ws-max-message-bytes` (closed 1009 at its header, the rest of the
//! message still coming). So a closing connection sends FIN, then reads and
//! drops what the client still sends until the client closes its side, at
//! most [`LINGER_BYTES`] and [`LINGER`], as nginx's `lingering_close` does.
//!
//! Two ways in: [`linger`], awaited by the connection's task while it still
//! holds the connection's place under `--max-connections` (every HTTP
//! connection's close); and [`on_drop`], for a socket dropped by a layer
//! that cannot await (an upgraded WebSocket's, when its task ends): when
//! bytes are still waiting, the socket lingers in a task of its own, its
//! place already released.

use crate::net::listener::Conn;
use std::io;
use std::os::fd::AsFd;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// How long a closing connection keeps reading (and dropping) what its
/// client still sends: long enough for a client on a slow link to read an
/// early answer, short enough that a client cannot hold a connection with
/// it (nginx's `lingering_time` is 30 s, its `lingering_timeout` 5 s; a
/// refusal needs far less).
pub(crate) const LINGER: Duration = Duration::from_secs(2);
/// Most bytes a closing connection reads and drops: 16 MiB, over the
/// default `--max-batch-bytes`, so a client sending a body at the size of
/// the largest limit is read to its end on a fast link and never reset.
pub(crate) const LINGER_BYTES: usize = 16 << 20;
/// The read size while lingering.
const LINGER_READ: usize = 64 << 10;

/// The lingering close of a connection whose last answer is written: sends
/// FIN, then reads and drops what the client still sends until it closes
/// its side, up to [`LINGER_BYTES`] or [`LINGER`] (or server shutdown); the
/// caller then closes the socket. The connection keeps its place under
/// `--max-connections` and `--max-connections-per-ip` while it lingers (the
/// [`Conn`] holds it), and a slow or silent client holds it at most
/// [`LINGER`].
pub(crate) async fn linger(conn: &Conn, stop: &CancellationToken) {
    tokio::select! {
        () = drain(conn.tcp()) => {}
        () = stop.cancelled() => {}
    }
}

/// For a socket about to be closed by a drop: when the client has sent
/// bytes nobody read (so the close would reset), a duplicate of the socket
/// lingers ([`drain`]) in a task of its own on the current runtime, and the
/// reset never happens (the socket closes when the duplicate does). Nothing
/// when nothing waits, when the client already closed its side, or outside
/// a runtime.
pub(crate) fn on_drop(tcp: &TcpStream) {
    let mut probe = [std::mem::MaybeUninit::<u8>::uninit()];
    // Non-blocking (tokio's sockets are): `WouldBlock` when nothing waits.
    if !matches!(socket2::SockRef::from(tcp).peek(&mut probe), Ok(n) if n > 0) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let Ok(fd) = tcp.as_fd().try_clone_to_owned() else {
        return;
    };
    runtime.spawn(async move {
        if let Ok(tcp) = TcpStream::from_std(std::net::TcpStream::from(fd)) {
            drain(&tcp).await;
        }
    });
}

/// Sends FIN, then reads and drops until the client closes its side,
/// [`LINGER_BYTES`] or [`LINGER`].
async fn drain(tcp: &TcpStream) {
    shut_write(tcp);
    let read = async {
        // Allocated only for a connection that is closing, never held by an
        // open one (a connection's future stays small).
        let mut scratch = vec![0u8; LINGER_READ];
        let mut drained = 0usize;
        while drained < LINGER_BYTES {
            if tcp.readable().await.is_err() {
                return;
            }
            match tcp.try_read(&mut scratch) {
                Ok(0) => return,
                Ok(n) => drained += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
        tracing::debug!(
            bytes = drained,
            "closing a connection that was still sending after its answer"
        );
    };
    let _ = tokio::time::timeout(LINGER, read).await;
}

/// Sends FIN: the end of a close-delimited body, or of a closing connection.
pub(crate) fn shut_write(tcp: &TcpStream) {
    let _ = socket2::SockRef::from(tcp).shutdown(std::net::Shutdown::Write);
}
