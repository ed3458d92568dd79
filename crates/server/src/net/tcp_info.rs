//! The kernel's view of one TCP connection (`struct tcp_info`, Linux), read
//! to judge whether a streaming client is still there.
//!
//! `getsockopt(TCP_INFO)` has no safe binding in the crates we use (socket2,
//! rustix, nix), and the workspace forbids unsafe code, so this reads the
//! same structure the way `ss -ti` does: a `NETLINK_SOCK_DIAG` request
//! (`SOCK_DIAG_BY_FAMILY`, one exact 4-tuple, the `INET_DIAG_INFO`
//! extension) on a netlink socket made with socket2. The kernel answers
//! within the `send`, so a lookup costs two system calls and no allocation
//! beyond a per-thread socket and buffer.
//!
//! Why the server needs it: since Linux 5.11 `TCP_USER_TIMEOUT` also bounds
//! a zero window, counted from the first window probe whether or not probes
//! are answered, so the timer alone cuts a live client that reads slowly
//! (`docs/reliability.md`). [`Peer::dead`] tells a slow reader (its TCP
//! answers, however late its data is read) from a vanished one.

use socket2::{Domain, Protocol, Socket, Type};
use std::cell::RefCell;
use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

const NETLINK_SOCK_DIAG: i32 = 4;
const AF_NETLINK: i32 = 16;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const INET_DIAG_INFO: u16 = 2;
const IPPROTO_TCP: u8 = 6;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
/// `nlmsghdr` (16 bytes) + `inet_diag_req_v2` (56 bytes).
const REQUEST_LEN: usize = 72;
/// `nlmsghdr` (16 bytes) + `inet_diag_msg` (72 bytes): where attributes start.
const ATTRS_AT: usize = 88;

/// What [`lookup`] read of one connection's `tcp_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TcpInfo {
    /// Segments sent and not yet acknowledged (`tcpi_unacked`).
    pub unacked: u32,
    /// Window or keepalive probes sent and not answered (`tcpi_probes`).
    pub probes: u8,
    /// Retransmissions of the oldest unacknowledged segment (`tcpi_retransmits`).
    pub retransmits: u8,
    /// Milliseconds since the peer's last ACK, an answer to a probe included
    /// (`tcpi_last_ack_recv`).
    pub last_ack_recv_ms: u32,
    /// Bytes the peer has acknowledged (`tcpi_bytes_acked`, Linux 4.1+; 0 before).
    pub bytes_acked: u64,
    /// Bytes written but not yet sent (`tcpi_notsent_bytes`, Linux 4.6+; 0
    /// before): waiting for the peer's window.
    pub notsent: u32,
}

thread_local! {
    /// One netlink socket and answer buffer per thread, made on first use.
    static DIAG: RefCell<Option<(Socket, Vec<u8>)>> = const { RefCell::new(None) };
    /// The seq of this thread's last request.
    static SEQ: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Reads the `tcp_info` of the connection from `local` to `peer` (the
/// server's socket: `local` is its own address).
///
/// # Errors
/// The netlink socket could not be made or used (not Linux, or no
/// `inet_diag` support), the kernel refused the request, or no such
/// connection exists (`NotFound`, for example once it has closed).
pub(crate) fn lookup(local: SocketAddr, peer: SocketAddr) -> io::Result<TcpInfo> {
    DIAG.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            let s = Socket::new(
                Domain::from(AF_NETLINK),
                Type::DGRAM,
                Some(Protocol::from(NETLINK_SOCK_DIAG)),
            )?;
            s.set_read_timeout(Some(Duration::from_millis(200)))?;
            *cell = Some((s, vec![0u8; 8192]));
        }
        let Some((sock, buf)) = cell.as_mut() else {
            return Err(io::Error::other("no sock_diag socket"));
        };
        let seq = SEQ.with(|c| {
            let n = c.get().wrapping_add(1);
            c.set(n);
            n
        });
        let mut req = request(local, peer)?;
        req[8..12].copy_from_slice(&seq.to_ne_bytes());
        // The kernel is the default destination of an unconnected netlink socket.
        sock.send(&req)?;
        // The answer carries the request's seq; skip a late answer to an earlier one.
        for _ in 0..4 {
            let n = (&*sock).read(buf)?;
            if u32_at(&buf[..n], 8) == Some(seq) {
                return parse(&buf[..n]);
            }
        }
        Err(io::Error::other("no sock_diag answer to this request"))
    })
}

fn request(local: SocketAddr, peer: SocketAddr) -> io::Result<[u8; REQUEST_LEN]> {
    let mut r = [0u8; REQUEST_LEN];
    r[0..4].copy_from_slice(&(REQUEST_LEN as u32).to_ne_bytes());
    r[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    r[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    // seq (8..12) and pid (12..16) stay 0.
    let family = match (local.ip(), peer.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => AF_INET,
        (IpAddr::V6(_), IpAddr::V6(_)) => AF_INET6,
        _ => return Err(io::Error::other("mixed address families")),
    };
    r[16] = family;
    r[17] = IPPROTO_TCP;
    r[18] = 1 << (INET_DIAG_INFO - 1);
    // states: all.
    r[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
    // inet_diag_sockid: sport, dport (network order), src[16], dst[16], if, cookie[2].
    r[24..26].copy_from_slice(&local.port().to_be_bytes());
    r[26..28].copy_from_slice(&peer.port().to_be_bytes());
    put_ip(&mut r[28..44], local.ip());
    put_ip(&mut r[44..60], peer.ip());
    // No cookie check (INET_DIAG_NOCOOKIE).
    r[64..72].copy_from_slice(&[0xff; 8]);
    Ok(r)
}

fn put_ip(out: &mut [u8], ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out.copy_from_slice(&v6.octets()),
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The `tcp_info` in one answer to [`request`].
fn parse(msg: &[u8]) -> io::Result<TcpInfo> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "short sock_diag answer");
    let len = u32_at(msg, 0).ok_or_else(bad)? as usize;
    let msg = msg.get(..len).ok_or_else(bad)?;
    if u16_at(msg, 4) == Some(NLMSG_ERROR) {
        let errno = u32_at(msg, 16).ok_or_else(bad)? as i32;
        return Err(io::Error::from_raw_os_error(-errno));
    }
    let mut at = ATTRS_AT;
    while let (Some(alen), Some(kind)) = (u16_at(msg, at), u16_at(msg, at + 2)) {
        let alen = usize::from(alen);
        if alen < 4 {
            break;
        }
        if kind == INET_DIAG_INFO {
            let info = msg.get(at + 4..at + alen).ok_or_else(bad)?;
            return Ok(TcpInfo {
                retransmits: *info.get(2).ok_or_else(bad)?,
                probes: *info.get(3).ok_or_else(bad)?,
                unacked: u32_at(info, 24).ok_or_else(bad)?,
                last_ack_recv_ms: u32_at(info, 56).ok_or_else(bad)?,
                bytes_acked: u64_at(info, 120).unwrap_or(0),
                notsent: u32_at(info, 144).unwrap_or(0),
            });
        }
        at += (alen + 3) & !3;
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "no tcp_info in the sock_diag answer",
    ))
}

/// A connection whose liveness the server judges itself: its addresses and
/// the bound (`--tcp-user-timeout-ms`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer {
    local: SocketAddr,
    peer: SocketAddr,
    bound_ms: u32,
}

impl Peer {
    /// Takes over liveness of `tcp` from `TCP_USER_TIMEOUT`: if its
    /// `tcp_info` can be read, clears the socket's user timeout (so the
    /// kernel keeps a zero window open for as long as the client answers
    /// window probes) and returns the handle to judge it with [`Peer::dead`].
    /// `None` (the timeout stays, as set at accept) when `bound_ms` is 0 or
    /// `tcp_info` cannot be read here.
    pub(crate) fn take_over(tcp: &tokio::net::TcpStream, bound_ms: u64) -> Option<Peer> {
        let peer = Peer::of(tcp, bound_ms)?;
        lookup(peer.local, peer.peer).ok()?;
        socket2::SockRef::from(tcp)
            .set_tcp_user_timeout(None)
            .ok()?;
        Some(peer)
    }

    /// The handle of `tcp` with `bound_ms`, to read its `tcp_info` (the
    /// socket is left as it is: for a connection whose writes are judged by
    /// [`crate::net::liveness::Watched`]). `None` when `bound_ms` is 0 or the
    /// socket has no addresses.
    pub(crate) fn of(tcp: &tokio::net::TcpStream, bound_ms: u64) -> Option<Peer> {
        if bound_ms == 0 {
            return None;
        }
        Some(Peer {
            local: tcp.local_addr().ok()?,
            peer: tcp.peer_addr().ok()?,
            bound_ms: u32::try_from(bound_ms).unwrap_or(u32::MAX),
        })
    }

    /// [`Peer::take_over`] for a writer that holds the socket: only the bound
    /// is kept (4 bytes in the stream's task; the addresses are read from the
    /// socket at each check). `None` as for [`Peer::take_over`].
    pub(crate) fn take_over_bound(tcp: &tokio::net::TcpStream, bound_ms: u64) -> Option<Bound> {
        Peer::take_over(tcp, bound_ms).map(|p| Bound(p.bound_ms))
    }

    /// Whether the client is gone: the server waits for an answer from it
    /// (data sent and not acknowledged, or at least two window or keepalive
    /// probes unanswered) and its TCP has sent no ACK at all for the bound.
    /// A client that reads slowly, however slowly, answers window probes and
    /// stays; one that vanished answers nothing. `false` when `tcp_info`
    /// cannot be read (the connection is then judged by its next write).
    pub(crate) fn dead(&self) -> bool {
        match lookup(self.local, self.peer) {
            Ok(i) => self.judge(&i),
            Err(_) => false,
        }
    }

    /// The rule of [`Peer::dead`] on a reading already made.
    pub(crate) fn judge(&self, i: &TcpInfo) -> bool {
        judge(i, self.bound_ms)
    }

    /// The server's address of the connection.
    pub(crate) fn local(&self) -> SocketAddr {
        self.local
    }

    /// The client's address of the connection.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }
}

/// The liveness bound of a socket taken over with [`Peer::take_over_bound`],
/// in milliseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bound(u32);

impl Bound {
    /// [`Peer::dead`] for `tcp`, the socket this bound was taken from.
    pub(crate) fn dead(self, tcp: &tokio::net::TcpStream) -> bool {
        match (tcp.local_addr(), tcp.peer_addr()) {
            (Ok(local), Ok(peer)) => Peer {
                local,
                peer,
                bound_ms: self.0,
            }
            .dead(),
            // Not connected any more: the next write reports it.
            _ => false,
        }
    }
}

/// The rule of [`Peer::dead`] on one reading, with the bound in
/// milliseconds: the server waits for an answer (data unacknowledged, or
/// two probes unanswered) and the client's TCP has acknowledged nothing for
/// the bound.
pub(crate) fn judge(i: &TcpInfo, bound_ms: u32) -> bool {
    // One probe may be in flight to a live peer (its answer is a round trip
    // away); two unanswered probes are not.
    let owed = i.unacked > 0 || i.probes >= 2;
    owed && i.last_ack_recv_ms >= bound_ms
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_its_own_connection_and_sees_acknowledged_bytes() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut client =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        let before = match lookup(
            server.local_addr().expect("local"),
            server.peer_addr().expect("peer"),
        ) {
            Ok(i) => i,
            Err(e) => {
                eprintln!("SKIP: no sock_diag here: {e}");
                return;
            }
        };
        (&server).write_all(&[7u8; 1000]).expect("write");
        let mut got = [0u8; 1000];
        client.read_exact(&mut got).expect("read");
        std::thread::sleep(Duration::from_millis(50));
        let after = lookup(
            server.local_addr().expect("local"),
            server.peer_addr().expect("peer"),
        )
        .expect("lookup");
        assert!(
            after.bytes_acked >= before.bytes_acked + 1000,
            "{before:?} → {after:?}"
        );
        assert_eq!(after.unacked, 0);
        assert!(after.last_ack_recv_ms < 5000, "{after:?}");
        assert!(!judge(&after, 1));
        // The client's own side is another socket; a closed one is not found.
        drop(server);
        drop(client);
        std::thread::sleep(Duration::from_millis(50));
    }

    #[test]
    fn the_rule_needs_an_owed_answer_and_silence_for_the_bound() {
        let base = TcpInfo {
            unacked: 0,
            probes: 0,
            retransmits: 0,
            last_ack_recv_ms: 60_000,
            bytes_acked: 0,
            notsent: 0,
        };
        // Idle and quiet: nothing owed (keepalive judges it).
        assert!(!judge(&base, 30_000));
        // Data unacknowledged for the bound: gone.
        assert!(judge(&TcpInfo { unacked: 1, ..base }, 30_000));
        assert!(!judge(
            &TcpInfo {
                unacked: 1,
                last_ack_recv_ms: 29_999,
                ..base
            },
            30_000
        ));
        // A zero window: one probe in flight is not an unanswered probe.
        assert!(!judge(&TcpInfo { probes: 1, ..base }, 30_000));
        assert!(judge(&TcpInfo { probes: 2, ..base }, 30_000));
    }

    #[test]
    fn an_error_answer_is_an_error() {
        let mut msg = vec![0u8; 36];
        msg[0..4].copy_from_slice(&36u32.to_ne_bytes());
        msg[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        msg[16..20].copy_from_slice(&(-2i32).to_ne_bytes());
        let e = parse(&msg).expect_err("ENOENT");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(parse(&[1, 2]).is_err());
    }
}
