//! An early refusal reaches the client: a request refused before its body is
//! read (413 over a limit) is answered, and the client reads the whole answer
//! even though it is still sending its body. The server closes such a
//! connection with a lingering close (`crates/server/src/net/conn.rs`): it
//! shuts its sending side, reads and drops what the client still sends
//! (bounded in bytes and time), then closes. A plain close with unread bytes
//! would send a reset, which can destroy the answer in the client's socket
//! before it is read ("other side closed").

use gapless_testkit::Server;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The body each client sends: 10 MiB, as the Durable Streams conformance
/// test "should handle large payload appropriately" does.
const BODY: usize = 10 << 20;
/// How many times each case is tried: a reset loses the answer only some of
/// the time, so once would pass by luck.
const ROUNDS: usize = 20;

/// How the body is framed.
#[derive(Clone, Copy, Debug)]
enum Framing {
    Length,
    Chunked,
}

/// Sends `POST path` with a 10 MiB body in 64 KiB writes with small pauses,
/// while reading the answer; returns the status and the JSON body, or what
/// went wrong (a reset before the whole answer was read, say).
async fn post_big(
    addr: std::net::SocketAddr,
    path: &str,
    content_type: &str,
    framing: Framing,
) -> Result<(u16, serde_json::Value), String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut rd, mut wr) = tcp.into_split();
    let framing_header = match framing {
        Framing::Length => format!("content-length: {BODY}\r\n"),
        Framing::Chunked => "transfer-encoding: chunked\r\n".to_owned(),
    };
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: {content_type}\r\n{framing_header}\r\n"
    );
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await?;
        let chunk = vec![b'x'; 64 << 10];
        let mut sent = 0;
        while sent < BODY {
            let n = chunk.len().min(BODY - sent);
            match framing {
                Framing::Length => wr.write_all(&chunk[..n]).await?,
                Framing::Chunked => {
                    wr.write_all(format!("{n:x}\r\n").as_bytes()).await?;
                    wr.write_all(&chunk[..n]).await?;
                    wr.write_all(b"\r\n").await?;
                }
            }
            sent += n;
            if sent % (1 << 20) == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        if let Framing::Chunked = framing {
            wr.write_all(b"0\r\n\r\n").await?;
        }
        Ok::<_, std::io::Error>(wr)
    });
    let answer = tokio::time::timeout(Duration::from_secs(30), async {
        // A busy client reads late (the conformance suite's runs under
        // load): by then the server has answered and closed.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 16 << 10];
        loop {
            if let Some(parsed) = parse(&got) {
                return Ok(parsed);
            }
            match rd.read(&mut buf).await {
                Ok(0) => {
                    return Err(format!(
                        "closed after {} bytes of the answer: {:?}",
                        got.len(),
                        String::from_utf8_lossy(&got)
                    ))
                }
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => {
                    return Err(format!(
                        "{e} after {} bytes of the answer: {:?}",
                        got.len(),
                        String::from_utf8_lossy(&got)
                    ))
                }
            }
        }
    })
    .await
    .map_err(|_| "no answer within 30 s".to_owned())?;
    let answer = answer?;
    // The client sent its whole body: the server read and dropped the rest
    // rather than resetting the connection, which a client still writing
    // sees as a failure and may lose the answer to.
    match writer.await {
        Ok(Ok(_)) => Ok(answer),
        Ok(Err(e)) => Err(format!("sending the body failed: {e} (a reset)")),
        Err(e) => Err(format!("the writer failed: {e}")),
    }
}

/// The status and JSON body of a whole answer in `got` (framed by
/// `content-length`), or `None` while it is not whole.
fn parse(got: &[u8]) -> Option<(u16, serde_json::Value)> {
    let end = got.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
    let status: u16 = head.split_whitespace().nth(1)?.parse().ok()?;
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))?
        .trim()
        .parse()
        .ok()?;
    if got.len() < end + len {
        return None;
    }
    let mut body = serde_json::from_slice(&got[end..end + len]).unwrap_or(serde_json::Value::Null);
    // Whether the answer says the connection closes (noted in the body for
    // the caller, which checks it).
    body["closes"] = head.contains("\r\nconnection: close\r\n").into();
    Some((status, body))
}

async fn check_rounds(s: &Server, path: &str, content_type: &str, framing: Framing, flag: &str) {
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        match post_big(s.addr, path, content_type, framing).await {
            Ok((413, body)) => {
                assert_eq!(body["error"], "too_large", "{body}");
                assert_eq!(body["closes"], true, "says connection: close: {body}");
                assert_eq!(body["limit"], 1048576, "{body}");
                assert!(
                    body["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(flag) && m.contains("1048576")),
                    "the error names the limit: {body}"
                );
            }
            Ok((status, body)) => panic!("{path} {framing:?}: {status} {body}, not 413"),
            Err(e) => failures.push(format!("round {round}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{path} {framing:?}: {} of {ROUNDS} clients lost the 413: {failures:#?}",
        failures.len()
    );
}

#[tokio::test]
async fn a_publish_over_the_limit_gets_its_413_while_still_sending() {
    let s = Server::start(&[]).await;
    for framing in [Framing::Length, Framing::Chunked] {
        check_rounds(
            &s,
            "/v1/channels/c/events",
            "application/octet-stream",
            framing,
            "--max-event-bytes",
        )
        .await;
    }
}

#[tokio::test]
async fn a_durable_streams_append_over_the_limit_gets_its_413_while_still_sending() {
    // Under --max-batch-bytes (which the body is read up to) the body is
    // read whole and refused by --max-event-bytes; over it, refused early.
    let s = Server::start(&["--ds-prefix", "/ds", "--max-batch-bytes", "1048576"]).await;
    let created = s
        .http
        .put(s.url("/ds/s"))
        .header("content-type", "application/octet-stream")
        .send()
        .await
        .expect("PUT");
    assert!(created.status().is_success(), "{}", created.status());
    for framing in [Framing::Length, Framing::Chunked] {
        check_rounds(
            &s,
            "/ds/s",
            "application/octet-stream",
            framing,
            "--max-batch-bytes",
        )
        .await;
    }
}

#[tokio::test]
async fn a_client_that_keeps_trickling_after_a_refusal_is_closed_within_bounds() {
    // The lingering close reads for at most 2 s (`LINGER` in net/conn.rs):
    // a client that keeps sending slowly cannot hold the connection.
    let s = Server::start(&[]).await;
    let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
    let head = format!(
        "POST /v1/channels/c/events HTTP/1.1\r\nhost: test\r\ncontent-length: {BODY}\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.expect("head");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while parse(&got).is_none() {
        let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf))
            .await
            .expect("an answer within 10 s")
            .expect("read");
        assert!(n > 0, "closed before the answer");
        got.extend_from_slice(&buf[..n]);
    }
    let (status, body) = parse(&got).expect("parsed");
    assert_eq!(status, 413, "{body}");
    // Keep sending a byte every 50 ms: the server stops reading and closes
    // (the writes then fail) well within 15 s.
    let started = std::time::Instant::now();
    let closed = loop {
        if tcp.write_all(b"x").await.is_err() {
            break true;
        }
        if started.elapsed() > Duration::from_secs(15) {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        closed,
        "the connection was still open after 15 s of trickling"
    );
}
