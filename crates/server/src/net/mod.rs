//! Sockets and bytes, below every transport: it knows no operation and no
//! transport.
//!
//! - [`listener`]: accepting, socket options, the connection limits;
//! - [`forwarded`]: trusted proxies and the forwarded client address;
//! - [`liveness`] and [`tcp_info`]: judging a client by its TCP progress;
//! - [`conn`]: a connection from its first request head (read here, its
//!   errors described by [`head_error`]) to its close, hyper for everything
//!   but a direct stream, which it writes straight to the socket from any
//!   [`conn::Frames`] source (the SSE transport's feed);
//! - [`linger`]: closing while the client may still send, without a reset.
//!
//! May use: `config`, `error`, `metrics`, and `Peer` from the top.

pub mod conn;
pub mod forwarded;
pub(crate) mod head_error;
pub(crate) mod linger;
pub(crate) mod listener;
pub(crate) mod liveness;
pub(crate) mod tcp_info;
