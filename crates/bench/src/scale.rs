//! Scale and growth scenarios (issue 20, target 5): what a followed channel
//! costs (`multi`), and how long one event takes to reach the last of many
//! subscribers (`burst`). Both check their counts exactly, like the others.
//!
//! `multi` gives each subscriber several channels on one SSE connection
//! (gapless `/v1/sse?channel=A&channel=B…`, Nchan's multiplexed `/msub/A,B,…`);
//! every event carries its channel's tag (`cK:`, [`crate::payload`]), so each
//! subscriber keeps one [`Tracker`] per channel and checks every event of every
//! channel once and, with one publisher, in order per channel. `--split` opens
//! one connection per (subscriber, channel) instead, over the same channels and
//! events: the two runs side by side give the cost of a followed channel
//! against that of a connection. A target that follows one stream per URL
//! (the Durable Streams kinds) always runs split.

use crate::http::{request, Client};
use crate::payload::{self, now_us};
use crate::procstat::Meter;
use crate::publisher;
use crate::report::{histogram, Record};
use crate::scenario::{
    cpu_metrics, delivery_problems, ds_metrics, ms, per_s, publish_problems, Ctx, Group,
};
use crate::sub::Tracker;
use crate::Transport;
use anyhow::{bail, Result};
use clap::Args;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- multi

/// `multi` arguments.
#[derive(Debug, Args)]
pub(crate) struct MultiArgs {
    /// Subscribers; each follows `--channels-per-sub` channels on one connection (with
    /// `--split`, on one connection per channel).
    #[arg(long, default_value_t = 1000)]
    pub subs: usize,
    /// Channels each subscriber follows (gapless: at most `--max-subscription-channels`,
    /// 64 by default; Nchan: at most 255).
    #[arg(long, default_value_t = 16)]
    pub channels_per_sub: usize,
    /// Channels in all (default: `--channels-per-sub`, so every subscriber follows the same
    /// ones). Subscriber `i` follows channels `(i × channels-per-sub + k) mod channels`.
    #[arg(long)]
    pub channels: Option<usize>,
    /// Events to publish, round-robin over the channels.
    #[arg(long, default_value_t = 16_000)]
    pub events: u64,
    /// Event data size in bytes.
    #[arg(long, default_value_t = 100)]
    pub bytes: usize,
    /// Events per second over all channels; 0 = as fast as acknowledged.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Concurrent publisher connections (order per channel is checked only with one).
    #[arg(long, default_value_t = 1)]
    pub publishers: usize,
    /// Stop publishing after this many seconds even if events remain.
    #[arg(long)]
    pub max_secs: Option<f64>,
    /// One connection per (subscriber, channel) instead of one per subscriber.
    #[arg(long)]
    pub split: bool,
    /// How long to hold the connections before reading RSS, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub hold_ms: u64,
}

/// Subscribers that each follow several channels on one connection (or, split, on one
/// connection each): RSS per connection and per followed channel, connect time, then a
/// publishing run: CPU per delivery, latency, exact counts per channel.
///
/// # Errors
/// Bad arguments, or subscribers could not attach or warm up.
pub(crate) async fn multi(ctx: &Ctx, a: &MultiArgs) -> Result<Record> {
    if ctx.transport != Transport::Sse {
        bail!("multi follows over SSE only (--transport sse)");
    }
    let per = a.channels_per_sub.max(1);
    let channels = a.channels.unwrap_or(per).max(1);
    if per > channels {
        bail!("--channels-per-sub {per} is more than --channels {channels}");
    }
    let split = a.split || ctx.multi_path(&["x"]).is_none();
    let rate = if a.rate > 0.0 {
        a.rate.to_string()
    } else {
        "max".to_owned()
    };
    let mut r = ctx.sub_record(
        "multi",
        format!(
            "subs={} channels_per_sub={per} channels={channels} events={} bytes={} rate={rate} publishers={} mode={}",
            a.subs,
            a.events,
            a.bytes,
            a.publishers,
            if split { "split" } else { "multi" }
        ),
    );
    let names = ctx.streams("m", channels).await?;
    let paths = ctx.pub_paths(&names);
    let follows = |i: usize| -> Vec<usize> { (0..per).map(|k| (i * per + k) % channels).collect() };
    let mut followers = vec![0u64; channels];
    let mut trackers = Vec::new();
    for i in 0..a.subs {
        let f = follows(i);
        for &c in &f {
            followers[c] += 1;
        }
        if split {
            trackers.extend(
                f.iter()
                    .enumerate()
                    .map(|(k, &c)| Tracker::new(i * per + k, c)),
            );
        } else {
            trackers.push(Tracker::multi(i, f));
        }
    }
    let followings = (a.subs * per) as f64;
    let rss0 = ctx.server.rss_kb()?;
    let t0 = Instant::now();
    let group = Group::spawn(ctx, &names, trackers, false);
    let connections = group.len();
    group.board.wait_connected(connections, ctx.timeout).await?;
    let connect_all = t0.elapsed();
    tokio::time::sleep(Duration::from_millis(a.hold_ms)).await;
    let rss1 = ctx.server.rss_kb()?;
    group.check_alive()?;
    let connect = group.board.connect_times();
    r.metric("subscribers", a.subs as f64);
    r.metric("connections", connections as f64);
    r.metric("followed_channels", followings);
    r.metric("connect_all_s", connect_all.as_secs_f64());
    r.metric("connect_p50_ms", ms(connect.value_at_quantile(0.5)));
    r.metric("connect_p99_ms", ms(connect.value_at_quantile(0.99)));
    if let (Some(before), Some(after)) = (rss0, rss1) {
        let grown = after.saturating_sub(before) as f64;
        r.metric("server_rss_after_mb", after as f64 / 1024.0);
        r.metric("server_rss_per_sub_kb", grown / a.subs.max(1) as f64);
        r.metric(
            "server_rss_per_followed_channel_kb",
            grown / followings.max(1.0),
        );
    }

    group.warm_up(ctx, &paths).await?;
    group.board.reset_latency();
    let meter = Meter::start(&ctx.server)?;
    let t0_us = now_us();
    let mut plan = ctx.plan(paths, a.events, a.rate, a.bytes, a.publishers, a.max_secs);
    plan.tag = true;
    let outcome = publisher::run(plan).await;
    let target: u64 = outcome
        .issued
        .iter()
        .zip(&followers)
        .map(|(e, f)| e * f)
        .sum();
    let complete = group
        .board
        .wait_delivered(target, ctx.timeout, connections)
        .await;
    let usage = meter.stop()?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let delivered = group.board.delivered.load(Ordering::Acquire);
    let span_us = group
        .board
        .last_delivery_us
        .load(Ordering::Relaxed)
        .saturating_sub(t0_us);
    let latency = group.board.latency();
    let board = group.board.clone();
    let trackers: Vec<Tracker> = group
        .finish()
        .await?
        .into_iter()
        .flat_map(Tracker::flatten)
        .collect();

    let published: u64 = outcome.issued.iter().sum();
    r.metric("events_published", published as f64);
    r.metric("publish_per_s", per_s(outcome.acked, outcome.elapsed));
    r.metric("deliveries", delivered as f64);
    r.metric(
        "deliveries_per_s",
        per_s(delivered, Duration::from_micros(span_us)),
    );
    ds_metrics(ctx, &mut r, &board);
    r.latency("latency", &latency);
    cpu_metrics(&mut r, &usage, delivered, "delivery");
    if !complete {
        r.problem(format!(
            "only {delivered} of {target} deliveries within {:?}",
            ctx.timeout
        ));
    }
    publish_problems(&mut r, &outcome);
    delivery_problems(
        &mut r,
        &trackers,
        |t| outcome.issued[t.channel],
        a.publishers <= 1,
    );
    Ok(r)
}

// ---------------------------------------------------------------- burst

/// `burst` arguments.
#[derive(Debug, Args)]
pub(crate) struct BurstArgs {
    /// Subscribers, all on one channel.
    #[arg(long, default_value_t = 10_000)]
    pub subs: usize,
    /// Events, each published alone once every subscriber has the one before.
    #[arg(long, default_value_t = 5)]
    pub events: u64,
    /// Event data size in bytes.
    #[arg(long, default_value_t = 100)]
    pub bytes: usize,
    /// Pause after every subscriber has an event, before the next, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pub pause_ms: u64,
}

/// The median of `v` (sorted here); 0 when empty.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One channel with many subscribers; each event is published alone, and the next only
/// once every subscriber has it. Per event: the time until the last subscriber has it (the
/// highest of the subscribers' latencies) and the p50/p99 across subscribers; the record
/// gives each event's time to the last and the median over events.
///
/// # Errors
/// Subscribers could not attach or warm up.
pub(crate) async fn burst(ctx: &Ctx, a: &BurstArgs) -> Result<Record> {
    let mut r = ctx.sub_record(
        "burst",
        format!(
            "subs={} events={} bytes={} pause_ms={}",
            a.subs, a.events, a.bytes, a.pause_ms
        ),
    );
    let names = ctx.streams("u", 1).await?;
    let paths = ctx.pub_paths(&names);
    let trackers = (0..a.subs).map(|i| Tracker::new(i, 0)).collect();
    let group = Group::spawn(ctx, &names, trackers, false);
    group.board.wait_connected(a.subs, ctx.timeout).await?;
    let connect = group.board.connect_times();
    group.warm_up(ctx, &paths).await?;

    let mut client = Client::new(ctx.publ.addr);
    let (mut data, mut body) = (Vec::new(), Vec::new());
    let mut all = histogram();
    let mut ack = histogram();
    let (mut last, mut p50, mut p99) = (Vec::new(), Vec::new(), Vec::new());
    let mut published = 0u64;
    let subs = a.subs as u64;
    let meter = Meter::start(&ctx.server)?;
    for k in 1..=a.events {
        group.board.reset_latency();
        payload::encode(&mut data, k, now_us(), a.bytes);
        ctx.wire.wrap(&mut data);
        let req = request(
            "POST",
            &ctx.publ.host,
            &paths[0],
            &[("Content-Type", ctx.wire.content_type())],
            &data,
        );
        let t = Instant::now();
        let status = client.call(&req, &mut body).await?;
        if !(200..300).contains(&status) {
            r.problem(format!(
                "publish {k} answered {status}: {}",
                String::from_utf8_lossy(&body)
            ));
            break;
        }
        ack.saturating_record(t.elapsed().as_micros() as u64);
        published = k;
        if !group
            .board
            .wait_delivered(k * subs, ctx.timeout, a.subs)
            .await
        {
            r.problem(format!(
                "event {k}: only {} of {} deliveries within {:?}",
                group.board.delivered.load(Ordering::Acquire) - (k - 1) * subs,
                subs,
                ctx.timeout
            ));
            break;
        }
        let h = group.board.latency();
        let _ = all.add(&h);
        last.push(ms(h.max()));
        p50.push(ms(h.value_at_quantile(0.5)));
        p99.push(ms(h.value_at_quantile(0.99)));
        tokio::time::sleep(Duration::from_millis(a.pause_ms)).await;
    }
    let usage = meter.stop()?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let delivered = group.board.delivered.load(Ordering::Acquire);
    let board = group.board.clone();
    let trackers = group.finish().await?;

    r.metric("subscribers", a.subs as f64);
    r.metric("connect_p99_ms", ms(connect.value_at_quantile(0.99)));
    r.metric("events_published", published as f64);
    r.metric("deliveries", delivered as f64);
    for (k, v) in last.iter().enumerate() {
        r.metric(&format!("event{}_to_last_ms", k + 1), *v);
    }
    let worst = last.iter().copied().fold(0.0, f64::max);
    r.metric("to_last_median_ms", median(&mut last));
    r.metric("to_last_max_ms", worst);
    r.metric("p50_median_ms", median(&mut p50));
    r.metric("p99_median_ms", median(&mut p99));
    r.metric("ack_median_ms", ms(ack.value_at_quantile(0.5)));
    ds_metrics(ctx, &mut r, &board);
    r.latency("latency", &all);
    // The pauses are in the measured phase: CPU per delivery includes what the server
    // spends idle between events (heartbeats), which is small beside the fan-out.
    cpu_metrics(&mut r, &usage, delivered, "delivery");
    delivery_problems(&mut r, &trackers, |_| published, true);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }

    #[test]
    fn multi_tracker_counts_per_channel() {
        let t = Tracker::multi(7, vec![3, 5]);
        assert_eq!(t.channel, 3);
        let per = t.flatten();
        assert_eq!(per.len(), 2);
        assert_eq!((per[0].id, per[0].channel), (7, 3));
        assert_eq!((per[1].id, per[1].channel), (7, 5));
    }
}
