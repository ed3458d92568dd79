//! What the server does, once for every transport.

pub mod limits;
pub mod sessions;
pub mod stream_log;
