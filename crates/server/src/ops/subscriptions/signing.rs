//! The rules of outgoing webhooks of Durable Streams subscriptions
//! (PROTOCOL.md 6.2, 6.5, 7.1, 12.8, 12.10): the server's Ed25519 signing
//! key and its JWK Set, the `Webhook-Signature` header, the SSRF rule for
//! webhook URLs and the retry backoff. The request itself is the Durable
//! Streams room's (`transport/ds/webhook.rs`, a [`super::Poster`]), which
//! checks each resolved address with [`internal`].
//!
//! The signing key comes from a file (`--ds-signing-key`, by default
//! `ds-signing-key.pem` in the data directory, made at the first start;
//! read by [`crate::config::DsSigningKey`]), so the JWK Set stays the same
//! across restarts and every node given the same file publishes the same
//! one. A server without a key file (`--memory`, or cluster mode without the
//! setting) makes one per process (docs/durable-streams.md, "Subscriptions").

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signer as _, SigningKey};
use sha2::{Digest as _, Sha256};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// The server's webhook signing key (Ed25519) and its key id.
#[derive(Debug)]
pub struct Signer {
    key: SigningKey,
    /// `ds_` then the RFC 7638 JWK thumbprint (SHA-256, base64url) of the
    /// public key: stable for the key's life, derived from key material as
    /// PROTOCOL.md 6.5 recommends.
    pub kid: String,
    /// The public key, base64url without padding (the JWK's `x`).
    x: String,
}

impl Signer {
    /// A fresh key from the operating system's random source.
    pub fn generate() -> Self {
        Self::from_bytes(&rand::random::<[u8; 32]>())
    }

    /// The key whose 32-byte Ed25519 seed is `seed` (RFC 8032).
    pub fn from_bytes(seed: &[u8; 32]) -> Self {
        let key = SigningKey::from_bytes(seed);
        let x = URL_SAFE_NO_PAD.encode(key.verifying_key().to_bytes());
        // RFC 7638: the required members in lexicographic order, no spaces.
        let canonical = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#);
        let kid = format!(
            "ds_{}",
            URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()))
        );
        Signer { key, kid, x }
    }

    /// The `Webhook-Signature` value for `body` sent at Unix second `t`:
    /// `t=<t>,kid=<kid>,ed25519=<base64url signature>`, the signature over
    /// `<t>.<body>` (PROTOCOL.md 7.1).
    pub fn signature(&self, t: u64, body: &[u8]) -> String {
        let mut msg = format!("{t}.").into_bytes();
        msg.extend_from_slice(body);
        let sig = self.key.sign(&msg);
        format!(
            "t={t},kid={},ed25519={}",
            self.kid,
            URL_SAFE_NO_PAD.encode(sig.to_bytes())
        )
    }

    /// The JWK Set served at `__ds/jwks.json` (PROTOCOL.md 6.5).
    pub fn jwks(&self) -> serde_json::Value {
        serde_json::json!({
            "keys": [{
                "kty": "OKP",
                "crv": "Ed25519",
                "kid": self.kid,
                "use": "sig",
                "alg": "EdDSA",
                "x": self.x,
            }]
        })
    }
}

/// Whether `host` is a loopback name or address: `localhost` (or a name
/// under `.localhost`), `127.0.0.0/8`, `::1`.
fn loopback_host(host: &url::Host<&str>) -> bool {
    match host {
        url::Host::Domain(d) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            d == "localhost" || d.ends_with(".localhost")
        }
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    }
}

/// Whether `ip` is not a public internet address: loopback, private
/// (RFC 1918, IPv6 unique local), link-local, shared (100.64/10),
/// unspecified, broadcast, multicast, documentation, benchmarking or
/// reserved ranges, and IPv6 forms that reach an IPv4 address inside
/// (mapped `::ffff:0:0/96`, the deprecated compatible `::/96`, 6to4
/// `2002::/16`, NAT64 `64:ff9b::/96`) when that address is internal; 6to4
/// and compatible forms are refused whatever they embed.
pub fn internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return internal_v4(v4);
            }
            let s = v6.segments();
            // `::a.b.c.d` (RFC 4291 2.5.5.1, deprecated) and 6to4
            // `2002:AABB:CCDD::/48` (RFC 3056) carry an IPv4 address that
            // some stacks and relays reach: never a webhook target.
            let compatible = s[..6].iter().all(|&x| x == 0) && (s[6] != 0 || s[7] > 1);
            let six_to_four = s[0] == 0x2002;
            compatible
                || six_to_four
                || v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // fc00::/7 unique local
                || (s[0] & 0xffc0) == 0xfe80 // fe80::/10 link-local
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
                || (s[0] == 0x0064 && s[1] == 0xff9b) // NAT64 (reaches IPv4 inside)
        }
    }
}

fn internal_v4(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || o[0] == 0
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // 100.64.0.0/10 shared
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // 192.0.0.0/24
        || (o[0] == 198 && (o[1] & 0xfe) == 18) // 198.18.0.0/15 benchmarking
        || o[0] >= 240 // reserved
}

/// Checks a webhook URL when a subscription is created (PROTOCOL.md 6.2 and
/// 12.8): an absolute `https://` URL without credentials whose host is not
/// an internal address. Loopback targets (`localhost`, `127.0.0.0/8`,
/// `::1`, over `http://` or `https://`) are the development exception and
/// pass only with `allow_loopback` (`--ds-webhook-allow-loopback`). A host
/// name is checked again at each delivery, on the addresses it resolves to.
///
/// # Errors
/// A message saying what is wrong with the URL.
pub fn check_url(raw: &str, allow_loopback: bool) -> Result<url::Url, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("{raw:?} is not an absolute URL: {e}"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err("a webhook URL must not carry credentials".into());
    }
    let host = url.host().ok_or_else(|| format!("{raw:?} has no host"))?;
    if loopback_host(&host) {
        if allow_loopback && matches!(url.scheme(), "http" | "https") {
            return Ok(url);
        }
        return Err(format!(
            "{raw:?} targets this machine (loopback); allowed only with \
             --ds-webhook-allow-loopback (development)"
        ));
    }
    if url.scheme() != "https" {
        return Err(format!("{raw:?} must use https://"));
    }
    let ip = match host {
        url::Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
        url::Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
        url::Host::Domain(_) => None,
    };
    if let Some(ip) = ip.filter(|ip| internal(*ip)) {
        return Err(format!(
            "{raw:?} targets {ip}, an internal network address (RFC 1918, link-local, \
             loopback or reserved)"
        ));
    }
    Ok(url)
}

/// The delay before retry number `attempt` (1, 2, …) of a failed webhook:
/// 1 s doubling up to 60 s, with up to 20 % jitter either way (PROTOCOL.md 7.1).
pub fn backoff(attempt: u32) -> Duration {
    let base = 1000u64
        .saturating_mul(1 << attempt.saturating_sub(1).min(6))
        .min(60_000);
    let jitter = rand::random_range(0.8..=1.2);
    Duration::from_millis((base as f64 * jitter) as u64)
}

/// An IPv6 address from text, for the tests of [`internal`].
#[cfg(test)]
fn v6(s: &str) -> std::net::Ipv6Addr {
    s.parse().expect("an IPv6 address")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_refused_and_public_ones_pass() {
        for bad in [
            "http://10.0.0.1/hook",
            "https://10.0.0.1/hook",
            "https://192.168.1.1/",
            "https://172.16.0.5/",
            "https://169.254.169.254/latest/meta-data",
            "https://[fd00::1]/",
            "https://[::ffff:10.0.0.1]/",
            "https://[2002:7f00:1::]/",
            "https://[::127.0.0.1]/",
            "https://[::10.0.0.1]/",
            "https://100.64.0.1/",
            "https://0.0.0.0/",
            "http://example.com/hook",
            "https://user:pw@example.com/",
            "http://127.0.0.1:9/hook",
            "http://localhost/hook",
            "not a url",
        ] {
            assert!(check_url(bad, false).is_err(), "{bad} is refused");
        }
        assert!(check_url("https://example.com/hook", false).is_ok());
        assert!(check_url("https://93.184.216.34/hook", false).is_ok());
        assert!(check_url("http://127.0.0.1:9/hook", true).is_ok());
        assert!(check_url("http://localhost:9/hook", true).is_ok());
        assert!(check_url("http://10.0.0.1/hook", true).is_err());
        assert!(internal(IpAddr::V6(v6("fe80::1"))));
        assert!(!internal(IpAddr::V6(v6("2606:4700::1111"))));
    }

    #[test]
    fn signatures_verify_with_the_published_key() {
        use ed25519_dalek::{Signature, Verifier as _, VerifyingKey};
        let s = Signer::generate();
        assert!(s.kid.starts_with("ds_"));
        let header = s.signature(1_700_000_000, b"{\"a\":1}");
        let sig = header.rsplit("ed25519=").next().expect("a signature");
        let sig = URL_SAFE_NO_PAD.decode(sig).expect("base64url");
        let x = s.jwks()["keys"][0]["x"].as_str().expect("x").to_owned();
        let pk: [u8; 32] = URL_SAFE_NO_PAD
            .decode(x)
            .expect("base64url")
            .try_into()
            .expect("32 bytes");
        let pk = VerifyingKey::from_bytes(&pk).expect("a key");
        let sig = Signature::from_slice(&sig).expect("64 bytes");
        assert!(pk.verify(b"1700000000.{\"a\":1}", &sig).is_ok());
        assert!(pk.verify(b"1700000001.{\"a\":1}", &sig).is_err());
    }

    #[test]
    fn backoff_grows_to_a_minute() {
        assert!(backoff(1) <= Duration::from_millis(1200));
        assert!(backoff(30) <= Duration::from_secs(72));
        assert!(backoff(30) >= Duration::from_secs(48));
    }
}
