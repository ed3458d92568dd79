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
