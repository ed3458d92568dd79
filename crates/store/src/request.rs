//! What the journal sends its writer thread, and how the writer gathers
//! pending requests into one batch (one group commit: one WAL frame).
//! Appends and metadata changes of a batch are decided in arrival order
//! and written in the same frame.

use gapless_core::meta::{Change, Changed};
use gapless_core::{Appended, JournalError};
use gapless_protocol::NewEvent;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use tokio::sync::oneshot;

/// Most requests applied in one transaction.
pub(crate) const MAX_BATCH_REQUESTS: usize = 4096;
/// Most payload bytes applied in one transaction (a batch holds at least one request).
pub(crate) const MAX_BATCH_BYTES: usize = 16 << 20;

/// Where a result goes.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, JournalError>>;

/// A message to the writer.
pub(crate) enum Request {
    /// Append to a channel.
    Append {
        /// The channel.
        channel: String,
        /// The events, in order.
        events: Vec<NewEvent>,
        /// The idempotency key, if any.
        key: Option<String>,
        /// The result.
        reply: Reply<Appended>,
    },
    /// Change a channel's metadata (`channel_meta.rs`): decided in its
    /// place in the batch, committed in the batch's frame.
    Change {
        /// The channel.
        channel: String,
        /// The change (boxed: it holds a whole `ChannelMeta`).
        change: Box<Change>,
        /// The result.
        reply: Reply<Changed>,
    },
    /// Evict events older than the retention age.
    Evict {
        /// The current time, Unix ms.
        now_ms: u64,
        /// The result.
        reply: Reply<()>,
    },
    /// Purge a channel (`purge.rs`): run by the writer in its place in the
    /// batch, after what is queued before it is durable and applied to the
    /// tables, before what comes after.
    Purge {
        /// The channel.
        channel: String,
        /// Its new state (the empty state of the store's epoch for a
        /// channel never appended to).
        reply: Reply<gapless_core::ChannelState>,
    },
    /// Apply what is queued before this, commit durably, and stop.
    Close {
        /// The result of the final commit.
        reply: Reply<()>,
    },
}

/// A batched request's payload, moved out for applying.
pub(crate) enum Op {
    /// See [`Request::Append`].
    Append {
        /// The channel.
        channel: String,
        /// The events, in order.
        events: Vec<NewEvent>,
        /// The idempotency key, if any.
        key: Option<String>,
    },
    /// See [`Request::Change`].
    Change {
        /// The channel.
        channel: String,
        /// The change (boxed: it holds a whole `ChannelMeta`).
        change: Box<Change>,
    },
    /// See [`Request::Evict`].
    Evict {
        /// The current time, Unix ms.
        now_ms: u64,
    },
    /// See [`Request::Purge`].
    Purge {
        /// The channel.
        channel: String,
    },
}

/// Where a batched request's result goes.
pub(crate) enum Pending {
    /// An append's reply.
    Append(Reply<Appended>),
    /// A metadata change's reply.
    Change(Reply<Changed>),
    /// An eviction's reply.
    Evict(Reply<()>),
    /// A purge's reply.
    Purge(Reply<gapless_core::ChannelState>),
}

/// What the writer decided for an append or a change of a batch, sent as
/// its reply once the batch is durable.
#[derive(Debug)]
pub(crate) enum Done {
    /// An append's result.
    Appended(Appended),
    /// A change's result.
    Changed(Box<Changed>),
    /// A plain append to a closed channel: refused with
    /// [`JournalError::ChannelClosed`], nothing appended.
    ChannelClosed,
}

/// Requests applied together in one transaction, in arrival order.
#[derive(Default)]
pub(crate) struct Batch {
    /// The payloads.
    pub ops: Vec<Op>,
    /// The replies, one per op.
    pub pending: Vec<Pending>,
    /// Payload bytes so far.
    bytes: usize,
}

impl Batch {
    /// Adds `request`; a [`Request::Close`] is not added but returned (its reply).
    pub(crate) fn push(&mut self, request: Request) -> Option<Reply<()>> {
        match request {
            Request::Close { reply } => return Some(reply),
            Request::Purge { channel, reply } => {
                self.ops.push(Op::Purge { channel });
                self.pending.push(Pending::Purge(reply));
            }
            Request::Append {
                channel,
                events,
                key,
                reply,
            } => {
                self.bytes += channel.len() + key.as_ref().map_or(0, String::len);
                self.bytes += events
                    .iter()
                    .map(|e| e.data.len() + e.event_type.as_ref().map_or(0, String::len))
                    .sum::<usize>();
                self.ops.push(Op::Append {
                    channel,
                    events,
                    key,
                });
                self.pending.push(Pending::Append(reply));
            }
            Request::Change {
                channel,
                change,
                reply,
            } => {
                self.bytes += channel.len() + change_bytes(&change);
                self.ops.push(Op::Change { channel, change });
                self.pending.push(Pending::Change(reply));
            }
            Request::Evict { now_ms, reply } => {
                self.ops.push(Op::Evict { now_ms });
                self.pending.push(Pending::Evict(reply));
            }
        }
        None
    }

    /// True when no more requests should join this batch.
    pub(crate) fn is_full(&self) -> bool {
        self.ops.len() >= MAX_BATCH_REQUESTS || self.bytes >= MAX_BATCH_BYTES
    }
}

/// About the payload bytes of `change`: its events' data and types (the
/// metadata itself is small).
pub(crate) fn change_bytes(change: &Change) -> usize {
    let events = match change {
        Change::Create { events, .. } | Change::Append { events, .. } => events.as_slice(),
        _ => &[],
    };
    256 + events
        .iter()
        .map(|e| e.data.len() + e.event_type.as_ref().map_or(0, String::len))
        .sum::<usize>()
}

/// What [`Inbox::wait`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Requests are queued.
    Ready,
    /// The deadline passed first.
    TimedOut,
    /// The inbox is closed and empty.
    Closed,
}

/// Where requests wait for the writer thread: a queue the publishers push
/// to, which wakes the writer only when it sleeps for want of requests.
#[derive(Default)]
pub(crate) struct Inbox {
    state: Mutex<InboxState>,
    ready: Condvar,
}

#[derive(Default)]
struct InboxState {
    requests: VecDeque<Request>,
    /// The writer sleeps until a request arrives.
    waiting: bool,
    /// No more requests will come (the journal is gone).
    closed: bool,
}

impl Inbox {
    /// Queues `request`; gives it back once the inbox is closed.
    pub(crate) fn send(&self, request: Request) -> Result<(), Request> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(request);
        }
        st.requests.push_back(request);
        let wake = std::mem::take(&mut st.waiting);
        drop(st);
        if wake {
            self.ready.notify_one();
        }
        Ok(())
    }

    /// No more requests: the writer stops once it has served the queue.
    pub(crate) fn close(&self) {
        self.state.lock().closed = true;
        self.ready.notify_one();
    }

    /// Waits until a request is queued, the inbox is closed and empty, or
    /// `deadline` passes.
    pub(crate) fn wait(&self, deadline: Option<std::time::Instant>) -> Wait {
        let mut st = self.state.lock();
        while st.requests.is_empty() {
            if st.closed {
                return Wait::Closed;
            }
            st.waiting = true;
            match deadline {
                Some(at) => {
                    if self.ready.wait_until(&mut st, at).timed_out() && st.requests.is_empty() {
                        st.waiting = false;
                        return Wait::TimedOut;
                    }
                }
                None => self.ready.wait(&mut st),
            }
        }
        Wait::Ready
    }

    /// Requests queued (tests).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.state.lock().requests.len()
    }

    /// Moves queued requests into `batch`, within its bounds; a
    /// [`Request::Close`] ends the batch and is returned (its reply).
    ///
    /// A close also closes the inbox: requests queued behind it (sent by a
    /// caller that checked the journal open just before `close`) are
    /// dropped, so their callers get `Closed` instead of waiting forever on
    /// a writer that has stopped.
    pub(crate) fn take(&self, batch: &mut Batch) -> Option<Reply<()>> {
        let mut st = self.state.lock();
        while !batch.is_full() {
            let request = st.requests.pop_front()?;
            if let Some(close) = batch.push(request) {
                st.closed = true;
                let behind = std::mem::take(&mut st.requests);
                drop(st);
                drop(behind);
                return Some(close);
            }
        }
        None
    }
}
