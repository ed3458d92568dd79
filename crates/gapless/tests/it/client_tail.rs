//! `gapless tail` survives its server being killed (SIGKILL) and restarted in
//! the middle of a stream, twice, while a publisher keeps publishing: every
//! event is printed exactly once, in order.

use gapless_testkit::clients::{self, publish_surely, Tail};
use std::time::Duration;

#[tokio::test]
async fn tail_survives_kill9_and_restart_mid_stream_with_no_lost_or_duplicated_line() {
    let mut server = clients::durable(&[]).await;
    let client = server.client();
    let tail = Tail::start(&["k", "--since", "earliest", "--server", &server.base()]);
    publish_surely(&client, "k", "m1").await;
    tail.wait_for(1, 20).await;

    const N: usize = 150;
    let publisher = {
        let client = client.clone();
        tokio::spawn(async move {
            for i in 2..=N {
                publish_surely(&client, "k", &format!("m{i}")).await;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    for at in [40, 100] {
        tail.wait_for(at, 30).await;
        server.kill9().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.restart().await;
    }
    publisher.await.expect("publisher");
    tail.wait_for(N, 30).await;
    // Give a duplicate the chance to show up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lines = tail.lines.lock().expect("lock").clone();
    let want: Vec<String> = (1..=N).map(|i| format!("m{i}")).collect();
    assert_eq!(lines, want);
    let stderr = tail.stderr.lock().expect("lock").clone();
    assert!(
        stderr.iter().any(|l| l.contains("reconnecting")),
        "reconnections are reported on stderr: {stderr:?}"
    );
}
