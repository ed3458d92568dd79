//! The integration tests of the gapless binary, one module per area, each driving the real
//! binary over real sockets (`gapless_testkit`); a real `redis-server` for cluster mode.
//!
//! One test binary for the crate (as ripgrep's `tests/tests.rs`): the modules link once, and
//! libtest runs their tests in parallel, `--test-threads` at a time. Run one area with
//! `cargo test -p gapless --test it <module>::`.

mod abuse_limits;
mod async_loss;
mod auth;
mod batch;
mod binary_payloads;
mod client_auth;
mod client_cli;
mod client_join;
mod client_presence;
mod client_sdk;
mod client_since;
mod client_tail;
mod client_ws;
mod client_ws_sessions;
mod cluster;
mod cluster_idle;
mod cluster_outage;
mod cluster_restore;
mod config_file;
mod damaged_journal;
mod ds_cluster;
mod ds_live;
mod ds_restart;
mod ds_settings;
mod ds_subscriptions;
mod ds_upgrade;
mod durable_streams;
mod early_refusal;
mod full_disk;
mod history;
mod limits;
mod memory_bound;
mod memory_returns;
mod metrics;
mod namespaces;
mod openapi;
mod presence;
mod protocol_decisions;
mod publish;
mod purge;
mod regression;
mod restart;
mod settings_docs;
mod slow;
mod slow_readers;
mod socket_options;
mod sse;
mod sse_ends;
mod sse_parser;
mod sse_transport;
mod start_positions;
mod trusted_proxy;
mod vanish;
mod ws_channels;
mod ws_liveness;
mod ws_sessions;
