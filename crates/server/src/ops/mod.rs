//! What the server does, once for every transport.

pub mod limits;
pub mod names;
pub mod publish;
pub mod sessions;
pub mod start;
pub mod stream_log;
