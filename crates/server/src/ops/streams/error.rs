//! Why a stream operation (create, append, fork) is refused: a typed error
//! whose every variant is one code of the registry
//! (`gapless_protocol::codes`; docs/durable-streams.md, "Errors"). The
//! Durable Streams room answers it with the code's status, and with the
//! headers PROTOCOL.md names for some of them (5.2.1: `Producer-Epoch`,
//! `Producer-Expected-Seq`; 5.2: `Stream-Next-Offset` on a closed stream).

use crate::error::ApiError;
use gapless_core::journal::JournalError;
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::Epoch;

/// A refusal of a stream operation. See the module doc.
#[derive(Debug)]
pub enum StreamError {
    /// No stream at the path (404 `stream_not_found`).
    NotFound,
    /// The stream was deleted while the request was decided (404
    /// `stream_not_found`).
    Deleted,
    /// Deleted, and kept only for the forks that read it (410
    /// `stream_deleted`).
    SoftDeleted,
    /// Closed: it takes no more appends (409 `stream_closed`). `epoch` and
    /// `tail` give its final offset.
    Closed {
        /// The epoch of the stream's offsets.
        epoch: Epoch,
        /// Its final tail.
        tail: u64,
    },
    /// A stream is at the path that is not the one asked for, or the path
    /// is held (409 `stream_exists`); the text says which.
    Exists(String),
    /// The producer's epoch is older than its current one (403
    /// `stale_producer_epoch`).
    StaleEpoch {
        /// The request's `Producer-Epoch`.
        given: u64,
        /// The producer's current epoch.
        current: u64,
    },
    /// A producer's new epoch must start at seq 0 (400 `invalid_producer`).
    EpochSeqNotZero {
        /// The new epoch.
        epoch: u64,
    },
    /// The producer's seq skips the one expected (409 `producer_seq_gap`);
    /// `new_producer`: the id of a producer the stream has not seen.
    SeqGap {
        /// The seq the stream expects next.
        expected: u64,
        /// The request's `Producer-Seq`.
        received: u64,
        /// The producer's id (named when `expected` is 0: it is new here).
        new_producer: Option<String>,
    },
    /// `Stream-Seq` is not above the stream's last one (409
    /// `stream_seq_regression`).
    StreamSeqRegression {
        /// The request's `Stream-Seq`.
        given: String,
        /// The stream's last one.
        last: String,
    },
    /// The fork's source (`Stream-Forked-From` as given) was deleted and is
    /// kept only for its forks (409 `stream_deleted`: PROTOCOL.md 4.2
    /// answers a fork of it 409).
    SourceDeleted(String),
    /// The fork's source (`Stream-Forked-From` as given) does not exist, or
    /// expired (404 `stream_not_found`).
    SourceNotFound(String),
    /// What the request says is not valid for the stream: `code` names
    /// what (content type, UTF-8, JSON, an empty body or array, fork
    /// headers and offsets), the message how.
    Invalid(ErrorCode, String),
    /// gapless's own refusal: publish limits, the journal.
    Api(ApiError),
}

impl StreamError {
    /// An [`StreamError::Invalid`] with `code`.
    pub fn invalid(code: ErrorCode, message: impl Into<String>) -> Self {
        StreamError::Invalid(code, message.into())
    }

    /// The registry code.
    pub fn code(&self) -> ErrorCode {
        match self {
            StreamError::NotFound | StreamError::Deleted | StreamError::SourceNotFound(_) => {
                ErrorCode::StreamNotFound
            }
            StreamError::SoftDeleted | StreamError::SourceDeleted(_) => ErrorCode::StreamDeleted,
            StreamError::Closed { .. } => ErrorCode::StreamClosed,
            StreamError::Exists(_) => ErrorCode::StreamExists,
            StreamError::StaleEpoch { .. } => ErrorCode::StaleProducerEpoch,
            StreamError::EpochSeqNotZero { .. } => ErrorCode::InvalidProducer,
            StreamError::SeqGap { .. } => ErrorCode::ProducerSeqGap,
            StreamError::StreamSeqRegression { .. } => ErrorCode::StreamSeqRegression,
            StreamError::Invalid(code, _) => *code,
            StreamError::Api(e) => e.code,
        }
    }

    /// What is wrong, for a person; `path` is the stream's URL path.
    pub fn message(&self, path: &str) -> String {
        match self {
            StreamError::NotFound => format!("no stream at {path}"),
            StreamError::Deleted => format!("the stream at {path} was deleted"),
            StreamError::SoftDeleted => format!(
                "the stream at {path} was deleted; it is kept only for the forks that read it"
            ),
            StreamError::Closed { .. } => "the stream is closed; it takes no more appends".into(),
            StreamError::Exists(why) => format!("the stream at {path} {why}"),
            StreamError::StaleEpoch { given, current } => {
                format!("producer epoch {given} is older than the current {current}")
            }
            StreamError::EpochSeqNotZero { epoch } => {
                format!("a new producer epoch {epoch} must start at seq 0")
            }
            StreamError::SeqGap {
                new_producer: Some(id),
                expected: 0,
                ..
            } => format!("producer {id:?} is new here: its first seq must be 0"),
            StreamError::SeqGap {
                expected, received, ..
            } => format!("producer seq {received} skips {expected}"),
            StreamError::StreamSeqRegression { given, last } => {
                format!("Stream-Seq {given:?} is not above the last one, {last:?}")
            }
            StreamError::SourceDeleted(from) => format!(
                "the source stream {from:?} was deleted and is kept only for its forks; it \
                 cannot be forked again"
            ),
            StreamError::SourceNotFound(from) => {
                format!("the source stream {from:?} (Stream-Forked-From) does not exist")
            }
            StreamError::Invalid(_, m) => m.clone(),
            StreamError::Api(e) => e.message.clone(),
        }
    }
}

impl From<ApiError> for StreamError {
    fn from(e: ApiError) -> Self {
        StreamError::Api(e)
    }
}

impl From<JournalError> for StreamError {
    fn from(e: JournalError) -> Self {
        StreamError::Api(e.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each refusal has the status PROTOCOL.md gives it (through its code)
    /// and a message that says what is wrong.
    #[test]
    fn each_refusal_is_a_registry_code_with_its_status() {
        let cases = [
            (StreamError::NotFound, 404, "no stream at /ds/a"),
            (StreamError::SoftDeleted, 410, "kept only for the forks"),
            (
                StreamError::Closed {
                    epoch: Epoch(1),
                    tail: 3,
                },
                409,
                "closed",
            ),
            (
                StreamError::StaleEpoch {
                    given: 1,
                    current: 2,
                },
                403,
                "epoch 1 is older than the current 2",
            ),
            (
                StreamError::SeqGap {
                    expected: 0,
                    received: 4,
                    new_producer: Some("w".into()),
                },
                409,
                "\"w\" is new here",
            ),
            (
                StreamError::SeqGap {
                    expected: 2,
                    received: 4,
                    new_producer: Some("w".into()),
                },
                409,
                "seq 4 skips 2",
            ),
            (
                StreamError::StreamSeqRegression {
                    given: "1".into(),
                    last: "5".into(),
                },
                409,
                "not above the last one",
            ),
            (StreamError::SourceNotFound("/x".into()), 404, "\"/x\""),
            (
                StreamError::invalid(ErrorCode::InvalidFork, "bad fork"),
                400,
                "bad fork",
            ),
        ];
        for (e, status, says) in cases {
            assert_eq!(e.code().status(), status, "{e:?}");
            let m = e.message("/ds/a");
            assert!(m.contains(says), "{e:?}: {m}");
        }
    }
}
