//! The client address behind a trusted reverse proxy (`--trusted-proxy`,
//! `--forwarded-header`; docs/deploy.md, "Behind a reverse proxy").
//!
//! A request from a peer inside one of the trusted networks names its client
//! in `X-Forwarded-For` (the default) or `Forwarded` (RFC 7239 §4, its `for=`
//! parameters): a list of addresses, each hop appending the address it
//! received the request from. The client is the **rightmost address that is
//! not itself trusted**: everything left of it was written by parties gapless
//! cannot vouch for (a client may send any `X-Forwarded-For` it likes, and a
//! proxy appends to it). If every listed address is trusted, the leftmost is
//! the client. An entry that is not an address (`unknown`, an obfuscated
//! `_node`, garbage) stops the walk: the client is then the trusted hop that
//! wrote it (the peer itself when it is the rightmost entry), so a malformed
//! header never lets a request pose as another client. Only one header is
//! read: a proxy that writes `X-Forwarded-For` usually passes a client's own
//! `Forwarded` through untouched, and the other way round.

pub use crate::config::{ForwardedHeader, TrustedProxies};
use axum::http::HeaderMap;
pub use ipnet::IpNet;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

impl ForwardedHeader {
    /// The header's name, lower case.
    pub fn name(self) -> &'static str {
        match self {
            ForwardedHeader::XForwardedFor => "x-forwarded-for",
            ForwardedHeader::Forwarded => "forwarded",
        }
    }
}

impl TrustedProxies {
    /// Whether `ip` is inside a trusted network (an IPv4-mapped IPv6
    /// address counts as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|n| n.contains(&ip))
    }

    /// Whether any network is trusted.
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    /// The client of a request from the trusted peer `peer` with `headers`
    /// (see the module doc for the rule).
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut chain = Vec::new();
        for value in headers.get_all(self.header.name()) {
            match value.to_str() {
                Ok(text) => match self.header {
                    ForwardedHeader::XForwardedFor => chain.extend(x_forwarded_for(text)),
                    ForwardedHeader::Forwarded => chain.extend(forwarded_for(text)),
                },
                // Not text: one entry that is not an address.
                Err(_) => chain.push(None),
            }
        }
        let mut client = peer.to_canonical();
        for hop in chain.iter().rev() {
            match hop {
                Some(ip) => {
                    client = ip.to_canonical();
                    if !self.contains(client) {
                        return client;
                    }
                }
                None => return client,
            }
        }
        client
    }
}

/// Parses a `--trusted-proxy` value: a network in CIDR notation
/// (`10.0.0.0/8`, `fd00::/8`) or one address (`192.0.2.7`, a /32 or /128).
///
/// # Errors
/// A message saying what was expected.
pub fn parse_net(s: &str) -> Result<IpNet, String> {
    let s = s.trim();
    if let Ok(net) = IpNet::from_str(s) {
        return canonical_net(net.trunc(), s);
    }
    if let Ok(ip) = IpAddr::from_str(s) {
        return Ok(IpNet::from(ip.to_canonical()));
    }
    Err(format!(
        "`{s}` is not a network in CIDR notation (e.g. 10.0.0.0/8, 192.0.2.7/32, fd00::/8) or an IP address"
    ))
}

/// `net` with an IPv4-mapped IPv6 network (`::ffff:127.0.0.1/128`,
/// `::ffff:10.0.0.0/104`) written as the IPv4 network it maps
/// (`127.0.0.1/32`, `10.0.0.0/8`): peers are compared in their canonical
/// form ([`TrustedProxies::contains`]), so the mapped spelling would never
/// match. (A truncated network shorter than /96 is never mapped: its bits
/// 80 to 95 are not all kept.) `s`: the value as given, for the error.
fn canonical_net(net: IpNet, s: &str) -> Result<IpNet, String> {
    let IpNet::V6(v6) = net else {
        return Ok(net);
    };
    let (IpAddr::V4(v4), Some(len)) = (
        IpAddr::V6(v6.network()).to_canonical(),
        v6.prefix_len().checked_sub(96),
    ) else {
        return Ok(net);
    };
    ipnet::Ipv4Net::new(v4, len)
        .map(IpNet::V4)
        .map_err(|e| format!("`{s}`: {e}"))
}

/// The addresses of an `X-Forwarded-For` value, left to right (`None` for an
/// entry that is not one). Entries may carry a port (`192.0.2.1:4711`,
/// `[2001:db8::1]:4711`) or brackets.
fn x_forwarded_for(text: &str) -> impl Iterator<Item = Option<IpAddr>> + '_ {
    text.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(node)
}

/// The `for=` addresses of a `Forwarded` value (RFC 7239 §4), left to right;
/// an element without `for=`, or whose node is `unknown`, obfuscated or not
/// an address, is `None`.
fn forwarded_for(text: &str) -> Vec<Option<IpAddr>> {
    split_outside_quotes(text, ',')
        .into_iter()
        .filter(|e| !e.trim().is_empty())
        .map(|element| {
            split_outside_quotes(element, ';')
                .into_iter()
                .find_map(|pair| {
                    let (name, value) = pair.split_once('=')?;
                    name.trim()
                        .eq_ignore_ascii_case("for")
                        .then(|| value.trim())
                })
                .and_then(|value| {
                    let value = value
                        .strip_prefix('"')
                        .and_then(|v| v.strip_suffix('"'))
                        .unwrap_or(value);
                    node(value)
                })
        })
        .collect()
}

/// `text` split at `sep` where it is not inside a quoted string.
fn split_outside_quotes(text: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut quoted = false;
    let mut escaped = false;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(&text[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// One node: an address, with or without a port and brackets.
fn node(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = IpAddr::from_str(s) {
        return Some(ip);
    }
    if let Ok(sa) = SocketAddr::from_str(s) {
        return Some(sa.ip());
    }
    let inner = s.strip_prefix('[')?.strip_suffix(']')?;
    IpAddr::from_str(inner).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn trusted(nets: &[&str], header: ForwardedHeader) -> TrustedProxies {
        TrustedProxies {
            nets: nets.iter().map(|n| parse_net(n).expect("net")).collect(),
            header,
        }
    }

    fn client(t: &TrustedProxies, peer: &str, values: &[&[u8]]) -> String {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(
                t.header.name(),
                HeaderValue::from_bytes(v).expect("header value"),
            );
        }
        t.client(peer.parse().expect("peer"), &headers).to_string()
    }

    #[test]
    fn the_rightmost_untrusted_address_is_the_client() {
        let t = trusted(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        let peer = "10.0.0.1";
        assert_eq!(client(&t, peer, &[]), "10.0.0.1", "no header: the peer");
        assert_eq!(client(&t, peer, &[b"203.0.113.9"]), "203.0.113.9");
        // A client's own (spoofed) entries are left of the one the proxy added.
        assert_eq!(
            client(&t, peer, &[b"1.1.1.1, 203.0.113.9, 10.0.0.2"]),
            "203.0.113.9"
        );
        // Header lines are one list, in order.
        assert_eq!(
            client(&t, peer, &[b"1.1.1.1", b"203.0.113.9"]),
            "203.0.113.9"
        );
        // Every entry trusted: the leftmost.
        assert_eq!(client(&t, peer, &[b"10.1.1.1, 10.2.2.2"]), "10.1.1.1");
        // Ports and brackets.
        assert_eq!(client(&t, peer, &[b"198.51.100.1:4711"]), "198.51.100.1");
        assert_eq!(client(&t, peer, &[b"[2001:db8::1]:4711"]), "2001:db8::1");
        assert_eq!(client(&t, peer, &[b"[2001:db8::1]"]), "2001:db8::1");
        assert_eq!(client(&t, peer, &[b"2001:db8::1"]), "2001:db8::1");
        // An IPv4-mapped peer is its IPv4 address.
        assert_eq!(client(&t, "::ffff:10.0.0.1", &[]), "10.0.0.1");
    }

    #[test]
    fn a_malformed_entry_stops_at_the_hop_that_wrote_it() {
        let t = trusted(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        let peer = "10.0.0.1";
        assert_eq!(client(&t, peer, &[b"garbage"]), "10.0.0.1");
        assert_eq!(client(&t, peer, &[b"203.0.113.9, garbage"]), "10.0.0.1");
        assert_eq!(
            client(&t, peer, &[b"203.0.113.9, unknown, 10.0.0.7"]),
            "10.0.0.7"
        );
        assert_eq!(client(&t, peer, &[b"garbage, 203.0.113.9"]), "203.0.113.9");
        assert_eq!(client(&t, peer, &[b"", b" , "]), "10.0.0.1");
        assert_eq!(client(&t, peer, &[b"\xff\xfe"]), "10.0.0.1");
        assert_eq!(client(&t, peer, &[b"999.1.1.1"]), "10.0.0.1");
    }

    #[test]
    fn forwarded_reads_for_parameters() {
        let t = trusted(&["10.0.0.0/8"], ForwardedHeader::Forwarded);
        let peer = "10.0.0.1";
        assert_eq!(
            client(&t, peer, &[b"for=192.0.2.60;proto=http;by=203.0.113.43"]),
            "192.0.2.60"
        );
        assert_eq!(
            client(
                &t,
                peer,
                &[b"for=1.1.1.1, For=\"[2001:db8:cafe::17]:4711\""]
            ),
            "2001:db8:cafe::17"
        );
        assert_eq!(
            client(&t, peer, &[b"for=192.0.2.43, for=10.9.9.9"]),
            "192.0.2.43"
        );
        assert_eq!(client(&t, peer, &[b"for=unknown"]), "10.0.0.1");
        assert_eq!(
            client(&t, peer, &[b"for=_hidden, for=10.3.3.3"]),
            "10.3.3.3"
        );
        assert_eq!(client(&t, peer, &[b"proto=https"]), "10.0.0.1");
        assert_eq!(
            client(&t, peer, &[b"for=\"192.0.2.1\";by=\"a,b\""]),
            "192.0.2.1"
        );
        // The other header is not read.
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", HeaderValue::from_static("192.0.2.9"));
        assert_eq!(
            t.client(peer.parse().expect("peer"), &headers).to_string(),
            "10.0.0.1"
        );
    }

    #[test]
    fn networks_parse_with_or_without_a_prefix() {
        assert_eq!(
            parse_net("127.0.0.1/32").expect("net").to_string(),
            "127.0.0.1/32"
        );
        assert_eq!(
            parse_net("10.1.2.3/8").expect("net").to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(
            parse_net("192.0.2.7").expect("net").to_string(),
            "192.0.2.7/32"
        );
        assert_eq!(parse_net("fd00::/8").expect("net").to_string(), "fd00::/8");
        // IPv4-mapped spellings become the IPv4 network (peers are compared
        // canonical), and match an IPv4 peer.
        assert_eq!(
            parse_net("::ffff:127.0.0.1").expect("net").to_string(),
            "127.0.0.1/32"
        );
        assert_eq!(
            parse_net("::ffff:10.1.2.3/104").expect("net").to_string(),
            "10.0.0.0/8"
        );
        let t = TrustedProxies {
            nets: vec![parse_net("::ffff:127.0.0.1/128").expect("net")],
            header: ForwardedHeader::XForwardedFor,
        };
        assert!(t.contains("127.0.0.1".parse().expect("ip")));
        assert!(t.contains("::ffff:127.0.0.1".parse().expect("ip")));
        assert_eq!(parse_net("::/0").expect("net").to_string(), "::/0");
        assert!(parse_net("10.0.0.0/33").is_err());
        assert!(parse_net("proxy.example").is_err());
    }
}
