//! Session lifecycle rules over the in-memory journal.

use gapless_core::hub::{Channels, Hub, WindowLimits};
use gapless_core::memory::MemoryJournal;
use gapless_core::session::{SessionConfig, SessionError, Sessions, Status};
use gapless_core::{Journal, Retention};
use gapless_protocol::NewEvent;
use std::sync::Arc;

fn hub() -> Hub {
    let channels = Arc::new(Channels::new(WindowLimits::default()));
    let journal: Arc<dyn Journal> =
        Arc::new(MemoryJournal::new(Retention::default(), channels.clone()));
    Hub::new(channels, journal)
}

fn ev(data: &str) -> Vec<NewEvent> {
    vec![NewEvent {
        event_type: None,
        data: data.into(),
    }]
}

#[tokio::test]
async fn recreating_an_ended_session_does_not_reopen_it() {
    let hub = hub();
    let sessions = Sessions::new(SessionConfig::default());
    sessions
        .create(&hub, Some("s1".into()))
        .await
        .expect("create");
    sessions
        .append(&hub, "s1", ev("a"), None)
        .await
        .expect("append");
    sessions
        .end(&hub, "s1", Status::Completed)
        .await
        .expect("complete");
    assert!(matches!(
        sessions.create(&hub, Some("s1".into())).await,
        Err(SessionError::Exists(_))
    ));
    assert_eq!(
        sessions.info(&hub, "s1").await.expect("info").status,
        Status::Completed
    );
    assert!(matches!(
        sessions.append(&hub, "s1", ev("late"), None).await,
        Err(SessionError::Ended {
            status: Status::Completed,
            ..
        })
    ));
    // A fresh registry (as after a restart) reads the status from the journal.
    let after_restart = Sessions::new(SessionConfig::default());
    assert!(matches!(
        after_restart.create(&hub, Some("s1".into())).await,
        Err(SessionError::Exists(_))
    ));
    assert_eq!(
        after_restart.info(&hub, "s1").await.expect("info").status,
        Status::Completed
    );
}

#[tokio::test]
async fn grace_window_cancels_a_detached_session() {
    let hub = hub();
    let sessions = Sessions::new(SessionConfig {
        grace_ms: 50,
        resume: true,
    });
    sessions
        .create(&hub, Some("g".into()))
        .await
        .expect("create");
    tokio::time::sleep(std::time::Duration::from_millis(120)).await;
    sessions.sweep(&hub).await.expect("sweep");
    assert_eq!(
        sessions.info(&hub, "g").await.expect("info").status,
        Status::Cancelled
    );
}

/// A session's end closes its channel: the journal itself refuses a plain
/// append after it (so a publish racing another node's end cannot land),
/// and the channel's metadata says closed.
#[tokio::test]
async fn an_ended_session_is_a_closed_channel() {
    let hub = hub();
    let sessions = Sessions::new(SessionConfig::default());
    sessions
        .create(&hub, Some("s2".into()))
        .await
        .expect("create");
    let (meta, _) = hub.meta("session/s2").await.expect("meta");
    assert!(
        meta.is_some_and(|m| !m.is_closed()),
        "created with metadata"
    );
    sessions
        .end(&hub, "s2", Status::Cancelled)
        .await
        .expect("cancel");
    let (meta, _) = hub.meta("session/s2").await.expect("meta");
    assert!(meta.is_some_and(|m| m.is_closed()));
    assert!(matches!(
        hub.publish("session/s2", ev("late"), None).await,
        Err(gapless_core::JournalError::ChannelClosed)
    ));
    assert_eq!(
        Sessions::new(SessionConfig::default())
            .info(&hub, "s2")
            .await
            .expect("info")
            .status,
        Status::Cancelled
    );
}

/// A session written by a release before channel metadata (its markers
/// only) is given its metadata when first touched, open or ended as its
/// markers say, and then behaves as any other.
#[tokio::test]
async fn a_session_of_markers_only_is_given_its_metadata() {
    let hub = hub();
    let marker = |t: &str| {
        vec![NewEvent {
            event_type: Some(t.to_owned()),
            data: "".into(),
        }]
    };
    hub.publish("session/old", marker("gapless.session.opened"), None)
        .await
        .expect("opened");
    hub.publish("session/old", ev("a"), None).await.expect("a");
    hub.publish("session/done", marker("gapless.session.opened"), None)
        .await
        .expect("opened");
    hub.publish("session/done", marker("gapless.session.completed"), None)
        .await
        .expect("completed");
    let sessions = Sessions::new(SessionConfig::default());
    let info = sessions.info(&hub, "old").await.expect("info");
    assert_eq!((info.status, info.head), (Status::Open, 2));
    assert!(hub.meta("session/old").await.expect("meta").0.is_some());
    let done = sessions.info(&hub, "done").await.expect("info");
    assert_eq!(done.status, Status::Completed);
    let (meta, _) = hub.meta("session/done").await.expect("meta");
    assert!(meta.is_some_and(|m| m.is_closed()), "imported closed");
    sessions
        .append(&hub, "old", ev("b"), None)
        .await
        .expect("append");
    sessions
        .end(&hub, "old", Status::Completed)
        .await
        .expect("complete");
    assert!(matches!(
        hub.publish("session/old", ev("late"), None).await,
        Err(gapless_core::JournalError::ChannelClosed)
    ));
}
