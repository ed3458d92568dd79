//! Sockets and bytes.

pub mod conn;
pub mod forwarded;
pub mod head_error;
pub mod listener;
pub mod liveness;
pub mod tcp_info;
