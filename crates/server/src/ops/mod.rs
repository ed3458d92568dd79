//! What the server does, once for every transport, as plain Rust over the
//! hub: no axum, no hyper, no sockets (`tests/layers.rs` holds it to that).
//!
//! - [`publish`]: one event, a batch, ephemeral events, the idempotency key
//!   and the publish limits;
//! - [`start`]: where a subscription starts (cursor, `since`, Last-Event-ID);
//! - [`history`]: history pages (size, start, data bound, what the journal
//!   cannot serve) and a channel's bounds;
//! - [`names`]: the channel and event type rules;
//! - [`namespaces`]: the rules of a channel's namespace (its event size
//!   limit, ephemeral publishes; `latest` is in [`start`], `public` in
//!   `auth`);
//! - [`presence`]: who follows each channel of a namespace with presence,
//!   and the join and leave notices of its members;
//! - [`limits`]: the publish rate per publisher, and a request body's pace;
//! - [`sessions`]: a session's status on the wire and the answer of each
//!   refusal;
//! - [`stream`]: the stream source every transport reads: opening a
//!   subscription, what ends a stream (shutdown, token expiry), its timer's
//!   period (heartbeat) and the one clock SSE streams share
//!   ([`StreamClock`]), the accounting of each delivery;
//! - [`stream_log`]: what a stream sent and why it ended, its log line;
//! - [`streams`]: Durable Streams streams over the journal's channel
//!   metadata: the node's cache, their layout and stitched reads, their
//!   lifecycle (deletion, soft deletion, the fork cascade) and the upgrade
//!   from the side channel of older releases;
//! - [`subscriptions`]: Durable Streams subscriptions (webhook, pull-wake):
//!   their state journaled per subscription, the rules of wakes,
//!   generations, fencing, leases and acks, and their delivery, woken by
//!   the linked streams' commits.
//!
//! A transport reads its wire into these calls and writes their answers in
//! its own shape; a refusal is an [`ApiError`](crate::error::ApiError) whose
//! code and message do not depend on the transport. May use: `auth`,
//! `config`, `error`, `metrics` and the shared state `App`.

pub mod history;
pub mod limits;
pub(crate) mod names;
pub(crate) mod namespaces;
pub mod presence;
pub(crate) mod publish;
pub(crate) mod sessions;
pub(crate) mod start;
pub(crate) mod stream;
pub(crate) mod stream_log;
pub mod streams;
pub mod subscriptions;

pub use stream::Clock as StreamClock;
