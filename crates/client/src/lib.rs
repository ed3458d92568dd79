//! A Rust client for gapless, the event-stream server where every subscriber
//! gets every event once and in order, or is told exactly which range it missed.
//!
//! Everything starts from a [`Client`], a cheap handle on one server:
//!
//! | operation | call | HTTP |
//! |---|---|---|
//! | publish one event | [`Client::publish`] → [`PublishRequest::send`] | `POST /v1/channels/{c}/events` |
//! | publish live-only | [`PublishRequest::send_ephemeral`] | `POST …/events?ephemeral=true` |
//! | publish a batch | [`Client::publish_batch`] → [`BatchRequest::send`] | `POST /v1/channels/{c}/batch` |
//! | one history page | [`Client::history`] → [`HistoryRequest::page`] | `GET /v1/channels/{c}/events` |
//! | all history | [`HistoryRequest::stream`] | the same, page after page |
//! | follow channels | [`Client::subscribe`] → [`Subscription`] | `GET …/sse` (Server-Sent Events) |
//! | history then live, exactly | [`Client::join`] → [`Join`], [`Fold`] | both |
//!
//! Cursors ([`Cursor`]) are opaque strings the server issues; the client only
//! stores and relays them. Streams yield [`Update`]s: journaled events, gap
//! notices and ephemeral events. The SSE parser ([`sse`]) is a standalone
//! module usable on its own, e.g. by a load generator.
//!
//! Not in this version: WebSocket transport and sessions (the server does not
//! offer them yet).
//!
//! # Publish
//!
//! ```no_run
//! # async fn demo() -> Result<(), gapless_client::Error> {
//! use gapless_client::{Client, NewEvent};
//!
//! let client = Client::new("http://127.0.0.1:8080")?;
//! let one = client.publish("orders", "order 1 created").event_type("created").send().await?;
//! println!("appended as seq {} at {}", one.seq, one.cursor);
//!
//! // A retry with the same idempotency key appends nothing and answers the first seq.
//! let first = client.publish("orders", "paid").idempotency_key("pay-1").send().await?;
//! let again = client.publish("orders", "paid").idempotency_key("pay-1").send().await?;
//! assert_eq!((again.seq, again.duplicate), (first.seq, true));
//!
//! let batch = client
//!     .publish_batch("orders", [
//!         NewEvent { event_type: None, data: "a".into() },
//!         NewEvent { event_type: Some("note".into()), data: "b".into() },
//!     ])
//!     .idempotency_key("import-1")
//!     .send()
//!     .await?;
//! assert_eq!(batch.last_seq, batch.first_seq + 1);
//!
//! // Live only: no seq, never replayed.
//! let sent = client.publish("orders", "typing…").send_ephemeral().await?;
//! println!("handed to {} subscribers", sent.subscribers);
//! # Ok(()) }
//! ```
//!
//! # History
//!
//! ```no_run
//! # async fn demo() -> Result<(), gapless_client::Error> {
//! use futures::TryStreamExt;
//! use gapless_client::Client;
//!
//! let client = Client::new("http://127.0.0.1:8080")?;
//! let page = client.history("orders").limit(2).page().await?;
//! println!("seqs {}..={} retained; first page has {}", page.floor, page.head, page.events.len());
//! if !page.done {
//!     let rest = client.history("orders").after(page.next).page().await?;
//!     println!("{} more", rest.events.len());
//! }
//!
//! // Every retained event, page after page.
//! let all: Vec<_> = client.history("orders").stream().try_collect().await?;
//! println!("{} events", all.len());
//! # Ok(()) }
//! ```
//!
//! # Subscribe
//!
//! ```no_run
//! # async fn demo() -> Result<(), gapless_client::Error> {
//! use gapless_client::{Client, Update};
//!
//! let client = Client::new("http://127.0.0.1:8080")?;
//! // Everything retained on both channels, then live; resumes by itself after drops.
//! let mut sub = client.subscribe(["orders", "payments"]).since_earliest().connect().await?;
//! while let Some(update) = sub.next().await {
//!     match update? {
//!         Update::Event(e) => println!("{} #{}: {}", e.channel, e.seq, e.data),
//!         Update::Gap(g) => eprintln!("missed {:?} on {}: after {:?} up to {}", g.reason, g.channel, g.after, g.next),
//!         Update::Ephemeral(e) => println!("{} (live only): {}", e.channel, e.data),
//!     }
//!     // Persist sub.cursor() to resume later with .after(cursor).
//! }
//! # Ok(()) }
//! ```
//!
//! # Join history and live exactly
//!
//! ```no_run
//! # async fn demo() -> Result<(), gapless_client::Error> {
//! use gapless_client::{Client, Folded, Update};
//!
//! let client = Client::new("http://127.0.0.1:8080")?;
//! // A running count of the channel's events: history first, then live, each once.
//! let mut counts = client
//!     .join("orders")
//!     .reconnect(true)
//!     .fold(0u64, |n: &u64, u: &Update| match u {
//!         Update::Event(e) if e.data.is_empty() => Err(format!("empty event {}", e.seq)),
//!         Update::Event(_) => Ok(n + 1),
//!         _ => Ok(*n),
//!     });
//! while let Some(step) = counts.next().await {
//!     match step? {
//!         Folded::Applied { view, .. } => println!("{} events", view.state),
//!         Folded::Rejected { error, .. } => eprintln!("skipped: {error}"),
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # Parse an SSE stream
//!
//! ```
//! use gapless_client::sse::{Item, Parser};
//!
//! let mut parser = Parser::new();
//! let mut events = 0;
//! for chunk in [&b"id: 1\nda"[..], b"ta: x\n\n", b"data: y\r\n\r\n"] {
//!     parser
//!         .feed(chunk, |item| {
//!             if let Item::Event(_) = item {
//!                 events += 1;
//!             }
//!         })
//!         .expect("small events");
//! }
//! assert_eq!(events, 2);
//! ```

pub mod backoff;
mod client;
pub mod error;
pub mod join;
mod live;
pub mod sse;
pub mod subscribe;
pub mod types;

pub use backoff::Backoff;
pub use client::{BatchRequest, Client, ClientBuilder, HistoryRequest, PublishRequest};
pub use error::{ApiError, Error};
pub use gapless_protocol::codes::{ErrorCode, GapReason};
pub use gapless_protocol::NewEvent;
pub use join::{Fold, Folded, Join, JoinBuilder, View};
pub use subscribe::{Reconnect, SubscribeBuilder, Subscription};
pub use types::{
    BatchPublished, ChannelInfo, Cursor, Ephemeral, EphemeralPublished, Event, Gap, HistoryPage,
    Published, SeqCursor, Start, Update,
};
