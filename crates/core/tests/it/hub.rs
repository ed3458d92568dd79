//! Hub and subscription rules over the in-memory journal.

use gapless_core::hub::{Channels, Hub, WindowLimits};
use gapless_core::journal::{ChannelState, CommitSink};
use gapless_core::memory::MemoryJournal;
use gapless_core::subscription::{Item, Start, Subscription};
use gapless_core::{Journal, Retention};
use gapless_protocol::codes::GapReason;
use gapless_protocol::Event;
use gapless_protocol::{Epoch, NewEvent};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn hub(retention: Retention, window: usize) -> Hub {
    let channels = Arc::new(Channels::new(WindowLimits {
        max_events: window,
        ..WindowLimits::default()
    }));
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new(retention, channels.clone()));
    Hub::new(channels, journal)
}

fn ev(data: &str) -> Vec<NewEvent> {
    vec![NewEvent {
        event_type: None,
        data: data.into(),
    }]
}

async fn next_seqs(sub: &mut Subscription, n: usize) -> Vec<u64> {
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(Duration::from_secs(2), sub.next()).await {
            Ok(Ok(Item::Events { events, .. })) => out.extend(events.iter().map(|e| e.seq)),
            other => panic!("unexpected {other:?}"),
        }
    }
    out
}

#[tokio::test]
async fn live_subscriber_sees_only_new_events() {
    let hub = hub(Retention::default(), 16);
    hub.publish("c", ev("old"), None).await.expect("publish");
    let (mut sub, gaps) = hub
        .subscribe(vec![("c".into(), Start::Live)], 8, None)
        .await
        .expect("subscribe");
    assert!(gaps.is_empty());
    hub.publish("c", ev("new"), None).await.expect("publish");
    assert_eq!(next_seqs(&mut sub, 1).await, vec![2]);
}

#[tokio::test]
async fn reader_behind_window_reads_journal_in_order() {
    let hub = hub(Retention::default(), 4);
    let (mut sub, _) = hub
        .subscribe(vec![("c".into(), Start::Earliest)], 3, None)
        .await
        .expect("subscribe");
    for i in 0..50 {
        hub.publish("c", ev(&i.to_string()), None)
            .await
            .expect("publish");
    }
    assert_eq!(next_seqs(&mut sub, 50).await, (1..=50).collect::<Vec<_>>());
}

#[tokio::test]
async fn resume_gaps_name_their_reason() {
    let hub = hub(
        Retention {
            max_events: 3,
            max_age_ms: 0,
            max_bytes: 0,
        },
        16,
    );
    for i in 0..10 {
        hub.publish("c", ev(&i.to_string()), None)
            .await
            .expect("publish");
    }
    let epoch = hub.state("c").await.expect("state").epoch;
    let cases = [
        (Start::After { epoch, seq: 2 }, Some(GapReason::Evicted)),
        (Start::After { epoch, seq: 11 }, Some(GapReason::Ahead)),
        (
            Start::After {
                epoch: Epoch(epoch.0 ^ 1),
                seq: 9,
            },
            Some(GapReason::Epoch),
        ),
        (Start::Unknown, Some(GapReason::Unknown)),
        (Start::After { epoch, seq: 7 }, None),
    ];
    for (start, want) in cases {
        let (_, gaps) = hub
            .subscribe(vec![("c".into(), start)], 8, None)
            .await
            .expect("subscribe");
        assert_eq!(gaps.first().map(|g| g.reason), want, "{start:?}");
        if let Some(g) = gaps.first() {
            assert_eq!(g.next, (epoch, 10));
        }
    }
}

/// `Start::Last(n)`: the last n retained events (all retained when fewer);
/// `Start::Time(t)`: from the first retained event at or after t, live when
/// none is, and from the floor with an `evicted` gap (seqs 1 to the floor)
/// when an evicted event may be at or after t.
#[tokio::test]
async fn last_and_time_starts() {
    let hub = hub(
        Retention {
            max_events: 5,
            max_age_ms: 0,
            max_bytes: 0,
        },
        16,
    );
    for i in 1..=8 {
        hub.publish("c", ev(&i.to_string()), None)
            .await
            .expect("publish");
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let page = hub.read("c", 0, 10, usize::MAX).await.expect("read");
    let epoch = page.state.epoch;
    let time = |seq: u64| page.events[(seq - 4) as usize].time;
    let cases = [
        (Start::Last(1), 7, None),
        (Start::Last(3), 5, None),
        (Start::Last(5), 3, None),
        (Start::Last(1000), 3, None),
        (Start::Time(time(6)), 5, None),
        (Start::Time(time(6) - 1), 5, None),
        (Start::Time(time(8) + 1), 8, None),
        (Start::Time(time(4)), 3, Some((epoch, 0))),
        (Start::Time(0), 3, Some((epoch, 0))),
    ];
    for (start, pos, gap_after) in cases {
        let (sub, gaps) = hub
            .subscribe(vec![("c".into(), start)], 8, None)
            .await
            .expect("subscribe");
        assert_eq!(sub.position(0), (epoch, pos), "{start:?}");
        let gap = gaps.first().map(|g| (g.after, g.next, g.reason));
        let want = gap_after.map(|a| (Some(a), (epoch, 3), GapReason::Evicted));
        assert_eq!(gap, want, "{start:?}");
    }
}

#[tokio::test]
async fn slow_reader_passed_by_retention_gets_evicted_gap_then_continues() {
    let hub = hub(
        Retention {
            max_events: 5,
            max_age_ms: 0,
            max_bytes: 0,
        },
        16,
    );
    let (mut sub, _) = hub
        .subscribe(vec![("c".into(), Start::Live)], 8, None)
        .await
        .expect("subscribe");
    for i in 0..12 {
        hub.publish("c", ev(&i.to_string()), None)
            .await
            .expect("publish");
    }
    match sub.next().await.expect("next") {
        Item::Gap(g) => {
            assert_eq!(g.reason, GapReason::Evicted);
            assert_eq!(g.after.map(|a| a.1), Some(0));
            assert_eq!(g.next.1, 7, "hole is 1..=7, floor is 8");
        }
        other => panic!("expected a gap, got {other:?}"),
    }
    assert_eq!(next_seqs(&mut sub, 5).await, vec![8, 9, 10, 11, 12]);
}

#[tokio::test]
async fn multi_channel_cursor_and_ephemeral() {
    let hub = hub(Retention::default(), 16);
    let (mut sub, _) = hub
        .subscribe(
            vec![("a".into(), Start::Live), ("b".into(), Start::Live)],
            8,
            None,
        )
        .await
        .expect("subscribe");
    hub.publish("b", ev("b1"), None).await.expect("publish");
    match sub.next().await.expect("next") {
        Item::Events { index, events } => {
            assert_eq!(index, 1);
            assert_eq!(events[0].data, "b1");
        }
        other => panic!("{other:?}"),
    }
    let cursor = sub.cursor();
    assert_eq!(cursor.get("b").map(|p| p.seq), Some(1));
    assert_eq!(cursor.get("a").map(|p| p.seq), Some(0));
    assert_eq!(hub.publish_ephemeral("a", None, "typing".into()), 1);
    match sub.next().await.expect("next") {
        Item::Ephemeral(e) => assert_eq!(e.data, "typing"),
        other => panic!("{other:?}"),
    }
    assert_eq!(hub.subscribers("a"), 1);
    drop(sub);
    assert_eq!(hub.subscribers("a"), 0);
}

#[tokio::test]
async fn idempotent_publish_returns_original_seq() {
    let hub = hub(Retention::default(), 16);
    let a = hub
        .publish("c", ev("x"), Some("k1"))
        .await
        .expect("publish");
    let b = hub
        .publish("c", ev("x"), Some("k1"))
        .await
        .expect("publish");
    assert!(!a.duplicate);
    assert!(b.duplicate);
    assert_eq!(a.last_seq, b.last_seq);
    let other = hub
        .publish("d", ev("x"), Some("k1"))
        .await
        .expect("publish");
    assert!(!other.duplicate, "keys are per channel");
    assert_eq!(hub.state("c").await.expect("state").head, 1);
}

/// Forwards commit notices to the hub's channels, unless held back: a notice
/// still on its way while the channel's head is already known elsewhere.
struct Gate {
    channels: Arc<Channels>,
    held: AtomicBool,
}

impl CommitSink for Gate {
    fn committed(&self, channel: &str, state: ChannelState, events: &[Arc<Event>]) {
        if !self.held.load(Ordering::SeqCst) {
            self.channels.committed(channel, state, events);
        }
    }
    fn evicted(&self, channel: &str, state: ChannelState) {
        self.channels.evicted(channel, state);
    }
}

/// A tester's finding in `Cell::pending`: with the head past the newest
/// event of the window (the head learnt from a state report before the
/// commit notice of its events), a reader at the window's last event got an
/// empty batch, which reads as "at the head", and slept until the next
/// publish or timer instead of reading the journal at once.
#[tokio::test]
async fn a_reader_at_the_end_of_the_window_reads_the_journal_when_the_head_is_past_it() {
    let channels = Arc::new(Channels::new(WindowLimits::default()));
    let gate = Arc::new(Gate {
        channels: channels.clone(),
        held: AtomicBool::new(false),
    });
    let journal: Arc<dyn Journal> =
        Arc::new(MemoryJournal::new(Retention::default(), gate.clone()));
    let hub = Hub::new(channels.clone(), journal.clone());
    let (mut sub, _) = hub
        .subscribe(vec![("c".into(), Start::Live)], 8, None)
        .await
        .expect("subscribe");
    for i in 1..=3 {
        hub.publish("c", ev(&i.to_string()), None)
            .await
            .expect("publish");
    }
    assert_eq!(next_seqs(&mut sub, 3).await, vec![1, 2, 3]);
    // Events 4 and 5 are in the journal; their notice has not reached the window.
    gate.held.store(true, Ordering::SeqCst);
    for i in 4..=5 {
        hub.publish("c", ev(&i.to_string()), None)
            .await
            .expect("publish");
    }
    // A report of the channel's state (head 5) arrives first and wakes the reader.
    let state = journal.state("c").await.expect("state");
    assert_eq!(state.head, 5);
    channels.evicted("c", state);
    // Nothing else will wake it: it must read 4 and 5 from the journal now.
    match tokio::time::timeout(Duration::from_millis(500), sub.next()).await {
        Ok(Ok(Item::Events { events, .. })) => {
            assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![4, 5]);
        }
        Ok(other) => panic!("unexpected {other:?}"),
        Err(_) => panic!("the reader slept with events 4 and 5 in the journal and the head at 5"),
    }
}

/// Counts the wake-ups of a waiting subscription.
struct Wakes(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_wake_group_wakes_its_subscribers_only_and_a_commit_wakes_every_group_and_those_in_none()
{
    use std::future::Future;
    use std::task::{Context, Poll};
    let hub = hub(Retention::default(), 16);
    let mut subs = Vec::new();
    for group in 0..gapless_core::hub::WAKE_GROUPS {
        let (sub, _) = hub
            .subscribe(vec![("c".into(), Start::Live)], 8, Some(group))
            .await
            .expect("subscribe");
        subs.push(sub);
    }
    // And one in no group (a subscriber no clock wakes).
    let (sub, _) = hub
        .subscribe(vec![("c".into(), Start::Live)], 8, None)
        .await
        .expect("subscribe");
    subs.push(sub);
    // Each subscription waits, with a waker that counts.
    let wakes: Vec<Arc<Wakes>> = (0..subs.len())
        .map(|_| Arc::new(Wakes(std::sync::atomic::AtomicUsize::new(0))))
        .collect();
    let mut waits: Vec<_> = subs.iter_mut().map(|s| Box::pin(s.next())).collect();
    fn poll_all<F: Future>(waits: &mut [std::pin::Pin<Box<F>>], wakes: &[Arc<Wakes>]) {
        for (w, n) in waits.iter_mut().zip(wakes) {
            let waker = std::task::Waker::from(n.clone());
            assert!(matches!(
                w.as_mut().poll(&mut Context::from_waker(&waker)),
                Poll::Pending
            ));
        }
    }
    fn counts(wakes: &[Arc<Wakes>]) -> Vec<usize> {
        wakes.iter().map(|w| w.0.load(Ordering::SeqCst)).collect()
    }
    poll_all(&mut waits, &wakes);
    hub.wake_group(Some(2));
    assert_eq!(counts(&wakes), vec![0, 0, 1, 0, 0], "only group 2 is woken");
    poll_all(&mut waits, &wakes);
    hub.wake_group(Some(2 + gapless_core::hub::WAKE_GROUPS));
    assert_eq!(
        counts(&wakes),
        vec![0, 0, 2, 0, 0],
        "groups are taken modulo"
    );
    poll_all(&mut waits, &wakes);
    for g in [0, 1, 3] {
        hub.wake_group(Some(g));
    }
    assert_eq!(
        counts(&wakes),
        vec![1, 1, 2, 1, 0],
        "no step wakes a subscriber in no group"
    );
    poll_all(&mut waits, &wakes);
    hub.wake_group(None);
    assert_eq!(
        counts(&wakes),
        vec![2, 2, 3, 2, 1],
        "None wakes every group and those in none"
    );
    drop(waits);
    // A commit reaches every group, and each reads the event.
    hub.publish("c", ev("x"), None).await.expect("publish");
    for sub in &mut subs {
        assert_eq!(next_seqs(sub, 1).await, vec![1]);
    }
}
