//! Socket options on accepted stream sockets (`--tcp-keepalive-ms`), read back
//! from the kernel with `ss`, so that a client that vanishes without a FIN is
//! reaped even when nothing is in flight.

use gapless_testkit::Server;
use std::process::Command;

/// The `ss -o` lines of the server's established sockets on its port.
fn server_sockets(server: &Server) -> String {
    let port = server
        .base()
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_owned();
    let out = Command::new("ss")
        .args([
            "-tnoH",
            "state",
            "established",
            &format!("( sport = :{port} )"),
        ])
        .output()
        .expect("ss runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn stream_sockets_have_tcp_keepalive_by_setting() {
    if Command::new("ss").arg("-V").output().is_err() {
        eprintln!("ss is not installed; skipping");
        return;
    }
    let on = Server::memory(&["--tcp-keepalive-ms", "5000"]).await;
    let (_stream, _preamble) = on.subscribe("ka", "").await;
    let lines = server_sockets(&on);
    assert!(
        lines.contains("keepalive"),
        "expected a keepalive timer on the server's socket, ss says: {lines:?}"
    );

    let off = Server::memory(&["--tcp-keepalive-ms", "0"]).await;
    let (_stream, _preamble) = off.subscribe("ka", "").await;
    let lines = server_sockets(&off);
    assert!(!lines.trim().is_empty(), "the stream's socket is listed");
    assert!(
        !lines.contains("keepalive"),
        "--tcp-keepalive-ms 0 must leave keepalive off, ss says: {lines:?}"
    );
}
