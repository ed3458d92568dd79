//! The gapless wire protocol, with no I/O.
//!
//! Everything a server and a client must agree on byte for byte lives here:
//! [`event`] (the event and its JSON shapes), [`answers`] (the JSON bodies
//! of the HTTP API), [`ws`] (the WebSocket messages), [`cursor`] (the opaque,
//! self-checking position string), [`name`] (channel and type name rules),
//! [`since`] (where a start without a cursor begins, as sent), [`sse`] (the
//! Server-Sent Events encoder), [`codes`] (every error code
//! and gap reason that appears on the wire), [`schema`] (their JSON Schemas,
//! for the server's OpenAPI document) and [`object`] (JSON objects read as
//! objects only).

pub mod answers;
pub mod codes;
pub mod cursor;
pub mod event;
pub mod name;
pub mod object;
pub mod presence;
pub mod schema;
pub mod since;
pub mod sse;
pub mod ws;

pub use cursor::{ChannelKey, Cursor, CursorError, Position};
pub use event::{Encoding, Epoch, Event, NewEvent, Payload};
pub use since::Since;
