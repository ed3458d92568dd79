//! What a Durable Streams subscription is (PROTOCOL.md 6): its
//! configuration as `PUT` gives it, its links and their acked offsets, its
//! generation and the wake in flight, its retry schedule. [`Sub`] is also
//! the record journaled for it ([`super::store`]), in the shape older
//! releases wrote (so their records import unchanged), and the small pure
//! rules over it: reading a configuration, globs, offset order, tokens.

use super::signing;
use super::Error;
use crate::ops::streams::names;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;

/// The lease a subscription gets when it names none (PROTOCOL.md 6.2), ms.
pub const DEFAULT_LEASE_MS: u64 = 30_000;
/// The shortest and longest lease a subscription may ask for (1 s to 10
/// min), ms.
pub const LEASE_RANGE_MS: (u64, u64) = (1_000, 600_000);
/// Most explicit streams one subscription may name.
pub const MAX_STREAMS: usize = 1000;

/// The subscription `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Delivered by a signed `POST` to `webhook.url`.
    Webhook,
    /// Wake events appended to `wake_stream`; workers claim.
    PullWake,
}

impl Kind {
    /// The protocol's name of the type.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Webhook => "webhook",
            Kind::PullWake => "pull-wake",
        }
    }
}

/// A subscription's configuration, normalized (explicit streams sorted,
/// without duplicates). Two `PUT`s re-confirm when their configurations are
/// equal: the comparison of normalized configurations the protocol asks of
/// a hash (PROTOCOL.md 6.2), done directly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// Webhook or pull-wake.
    pub kind: Kind,
    /// The glob's segments (`*` one, `**` any number), if any.
    pub pattern: Option<Vec<String>>,
    /// The explicit streams (paths relative to the root), sorted.
    pub streams: Vec<String>,
    /// A webhook subscription's URL.
    pub webhook_url: Option<String>,
    /// A pull-wake subscription's wake stream (relative to the root).
    pub wake_stream: Option<String>,
    /// The lease of a wake, ms.
    pub lease_ttl_ms: u64,
    /// Free text, at most 1024 bytes.
    pub description: Option<String>,
}

/// One linked stream of a subscription (PROTOCOL.md 6.1).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    /// Named in `streams` (or added by `POST …/streams`).
    pub explicit: bool,
    /// Matched by the pattern.
    pub glob: bool,
    /// The last processed offset, inclusive; `None`: before the stream's
    /// first message (a stream linked at its creation, or named before it
    /// existed).
    pub acked: Option<String>,
}

impl Link {
    /// `explicit` or `glob`, as the protocol names a link.
    pub fn link_type(&self) -> &'static str {
        if self.explicit {
            "explicit"
        } else {
            "glob"
        }
    }
}

/// The wake in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wake {
    /// `wake_id`.
    pub id: String,
    /// The SHA-256 (base64url) of the callback (webhook) or claim
    /// (pull-wake) token: the token itself is only ever sent to its
    /// receiver, never journaled. A pull-wake wake has none until claimed.
    pub token_hash: Option<String>,
    /// The pull-wake worker holding the lease.
    pub holder: Option<String>,
    /// When the lease ends (Unix ms); `None` while a pull-wake waits for a claim.
    pub lease_until: Option<u64>,
    /// The tails the wake was issued with (path, offset), auto-acked on a
    /// webhook's `{"done": true}`.
    pub snapshot: Vec<(String, String)>,
}

/// One subscription: its whole state, journaled as one record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sub {
    /// Its id, unique under its root.
    pub id: String,
    /// The stream-path prefix before `__ds` (maybe empty).
    pub root: String,
    /// As `PUT` gave it.
    pub config: Config,
    /// `http(s)://host/PREFIX/ROOT`, from the creating request: the base of
    /// `callback_url` and `jwks_url`.
    pub base_url: String,
    /// RFC 3339, ms.
    pub created_at: String,
    /// Linked streams by path (relative to the root).
    pub links: BTreeMap<String, Link>,
    /// The generation of the newest wake (0: none yet).
    pub generation: u64,
    /// The wake in flight.
    pub wake: Option<Wake>,
    /// Consecutive failed deliveries (0: `active`).
    pub failures: u32,
    /// No wake before this (Unix ms): the retry schedule.
    pub next_attempt_at: u64,
}

impl Sub {
    /// Moves a link's `acked_offset` forward to `offset` (never back).
    pub fn ack(&mut self, path: &str, offset: String) {
        if let Some(l) = self.links.get_mut(path) {
            if l.acked.as_ref().is_none_or(|a| after(&offset, a)) {
                l.acked = Some(offset);
            }
        }
    }

    /// When this subscription next needs a look without being told (Unix
    /// ms): its lease's end, or its retry time while it is failing.
    pub fn deadline(&self, now: u64) -> Option<u64> {
        let lease = self.wake.as_ref().and_then(|w| w.lease_until);
        let retry =
            (self.wake.is_none() && self.next_attempt_at > now).then_some(self.next_attempt_at);
        match (lease, retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The full path (under the prefix) of a stream of this subscription.
    pub fn full(&self, rel: &str) -> String {
        full(&self.root, rel)
    }
}

/// Whether `id` is a subscription id: 1 to 200 of `A-Z a-z 0-9 _ - . : @`.
pub fn valid_id(id: &str) -> bool {
    (1..=200).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:@".contains(&b))
}

/// The channel prefix of every stream under `root` (`""` for the empty root).
pub fn root_prefix(root: &str) -> String {
    if root.is_empty() {
        String::new()
    } else {
        names::channel_of(root)
            .map(|c| format!("{c}{}", names::SEPARATOR))
            .unwrap_or_default()
    }
}

/// The full path (under the prefix) of `rel` under `root`.
pub fn full(root: &str, rel: &str) -> String {
    if root.is_empty() {
        rel.to_owned()
    } else {
        format!("{root}/{rel}")
    }
}

/// A glob over path segments: `*` one segment, `**` zero or more (PROTOCOL.md 6.2).
pub fn glob(pattern: &[String], path: &str) -> bool {
    fn go(p: &[String], s: &[&str]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some((h, rest)) if h == "**" => (0..=s.len()).any(|i| go(rest, &s[i..])),
            Some((h, rest)) => !s.is_empty() && (h == "*" || h == s[0]) && go(rest, &s[1..]),
        }
    }
    let segs: Vec<&str> = path.split('/').collect();
    go(pattern, &segs)
}

/// Whether offset `tail` is past `acked`: offsets of one epoch sort
/// byte-wise; across epochs (history lost) any difference is work.
pub fn after(tail: &str, acked: &str) -> bool {
    if tail.len() == acked.len() && tail.get(..16) == acked.get(..16) {
        tail > acked
    } else {
        tail != acked
    }
}

/// A fresh wake token: 256 random bits, base64url.
pub fn token() -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
}

/// A fresh `wake_id`.
pub fn wake_id() -> String {
    format!("w_{:016x}", rand::random::<u64>())
}

/// The hash a wake keeps of its token ([`Wake::token_hash`]).
pub fn token_hash(token: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(token.as_bytes()))
}

/// Compares two strings in time independent of where they differ.
pub fn constant_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// A stream path of a request body, relative to `root`: it must name a channel.
///
/// # Errors
/// [`Error::Invalid`] when it is not a string, [`Error::Path`] when it
/// names no channel.
pub fn rel_path(root: &str, v: &Value, field: &str) -> Result<String, Error> {
    let p = v
        .as_str()
        .ok_or_else(|| Error::Invalid(format!("{field} must be a stream path (a string)")))?;
    names::channel_of(&full(root, p)).map_err(|names::BadPath(m)| Error::Path(m))?;
    Ok(p.to_owned())
}

/// Reads and validates a subscription configuration (PROTOCOL.md 6.2);
/// `allow_loopback` is `--ds-webhook-allow-loopback`.
///
/// # Errors
/// What is wrong with it: [`Error::Invalid`], [`Error::Path`],
/// [`Error::WebhookUrl`].
pub fn parse_config(allow_loopback: bool, root: &str, v: &Value) -> Result<Config, Error> {
    let bad = |m: String| Error::Invalid(m);
    let kind = match v.get("type").and_then(Value::as_str) {
        Some("webhook") => Kind::Webhook,
        Some("pull-wake") => Kind::PullWake,
        _ => return Err(bad("type must be \"webhook\" or \"pull-wake\"".into())),
    };
    let pattern = parse_pattern(v.get("pattern"))?;
    let streams = parse_streams(root, v.get("streams"))?;
    if pattern.is_none() && streams.is_empty() {
        return Err(bad(
            "a subscription needs a pattern or streams (or both)".into()
        ));
    }
    let webhook_url = match (kind, v.get("webhook").and_then(|w| w.get("url"))) {
        (Kind::Webhook, Some(Value::String(u))) => {
            signing::check_url(u, allow_loopback).map_err(Error::WebhookUrl)?;
            Some(u.clone())
        }
        (Kind::Webhook, _) => return Err(bad("a webhook subscription needs webhook.url".into())),
        (Kind::PullWake, _) => None,
    };
    let wake_stream = match (kind, v.get("wake_stream")) {
        (Kind::PullWake, Some(w)) => Some(rel_path(root, w, "wake_stream")?),
        (Kind::PullWake, None) => {
            return Err(bad("a pull-wake subscription needs wake_stream".into()))
        }
        (Kind::Webhook, _) => None,
    };
    if let Some(w) = wake_stream.as_ref().filter(|w| streams.contains(w)) {
        return Err(bad(format!(
            "the wake stream {w:?} cannot be one of the subscription's streams (its wake events \
             would wake it without end)"
        )));
    }
    Ok(Config {
        kind,
        pattern,
        streams,
        webhook_url,
        wake_stream,
        lease_ttl_ms: parse_lease(v.get("lease_ttl_ms"))?,
        description: parse_description(v.get("description"))?,
    })
}

fn parse_pattern(v: Option<&Value>) -> Result<Option<Vec<String>>, Error> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(p)) => {
            let segs: Vec<String> = p.split('/').map(str::to_owned).collect();
            if segs.iter().any(String::is_empty) {
                return Err(Error::Invalid(format!(
                    "pattern {p:?} has an empty segment; a pattern is segments joined by `/`, \
                     `*` matching one segment and `**` any number"
                )));
            }
            Ok(Some(segs))
        }
        Some(_) => Err(Error::Invalid("pattern must be a string".into())),
    }
}

fn parse_streams(root: &str, v: Option<&Value>) -> Result<Vec<String>, Error> {
    let mut streams = Vec::new();
    match v {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            if a.len() > MAX_STREAMS {
                return Err(Error::Invalid(format!(
                    "streams names at most {MAX_STREAMS} paths"
                )));
            }
            for s in a {
                streams.push(rel_path(root, s, "each of streams")?);
            }
        }
        Some(_) => {
            return Err(Error::Invalid(
                "streams must be an array of stream paths".into(),
            ))
        }
    }
    streams.sort();
    streams.dedup();
    Ok(streams)
}

fn parse_lease(v: Option<&Value>) -> Result<u64, Error> {
    match v {
        None | Some(Value::Null) => Ok(DEFAULT_LEASE_MS),
        Some(n) => match n.as_u64() {
            Some(n) if (LEASE_RANGE_MS.0..=LEASE_RANGE_MS.1).contains(&n) => Ok(n),
            _ => Err(Error::Invalid(format!(
                "lease_ttl_ms must be an integer from {} to {}",
                LEASE_RANGE_MS.0, LEASE_RANGE_MS.1
            ))),
        },
    }
}

fn parse_description(v: Option<&Value>) -> Result<Option<String>, Error> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(d)) if d.len() <= 1024 => Ok(Some(d.clone())),
        Some(_) => Err(Error::Invalid(
            "description must be a string of at most 1024 bytes".into(),
        )),
    }
}

/// Unix milliseconds as RFC 3339 UTC with milliseconds.
pub fn rfc3339_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_segments() {
        let p = |s: &str| s.split('/').map(str::to_owned).collect::<Vec<_>>();
        assert!(glob(&p("events/*"), "events/a"));
        assert!(!glob(&p("events/*"), "events/a/b"));
        assert!(!glob(&p("events/*"), "events"));
        assert!(glob(&p("events/**"), "events"));
        assert!(glob(&p("events/**"), "events/a/b"));
        assert!(glob(&p("**/x"), "a/b/x"));
        assert!(!glob(&p("other/*"), "events/a"));
    }

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_778_284_800_123), "2026-05-09T00:00:00.123Z");
    }

    #[test]
    fn offsets_compare_within_an_epoch() {
        let a = "00000000000000ab_00000000000000000009";
        let b = "00000000000000ab_00000000000000000010";
        assert!(after(b, a));
        assert!(!after(a, b));
        assert!(!after(a, a));
        assert!(after("00000000000000ac_00000000000000000001", a));
    }

    #[test]
    fn a_deadline_is_the_lease_or_the_retry() {
        let mut s = Sub {
            id: "s".into(),
            root: String::new(),
            config: Config {
                kind: Kind::Webhook,
                pattern: None,
                streams: vec!["a".into()],
                webhook_url: None,
                wake_stream: None,
                lease_ttl_ms: DEFAULT_LEASE_MS,
                description: None,
            },
            base_url: String::new(),
            created_at: String::new(),
            links: BTreeMap::new(),
            generation: 0,
            wake: None,
            failures: 0,
            next_attempt_at: 0,
        };
        assert_eq!(s.deadline(10), None);
        s.next_attempt_at = 50;
        assert_eq!(s.deadline(10), Some(50));
        assert_eq!(s.deadline(60), None, "a retry time passed needs no timer");
        s.wake = Some(Wake {
            id: "w".into(),
            token_hash: None,
            holder: None,
            lease_until: Some(30),
            snapshot: Vec::new(),
        });
        assert_eq!(s.deadline(10), Some(30));
    }
}
