//! The one log line each stream writes when it ends (SSE streams, WebSocket
//! connections, session consumers, Durable Streams `live=sse` reads), at `info`: which transport, which
//! channels, how long it lasted, how many events and gap notices it sent,
//! and why it ended. Nothing is logged per event at the default level
//! (docs/deploy.md, "Metrics, readiness, logs"). A stream keeps a [`Tally`] (24 bytes) and
//! logs from it when it is dropped, whichever way it ends.

use gapless_core::subscription::Subscription;
use std::fmt::Display;

/// Why a stream ended: the `ended` field of its log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The client closed the connection (FIN, reset, or a WebSocket close).
    ClientClosed,
    /// The client stopped acknowledging for the liveness bound
    /// (`--tcp-user-timeout-ms`) and was dropped.
    ClientVanished,
    /// A write to the client failed.
    WriteFailed,
    /// The server shut down.
    Shutdown,
    /// The token that opened the stream expired.
    TokenExpired,
    /// A journal read failed; the stream was aborted.
    JournalFailed,
    /// WebSocket: no answer to pings for two heartbeat intervals (4408).
    HeartbeatTimeout,
    /// WebSocket: the client broke the protocol (1002, 1007, 1009) or sent
    /// too many malformed messages (4422).
    ProtocolError,
    /// WebSocket session consumer: replaced by a takeover elsewhere (4409),
    /// or the session ended (completed or cancelled).
    SessionOver,
    /// WebSocket session consumer: its position is no longer retained
    /// (4410; counted as a gap). Durable Streams SSE: retention or a purge
    /// passed the reader (its reconnection is answered 410).
    NotRetained,
    /// Durable Streams SSE: the reader reached the tail of a closed stream.
    StreamClosed,
    /// Durable Streams SSE: the stream was deleted (its URL then answers 404).
    StreamDeleted,
    /// Durable Streams SSE: the response reached its lifetime (about 60 s,
    /// the protocol's advice); the client reconnects from its last offset.
    Lifetime,
}

impl Ended {
    /// The value logged, in snake case (`client_closed`, `heartbeat_timeout`, …).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Ended::ClientClosed => "client_closed",
            Ended::ClientVanished => "client_vanished",
            Ended::WriteFailed => "write_failed",
            Ended::Shutdown => "shutdown",
            Ended::TokenExpired => "token_expired",
            Ended::JournalFailed => "journal_failed",
            Ended::HeartbeatTimeout => "heartbeat_timeout",
            Ended::ProtocolError => "protocol_error",
            Ended::SessionOver => "session_over",
            Ended::NotRetained => "not_retained",
            Ended::StreamClosed => "stream_closed",
            Ended::StreamDeleted => "stream_deleted",
            Ended::Lifetime => "lifetime",
        }
    }
}

/// What a stream sent and why it ended, kept for its log line.
#[derive(Debug)]
pub(crate) struct Tally {
    /// When the stream opened: wall-clock milliseconds since the Unix epoch.
    opened_ms: u64,
    /// Events (durable and ephemeral) handed to the socket.
    events: u64,
    /// Gap notices handed to the socket.
    gaps: u32,
    /// Why it ended, once known; unset at the end means the client went away.
    ending: Option<Ended>,
}

impl Tally {
    /// A stream opened now, whose opening already sent `gaps` gap notices.
    pub(crate) fn new(gaps: usize) -> Self {
        Tally {
            opened_ms: gapless_core::journal::now_ms(),
            events: 0,
            gaps: u32::try_from(gaps).unwrap_or(u32::MAX),
            ending: None,
        }
    }

    /// Counts `n` events sent.
    pub(crate) fn events(&mut self, n: usize) {
        self.events = self.events.saturating_add(n as u64);
    }

    /// Counts `n` gap notices sent.
    pub(crate) fn gaps(&mut self, n: usize) {
        self.gaps = self
            .gaps
            .saturating_add(u32::try_from(n).unwrap_or(u32::MAX));
    }

    /// Records why the stream ends; the first reason given wins.
    pub(crate) fn ended_by(&mut self, why: Ended) {
        self.ending.get_or_insert(why);
    }

    /// Writes the stream's line: `transport` (`sse`, `ws`, or `ds` for a
    /// Durable Streams `live=sse` read) and the
    /// `channels` it followed at its end.
    pub(crate) fn log(&self, transport: &'static str, channels: &dyn Display) {
        let ended = self.ending.unwrap_or(Ended::ClientClosed).as_str();
        let duration_ms = gapless_core::journal::now_ms().saturating_sub(self.opened_ms);
        tracing::info!(
            target: "gapless::stream",
            transport,
            channels = %channels,
            duration_ms,
            events = self.events,
            gaps = self.gaps,
            ended,
            "stream ended"
        );
    }
}

/// A subscription's channels for a log line: the first eight names,
/// comma-separated, then how many more.
pub(crate) struct ChannelList<'a>(pub &'a Subscription);

impl Display for ChannelList<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SHOWN: usize = 8;
        let n = self.0.len();
        for i in 0..n.min(SHOWN) {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(self.0.channel(i))?;
        }
        if n > SHOWN {
            write!(f, ",…(+{})", n - SHOWN)?;
        }
        Ok(())
    }
}
