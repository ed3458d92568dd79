//! Presence in the Rust client SDK (issue 21, "Presence"), against the real
//! server: `Client::presence`, `client_id` and `presence(true)` on both the
//! SSE and the WebSocket subscription, join and leave as
//! `Update::Presence`, and `presence_disabled`.

use gapless_client::{Client, ErrorCode, PresenceAction, PresenceNotice, Update, WsSubscription};
use gapless_testkit::{eventually, Opts, Server};
use std::time::Duration;
use tokio::time::timeout;

async fn server(dir: &tempfile::TempDir) -> Server {
    let p = dir.path().join("g.toml");
    std::fs::write(
        &p,
        "[namespaces.room]\npresence = true\npresence_linger_ms = 0\n",
    )
    .expect("write config");
    Server::with(Opts {
        args: vec!["--config".into(), p.display().to_string()],
        ..Opts::default()
    })
    .await
}

fn notice(action: PresenceAction, id: &str) -> Update {
    Update::Presence(PresenceNotice {
        action,
        channel: "room:a".into(),
        id: id.into(),
    })
}

async fn next_sse(sub: &mut gapless_client::Subscription) -> Update {
    timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("an update within 10 s")
        .expect("the subscription goes on")
        .expect("no error")
}

async fn next_ws(sub: &mut WsSubscription) -> Update {
    timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("an update within 10 s")
        .expect("the subscription goes on")
        .expect("no error")
}

async fn members(client: &Client) -> Vec<(String, usize)> {
    client
        .presence("room:a")
        .await
        .expect("presence")
        .members
        .into_iter()
        .map(|m| (m.id, m.connections))
        .collect()
}

#[tokio::test]
async fn the_rust_sdk_reads_presence_and_gets_join_and_leave() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(&dir).await;
    let client = s.client();
    let empty = client.presence("room:a").await.expect("presence");
    assert_eq!((empty.channel.as_str(), empty.occupancy), ("room:a", 0));
    assert!(empty.members.is_empty());
    // Watchers over SSE and WebSocket.
    let mut sse = client
        .subscribe(["room:a"])
        .presence(true)
        .connect()
        .await
        .expect("sse");
    let mut ws = client
        .subscribe_ws(["room:a"])
        .presence(true)
        .connect()
        .await
        .expect("ws");
    // Ana over WebSocket, Bob over SSE.
    let ana = client
        .subscribe_ws(["room:a"])
        .client_id("ana")
        .connect()
        .await
        .expect("ana");
    assert_eq!(
        next_sse(&mut sse).await,
        notice(PresenceAction::Join, "ana")
    );
    assert_eq!(next_ws(&mut ws).await, notice(PresenceAction::Join, "ana"));
    let bob = client
        .subscribe(["room:a"])
        .client_id("bob")
        .connect()
        .await
        .expect("bob");
    assert_eq!(
        next_sse(&mut sse).await,
        notice(PresenceAction::Join, "bob")
    );
    assert_eq!(next_ws(&mut ws).await, notice(PresenceAction::Join, "bob"));
    let p = client.presence("room:a").await.expect("presence");
    assert_eq!(p.occupancy, 4);
    assert_eq!(
        members(&client).await,
        vec![("ana".to_owned(), 1), ("bob".to_owned(), 1)]
    );
    // Notices move no cursor: the SSE subscription's stays where it was.
    let before = sse.cursor();
    drop(bob);
    assert_eq!(
        next_sse(&mut sse).await,
        notice(PresenceAction::Leave, "bob")
    );
    assert_eq!(next_ws(&mut ws).await, notice(PresenceAction::Leave, "bob"));
    assert_eq!(sse.cursor(), before);
    drop(ana);
    assert_eq!(
        next_sse(&mut sse).await,
        notice(PresenceAction::Leave, "ana")
    );
    eventually("no members", Duration::from_secs(10), || async {
        members(&client).await.is_empty()
    })
    .await;
}

#[tokio::test]
async fn the_rust_sdk_is_told_presence_disabled_and_bad_client_ids() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(&dir).await;
    let client = s.client();
    let e = client.presence("news").await.expect_err("no presence");
    let api = e.api().expect("an API error");
    assert_eq!(
        (api.status, api.error_code()),
        (404, Some(ErrorCode::PresenceDisabled))
    );
    let e = client
        .subscribe(["news"])
        .presence(true)
        .connect()
        .await
        .expect_err("no presence");
    assert_eq!(
        e.api().and_then(|a| a.error_code()),
        Some(ErrorCode::PresenceDisabled),
        "{e}"
    );
    let e = client
        .subscribe_ws(["news"])
        .presence(true)
        .connect()
        .await
        .expect_err("no presence");
    assert_eq!(
        e.api().and_then(|a| a.error_code()),
        Some(ErrorCode::PresenceDisabled),
        "{e}"
    );
    for bad in ["a b", ""] {
        let e = client
            .subscribe(["room:a"])
            .client_id(bad)
            .connect()
            .await
            .expect_err("a bad client_id");
        assert_eq!(e.api().map(|a| a.status), Some(400), "{bad:?}: {e}");
    }
}
