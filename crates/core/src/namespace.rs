//! Namespaces: the rules a channel follows, by the part of its name before
//! the first `:` (issue 21, "Namespaces"; docs/deploy.md, "Namespaces").
//!
//! `chat:room-1` is in namespace `chat`; a name without `:` is in
//! [`DEFAULT_NAMESPACE`] (so is `default:x`). The configuration file gives
//! a namespace its own table (`[namespaces.chat]`); a key a table leaves
//! out, and every key of a namespace without a table, takes the server's
//! setting. [`Namespaces`] holds the effective [`Policy`] of each
//! namespace, resolved once at start; every rule that depends on a
//! channel's namespace (retention in each journal, the event size limit,
//! ephemeral publishes, the start of a subscriber that gives none, reading
//! without a token) asks it through [`Namespaces::policy`], and nothing
//! else decides what namespace a channel is in.

use crate::journal::Retention;
use std::collections::BTreeMap;

/// The namespace of a channel name without `:`; its table is
/// `[namespaces.default]`.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Longest namespace name, in characters: a channel name (at most 200) holds
/// its namespace and a `:`.
pub const MAX_NAMESPACE_LEN: usize = 199;

/// The keys of a namespace table, in the order `gapless config` prints them.
pub const KEYS: &[&str] = &[
    "retention_events",
    "retention_ms",
    "retention_bytes",
    "max_event_bytes",
    "ephemeral",
    "latest",
    "public",
    "presence",
    "presence_linger_ms",
];

/// Largest `presence_linger_ms`: one hour.
pub const MAX_PRESENCE_LINGER_MS: u64 = 3_600_000;

/// The namespace of `channel`: its name up to the first `:`, or
/// [`DEFAULT_NAMESPACE`] when it has none (`chat:room-1` is in `chat`,
/// `news` in `default`, `:x` in the empty namespace, which no table can
/// name, so it has the server's settings).
pub fn namespace_of(channel: &str) -> &str {
    channel
        .split_once(':')
        .map_or(DEFAULT_NAMESPACE, |(ns, _)| ns)
}

/// Whether `name` can be a namespace table's name: 1 to
/// [`MAX_NAMESPACE_LEN`] characters of the channel alphabet but `:`
/// (`A-Z a-z 0-9 _ - . @ ~`). Any other name could never be a channel's
/// namespace.
///
/// # Errors
/// What is wrong with the name, for the start-up refusal.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a namespace name is empty; it must be 1 to 199 characters".to_owned());
    }
    if name.len() > MAX_NAMESPACE_LEN {
        return Err(format!(
            "a namespace name is at most {MAX_NAMESPACE_LEN} characters; this one has {}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@' | '~')))
    {
        return Err(format!(
            "namespace name {name:?} contains {c:?}; a namespace is the part of a channel name \
             before its first `:`, of A-Z a-z 0-9 _ - . @ ~"
        ));
    }
    Ok(())
}

/// The effective settings of one namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// How long events are kept (`retention_events`, `retention_ms`,
    /// `retention_bytes`): each journal applies it per channel.
    pub retention: Retention,
    /// Largest event data, in bytes (`max_event_bytes`); a larger publish is
    /// 413 `too_large` with `limit`. At least 1. Server setting
    /// `--max-event-bytes`, default 1048576.
    pub max_event_bytes: usize,
    /// Whether ephemeral publishes are taken (`ephemeral`); when false they
    /// are 403 `forbidden` naming the namespace. Default true.
    pub ephemeral: bool,
    /// Whether a subscriber that gives no start position (no cursor, no
    /// `since`) gets the newest retained event first, then live
    /// (`latest`). Default false: live only.
    pub latest: bool,
    /// Whether following and reading the history of its channels needs no
    /// token on a server with keys (`public`); publishing still does.
    /// Default false.
    pub public: bool,
    /// Presence (`presence`): who follows each channel, and its members'
    /// join and leave (issue 21, "Presence"; the server's `ops::presence`).
    /// Default false.
    pub presence: bool,
    /// How long a member's last connection is gone before its leave, in
    /// milliseconds (`presence_linger_ms`, 0 to [`MAX_PRESENCE_LINGER_MS`]);
    /// a connection back within it is neither a leave nor a join. Default
    /// 5000.
    pub presence_linger_ms: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            retention: Retention::default(),
            max_event_bytes: 1 << 20,
            ephemeral: true,
            latest: false,
            public: false,
            presence: false,
            presence_linger_ms: 5000,
        }
    }
}

/// What one namespace table sets: each key it gives, `None` for each it
/// leaves out (which then takes the server's setting, [`Table::over`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Table {
    /// `retention_events`: most events kept per channel; 0 = no count limit.
    pub retention_events: Option<u64>,
    /// `retention_ms`: age after which events are evicted; 0 = no age limit.
    pub retention_ms: Option<u64>,
    /// `retention_bytes`: most bytes of event data kept per channel (the
    /// newest event is always kept); 0 = no byte limit.
    pub retention_bytes: Option<u64>,
    /// `max_event_bytes`: largest event data, at least 1.
    pub max_event_bytes: Option<usize>,
    /// `ephemeral`: whether ephemeral publishes are taken.
    pub ephemeral: Option<bool>,
    /// `latest`: start a subscriber that gives no start at the newest event.
    pub latest: Option<bool>,
    /// `public`: read without a token.
    pub public: Option<bool>,
    /// `presence`: presence on.
    pub presence: Option<bool>,
    /// `presence_linger_ms`.
    pub presence_linger_ms: Option<u64>,
}

impl Table {
    /// The effective policy: each key this table sets, else `server`'s.
    pub fn over(&self, server: &Policy) -> Policy {
        Policy {
            retention: Retention {
                max_events: self.retention_events.unwrap_or(server.retention.max_events),
                max_age_ms: self.retention_ms.unwrap_or(server.retention.max_age_ms),
                max_bytes: self.retention_bytes.unwrap_or(server.retention.max_bytes),
            },
            max_event_bytes: self.max_event_bytes.unwrap_or(server.max_event_bytes),
            ephemeral: self.ephemeral.unwrap_or(server.ephemeral),
            latest: self.latest.unwrap_or(server.latest),
            public: self.public.unwrap_or(server.public),
            presence: self.presence.unwrap_or(server.presence),
            presence_linger_ms: self.presence_linger_ms.unwrap_or(server.presence_linger_ms),
        }
    }

    /// Whether this table sets `key` (one of [`KEYS`]).
    pub fn sets(&self, key: &str) -> bool {
        match key {
            "retention_events" => self.retention_events.is_some(),
            "retention_ms" => self.retention_ms.is_some(),
            "retention_bytes" => self.retention_bytes.is_some(),
            "max_event_bytes" => self.max_event_bytes.is_some(),
            "ephemeral" => self.ephemeral.is_some(),
            "latest" => self.latest.is_some(),
            "public" => self.public.is_some(),
            "presence" => self.presence.is_some(),
            "presence_linger_ms" => self.presence_linger_ms.is_some(),
            _ => false,
        }
    }
}

/// The effective policy of every namespace: the server's settings, and the
/// namespaces with a table of their own (see the module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespaces {
    server: Policy,
    named: BTreeMap<String, Policy>,
    tables: BTreeMap<String, Table>,
}

impl Namespaces {
    /// `server`'s settings for every namespace but those of `tables`, which
    /// get each key they set and `server`'s for the rest.
    pub fn new(server: Policy, tables: &BTreeMap<String, Table>) -> Self {
        Namespaces {
            server,
            named: tables
                .iter()
                .map(|(name, t)| (name.clone(), t.over(&server)))
                .collect(),
            tables: tables.clone(),
        }
    }

    /// One retention for every channel and the server's defaults otherwise
    /// (a journal opened without namespaces, tests).
    pub fn uniform(retention: Retention) -> Self {
        Namespaces {
            server: Policy {
                retention,
                ..Policy::default()
            },
            named: BTreeMap::new(),
            tables: BTreeMap::new(),
        }
    }

    /// The server's settings: the policy of a namespace without a table.
    pub fn server(&self) -> &Policy {
        &self.server
    }

    /// The namespaces with a table, by name, with their effective policy.
    pub fn named(&self) -> impl Iterator<Item = (&str, &Policy)> {
        self.named.iter().map(|(n, p)| (n.as_str(), p))
    }

    /// Whether no namespace has a table of its own: every channel has the
    /// server's settings.
    pub fn is_uniform(&self) -> bool {
        self.named.is_empty()
    }

    /// Whether `namespace` has a table of its own.
    pub fn has_table(&self, namespace: &str) -> bool {
        self.named.contains_key(namespace)
    }

    /// Whether `channel`'s namespace has a table that sets `key` (one of
    /// [`KEYS`]): the setting a refusal names is then that table's, not the
    /// server's flag.
    pub fn table_sets(&self, channel: &str, key: &str) -> bool {
        !self.tables.is_empty()
            && self
                .tables
                .get(namespace_of(channel))
                .is_some_and(|t| t.sets(key))
    }

    /// The effective policy of namespace `namespace`.
    pub fn of_namespace(&self, namespace: &str) -> &Policy {
        if self.named.is_empty() {
            return &self.server;
        }
        self.named.get(namespace).unwrap_or(&self.server)
    }

    /// The effective policy of `channel`'s namespace ([`namespace_of`]).
    /// The server's own channels (names with `/`, which no client channel
    /// can have: a session's `session/ID`, the Durable Streams subscriptions'
    /// channels `gapless/ds-sub…`) always have the server's settings, so that no
    /// namespace table shortens what the server keeps for itself.
    pub fn policy(&self, channel: &str) -> &Policy {
        if self.named.is_empty() || channel.contains('/') {
            return &self.server;
        }
        self.of_namespace(namespace_of(channel))
    }

    /// The retention of `channel`.
    pub fn retention(&self, channel: &str) -> Retention {
        self.policy(channel).retention
    }

    /// Whether any channel may have an age limit (a journal then tracks
    /// event ages).
    pub fn any_age_limit(&self) -> bool {
        self.server.retention.max_age_ms != 0
            || self.named.values().any(|p| p.retention.max_age_ms != 0)
    }

    /// Whether some namespace is `public`.
    pub fn any_public(&self) -> bool {
        self.server.public || self.named.values().any(|p| p.public)
    }
}

impl From<Retention> for Namespaces {
    fn from(retention: Retention) -> Self {
        Namespaces::uniform(retention)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_the_name_up_to_the_first_colon() {
        assert_eq!(namespace_of("chat:room-1"), "chat");
        assert_eq!(namespace_of("chat:a:b"), "chat");
        assert_eq!(namespace_of("news"), "default");
        assert_eq!(namespace_of("default:x"), "default");
        assert_eq!(namespace_of(":x"), "");
    }

    #[test]
    fn a_table_overrides_only_what_it_sets() {
        let server = Policy {
            retention: Retention {
                max_events: 10,
                max_age_ms: 20,
                max_bytes: 30,
            },
            max_event_bytes: 40,
            ..Policy::default()
        };
        let mut tables = BTreeMap::new();
        tables.insert(
            "chat".to_owned(),
            Table {
                retention_events: Some(5),
                latest: Some(true),
                ..Table::default()
            },
        );
        let ns = Namespaces::new(server, &tables);
        let chat = ns.policy("chat:1");
        assert_eq!(chat.retention.max_events, 5);
        assert_eq!(chat.retention.max_age_ms, 20);
        assert_eq!(chat.retention.max_bytes, 30);
        assert_eq!(chat.max_event_bytes, 40);
        assert!(chat.latest && chat.ephemeral && !chat.public);
        assert_eq!(ns.policy("other:1"), &server);
        assert_eq!(ns.policy("plain"), &server);
        assert_eq!(ns.policy("chat:x/y"), &server, "the server's own channels");
        assert!(ns.has_table("chat") && !ns.has_table("other"));
    }

    #[test]
    fn namespace_names_are_checked() {
        assert!(check_name("chat").is_ok());
        assert!(check_name("a.b-c_d@e~f").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a:b").is_err());
        assert!(check_name("a b").is_err());
        assert!(check_name(&"x".repeat(200)).is_err());
    }
}
