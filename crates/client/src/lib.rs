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
//! | follow channels over WebSocket | [`Client::subscribe_ws`] → [`WsSubscription`] | `GET /v1/ws` |
//! | history then live, exactly | [`Client::join`] → [`Join`], [`Fold`] | both |
//! | create a session | [`Client::create_session`] | `POST /v1/sessions` |
//! | append to a session | [`Client::append_session`] → [`AppendRequest::send`] | `POST /v1/sessions/{id}/events` |
//! | end a session | [`Client::complete_session`], [`Client::cancel_session`] | `POST /v1/sessions/{id}/complete`, `…/cancel` |
//! | a session's state | [`Client::session_info`] | `GET /v1/sessions/{id}` |
//! | consume a session | [`Client::attach_session`] → [`SessionStream`] | `GET /v1/sessions/{id}/ws` |
//!
//! Cursors ([`Cursor`]) are opaque strings the server issues; the client only
//! stores and relays them. Channel streams, over SSE or WebSocket, yield
//! [`Update`]s: journaled events, gap notices and ephemeral events; a session
//! consumer yields [`SessionUpdate`]s. The SSE parser ([`sse`]) is a
//! standalone module usable on its own, e.g. by a load generator.
//!
//! Not in this version: publishing over the WebSocket (publish over HTTP),
//! and session history (`GET /v1/sessions/{id}/events`).
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
//!         Update::Presence(p) => println!("{} {:?} {}", p.channel, p.action, p.id),
//!     }
//!     // Persist sub.cursor() to resume later with .after(cursor).
//! }
//! # Ok(()) }
//! ```
//!
//! Where a subscription without a cursor starts ([`Start`], on its first
//! connection only: a reconnect resumes from its cursor): live (the
//! default), `since_earliest()` (everything retained), `since_last(n)` (the
//! last n retained events, 1 to 1000), `since_time(t)` (the first retained
//! event at or after `t`; a [`Gap`] of reason `Evicted` first when an
//! event no longer retained may be at or after it), each then live. The
//! same starts read history pages ([`HistoryRequest::start`]; a page that
//! starts at the floor for a time has [`HistoryPage::gap`]), and start a
//! join ([`JoinBuilder::start`], `since_last(n)`, `since_time(t)`; default:
//! everything retained). [`Client::channel_info`] gives a channel's bounds,
//! its namespace and the retention that applies to it
//! ([`ChannelInfo::namespace`], [`ChannelInfo::retention`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), gapless_client::Error> {
//! use gapless_client::{Client, Start};
//! use std::time::{Duration, SystemTime};
//!
//! let client = Client::new("http://127.0.0.1:8080")?;
//! let _recent = client.subscribe(["orders"]).since_last(10).connect().await?;
//! let hour_ago = SystemTime::now() - Duration::from_secs(3600);
//! let _since = client.subscribe_ws(["orders"]).since_time(hour_ago).connect().await?;
//! let page = client.history("orders").start(Start::Last(100)).page().await?;
//! println!("{} of the last 100", page.events.len());
//! let _join = client.join("orders").since_last(10).open();
//! let info = client.channel_info("chat:room-1").await?;
//! println!("{}: {} events kept", info.namespace, info.retention.events);
//! # Ok(()) }
//! ```
//!
//! # Subscribe over WebSocket
//!
//! One socket for every channel, each resumed from its own cursor after a
//! drop ([`ws_subscribe`] has the rules).
//!
//! ```no_run
//! # async fn demo() -> Result<(), gapless_client::Error> {
//! use gapless_client::{Backoff, Client, Update};
//! use std::time::Duration;
//!
//! let client = Client::new("http://127.0.0.1:8080")?;
//! let mut sub = client
//!     .subscribe_ws(["orders", "payments"])
//!     .since_earliest()
//!     .backoff(Backoff { initial: Duration::from_millis(200), max: Duration::from_secs(10) })
//!     .connect()
//!     .await?;
//! while let Some(update) = sub.next().await {
//!     match update? {
//!         Update::Event(e) => println!("{} #{}: {}", e.channel, e.seq, e.data),
//!         Update::Gap(g) => eprintln!("missed {:?} on {}: up to {}", g.reason, g.channel, g.next),
//!         Update::Ephemeral(e) => println!("{} (live only): {}", e.channel, e.data),
//!         Update::Presence(p) => println!("{} {:?} {}", p.channel, p.action, p.id),
//!     }
//! }
//! // Each channel's position, to resume later with .cursors(saved).
//! let saved = sub.cursors();
//! let _later = client.subscribe_ws(["orders", "payments"]).cursors(saved).open();
//! # Ok(()) }
//! ```
//!
//! # Sessions: produce
//!
//! ```no_run
//! # async fn demo() -> Result<(), gapless_client::Error> {
//! use gapless_client::{Client, SessionStatus};
//!
//! let client = Client::new("http://127.0.0.1:8080")?;
//! let session = client.create_session(Some("job-42")).await?; // or None: the server draws an id
//! assert_eq!((session.status, session.head), (SessionStatus::Open, 1)); // seq 1 opens it
//!
//! let sent = client.append_session(&session.id, "step 1").event_type("progress").send().await?;
//! if !sent.attached {
//!     eprintln!("nobody is consuming {} yet", sent.id);
//! }
//! let info = client.session_info(&session.id).await?;
//! println!("head {} attached {}", info.head, info.attached);
//!
//! let done = client.complete_session(&session.id).await?; // or cancel_session
//! assert_eq!(done.status, SessionStatus::Completed);
//! # Ok(()) }
//! ```
//!
//! # Sessions: consume
//!
//! The consumer re-attaches by itself after a drop, with the last seq it
//! delivered and `takeover=true` ([`session`] says why), and ends after the
//! session's end.
//!
//! ```no_run
//! # async fn demo() -> Result<(), gapless_client::Error> {
//! use gapless_client::{Client, ErrorCode, SessionUpdate};
//!
//! let client = Client::new("http://127.0.0.1:8080")?;
//! let mut consumer = match client.attach_session("job-42").last_seq(1).connect().await {
//!     Ok(c) => c,
//!     Err(e) if e.api().and_then(|a| a.error_code()) == Some(ErrorCode::SessionNotFound) => {
//!         eprintln!("no such session (close {:?})", e.api().and_then(|a| a.close_code()));
//!         return Ok(());
//!     }
//!     Err(e) => return Err(e),
//! };
//! while let Some(update) = consumer.next().await {
//!     match update? {
//!         SessionUpdate::Event(e) => println!("#{} {:?}: {}", e.seq, e.event_type, e.data),
//!         SessionUpdate::Resumed { replayed_events } => {
//!             println!("caught up ({replayed_events} replayed)")
//!         }
//!         SessionUpdate::Completed { .. } => println!("done"),
//!         SessionUpdate::Cancelled { .. } => println!("cancelled"),
//!     }
//! }
//! // Where it stopped, to attach again later with .last_seq(n).
//! println!("last seq {:?}", consumer.last_seq());
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
pub mod session;
pub mod sse;
pub mod subscribe;
pub mod types;
mod ws;
pub mod ws_subscribe;

pub use backoff::Backoff;
pub use client::{BatchRequest, Client, ClientBuilder, HistoryRequest, PublishRequest, TokenFn};
pub use error::{ApiError, Error};
pub use gapless_protocol::codes::{ErrorCode, GapReason};
pub use gapless_protocol::NewEvent;
pub use join::{Fold, Folded, Join, JoinBuilder, View};
pub use session::{AppendRequest, AttachBuilder, SessionStream};
pub use subscribe::{Reconnect, SubscribeBuilder, Subscription};
pub use types::{
    BatchItem, BatchPublished, ChannelInfo, Cursor, Ephemeral, EphemeralDelivered, Event, Gap,
    HistoryPage, PresenceAction, PresenceAnswer, PresenceMember, PresenceNotice, Published,
    RetentionLimits, SessionAppended, SessionEvent, SessionInfo, SessionStatus, SessionUpdate,
    Start, Update,
};
pub use ws_subscribe::{WsSubscribeBuilder, WsSubscription};
