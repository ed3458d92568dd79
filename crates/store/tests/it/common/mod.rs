//! Helpers shared by the integration tests: a recording sink and event builders.
#![allow(dead_code)]

use gapless_core::{ChannelState, CommitSink, Retention};
use gapless_protocol::{Event, NewEvent};
use gapless_store::{Durability, EmbeddedJournal, StoreOptions};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// One sink call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    /// `committed(channel, state, events)`, with the events' seqs.
    Committed(String, ChannelState, Vec<u64>),
    /// `evicted(channel, state)`.
    Evicted(String, ChannelState),
}

/// A sink that records every call.
#[derive(Default)]
pub(crate) struct Recorder {
    log: Mutex<Vec<Record>>,
}

impl Recorder {
    /// Everything recorded so far.
    pub(crate) fn records(&self) -> Vec<Record> {
        self.log.lock().expect("recorder lock").clone()
    }
}

impl CommitSink for Recorder {
    fn committed(&self, channel: &str, state: ChannelState, events: &[Arc<Event>]) {
        let seqs = events.iter().map(|e| e.seq).collect();
        let rec = Record::Committed(channel.to_owned(), state, seqs);
        self.log.lock().expect("recorder lock").push(rec);
    }

    fn evicted(&self, channel: &str, state: ChannelState) {
        let rec = Record::Evicted(channel.to_owned(), state);
        self.log.lock().expect("recorder lock").push(rec);
    }
}

/// An untyped event.
pub(crate) fn ev(data: &str) -> NewEvent {
    NewEvent {
        event_type: None,
        data: data.into(),
    }
}

/// Options with the given limits and durability.
pub(crate) fn options(max_events: u64, max_age_ms: u64, durability: Durability) -> StoreOptions {
    StoreOptions {
        namespaces: Arc::new(
            Retention {
                max_events,
                max_age_ms,
                max_bytes: 0,
            }
            .into(),
        ),
        durability,
        min_free_bytes: 0,
        ..StoreOptions::default()
    }
}

/// Opens a journal in `dir` with a fresh recorder.
pub(crate) fn open(dir: &Path, opts: StoreOptions) -> (EmbeddedJournal, Arc<Recorder>) {
    let rec = Arc::new(Recorder::default());
    let journal = EmbeddedJournal::open(dir, opts, rec.clone()).expect("open journal");
    (journal, rec)
}
