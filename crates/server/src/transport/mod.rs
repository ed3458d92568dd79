//! One room per wire protocol, each adapting its wire to the same
//! operations (`ops`): [`sse`] (Server-Sent Events), [`ws`] (WebSocket,
//! subprotocol `gapless.v1`) and [`http`] (publish, history and sessions
//! over plain HTTP) and [`ds`] (the open Durable Streams protocol, under
//! `--ds-prefix`). Each room has its encoder, its handlers and a
//! `routes()` that `lib.rs` merges; the SSE room also owns the one
//! predicate that recognises its paths ([`sse::is_sse_path`]).
//!
//! A room uses `ops`, `auth`, `net`, `admin` and the protocol crate, never
//! another room; what the rooms share ([`query`], the query-string reader,
//! and [`body`], the paced body reader) imports no room. A new wire protocol is a new room; a new rule of the
//! product goes to `ops` or the hub, never here.

pub(crate) mod body;
pub(crate) mod ds;
pub(crate) mod http;
pub mod query;
pub mod sse;
pub mod ws;
