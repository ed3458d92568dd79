//! The gapless wire protocol, with no I/O.
//!
//! Everything a server and a client must agree on byte for byte lives here:
//! [`event`] (the event and its JSON shapes), [`ds`] (the Durable Streams
//! bodies and SSE events), [`answers`] (the JSON bodies
//! of the HTTP API), [`ws`] (the WebSocket messages), [`cursor`] (the opaque,
//! self-checking position string), [`name`] (channel and type name rules),
//! [`since`] (where a start without a cursor begins, as sent), [`sse`] (the
//! Server-Sent Events encoder and response headers), [`codes`] (every error
//! code and gap reason that appears on the wire), [`schema`] (their JSON
//! Schemas, for the server's OpenAPI document), [`object`] (JSON objects read
//! as objects only), [`json`] (how deep a JSON body may nest) and [`time`]
//! (RFC 3339 timestamps, read strictly).

pub mod answers;
pub mod codes;
pub mod cursor;
pub mod ds;
pub mod event;
pub mod json;
pub mod name;
pub mod object;
pub mod presence;
pub mod schema;
pub mod since;
pub mod sse;
pub mod time;
pub mod ws;

pub use cursor::{ChannelKey, Cursor, CursorError, Position};
pub use event::{Encoding, Epoch, Event, NewEvent, Payload};
pub use since::Since;
