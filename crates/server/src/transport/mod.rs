//! One room per wire protocol.

pub mod http;
pub mod query;
pub mod sse;
pub mod ws;
