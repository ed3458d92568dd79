//! The Durable Streams mapping of names and positions (a stream path to its
//! channel, an offset to a journal position, `Stream-Cursor`): the product's,
//! `crate::ops::streams::names`, re-exported here for the room's handlers.

pub use crate::ops::streams::names::*;
