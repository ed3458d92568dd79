//! The gapless core, with no transport: the [`journal`] contract, the
//! in-memory journal ([`memory`]), and the [`hub`] that keeps each channel's
//! recent events as shared frames and wakes subscribers, each of which is only
//! a cursor over them (design: "a subscriber is a cursor, not a queue").

pub mod hub;
pub mod journal;
pub mod memory;
pub mod meta;
pub mod namespace;
pub mod presence;
pub mod session;
pub mod subscription;

pub use journal::{
    Appended, ChannelState, CommitSink, Journal, JournalError, Page, Retention, TimeSeek,
};
pub use namespace::{Namespaces, Policy};
