//! One WebSocket connection speaking the subprotocol `gapless.v1`
//! (`docs/protocol.md`): the handshake, JSON text messages in and out, and
//! close codes mapped to [`Error`].
//!
//! WebSocket subscriptions ([`crate::ws_subscribe`]) and session consumers
//! ([`crate::session`]) build their reconnecting logic on top of this; a
//! [`Socket`] itself never reconnects.

use crate::client::Client;
use crate::error::{describe_io, ApiError, Error};
use futures::{SinkExt, StreamExt};
use serde::de::DeserializeOwned;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::WebSocketStream;

/// The subprotocol gapless speaks.
pub(crate) const SUBPROTOCOL: &str = "gapless.v1";

/// Close code: normal closure (a session ended and everything was delivered).
pub(crate) const NORMAL: u16 = 1000;
/// Close code: the server is shutting down; reconnect and resume.
pub(crate) const GOING_AWAY: u16 = 1001;
/// Close code of a refused or expired token (`docs/security.md`).
pub(crate) const UNAUTHORIZED: u16 = 4401;

/// An open WebSocket.
pub(crate) struct Socket {
    ws: WebSocketStream<TcpStream>,
    server: String,
    idle_timeout: Option<Duration>,
}

/// What one read brought.
#[derive(Debug)]
pub(crate) enum Incoming<T> {
    /// A JSON message of the endpoint's shape.
    Message(T),
    /// The answer to a ping this client sent.
    Pong,
    /// The server closed the socket: its close code (`None`: a close frame
    /// without one) and reason.
    Closed(Option<u16>, String),
}

/// Opens `path` (e.g. `/v1/ws`, with its query) on the client's server,
/// offering `gapless.v1`, with incoming messages limited to
/// `max_message_bytes`.
///
/// # Errors
/// [`Error::Unreachable`] when no TCP connection can be made (within the
/// client's connect timeout); [`Error::Api`] when the server refuses the
/// handshake with an HTTP status (e.g. 400 for a malformed query);
/// [`Error::Protocol`] when the answer is not a `gapless.v1` WebSocket;
/// [`Error::Disconnected`] when the connection fails during the handshake or
/// the handshake takes longer than the client's request timeout.
pub(crate) async fn open(
    client: &Client,
    path: &str,
    idle_timeout: Option<Duration>,
    max_message_bytes: usize,
) -> Result<Socket, Error> {
    let base = &client.inner.base;
    // The builder checked the base: `http://authority[/prefix]`.
    let rest = base.strip_prefix("http://").unwrap_or(base);
    let authority = rest.split('/').next().unwrap_or(rest);
    let prefix = &rest[authority.len()..];
    let mut req = format!("ws://{authority}{prefix}{path}")
        .into_client_request()
        .map_err(|e| Error::InvalidUrl {
            url: base.clone(),
            detail: format!("cannot make a WebSocket request of it: {e}"),
        })?;
    req.headers_mut().insert(
        "sec-websocket-protocol",
        HeaderValue::from_static(SUBPROTOCOL),
    );
    if let Some(token) = client.inner.token().await? {
        let value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            Error::InvalidArgument("the token holds characters a header cannot carry".to_owned())
        })?;
        req.headers_mut().insert("authorization", value);
    }

    let host = authority.rsplit('@').next().unwrap_or(authority);
    let addr = if host.ends_with(']') || !host.contains(':') {
        format!("{host}:80")
    } else {
        host.to_owned()
    };
    let unreachable = |detail: String| Error::Unreachable {
        server: base.clone(),
        detail,
    };
    let connect_timeout = client.inner.connect_timeout;
    let tcp = tokio::time::timeout(connect_timeout, TcpStream::connect(addr.as_str()))
        .await
        .map_err(|_| unreachable("connect timed out".to_owned()))?
        .map_err(|e| unreachable(describe_io(&e)))?;
    let _ = tcp.set_nodelay(true);

    let config = WebSocketConfig::default()
        .max_message_size(Some(max_message_bytes))
        .max_frame_size(Some(max_message_bytes));
    let handshake = tokio_tungstenite::client_async_with_config(req, tcp, Some(config));
    let limit = client.inner.request_timeout;
    let (ws, _) = tokio::time::timeout(limit, handshake)
        .await
        .map_err(|_| Error::Disconnected {
            server: base.clone(),
            detail: format!(
                "the WebSocket handshake took longer than {} s",
                limit.as_secs_f64()
            ),
        })?
        .map_err(|e| handshake_error(base, e))?;
    Ok(Socket {
        ws,
        server: base.clone(),
        idle_timeout,
    })
}

fn handshake_error(server: &str, e: tungstenite::Error) -> Error {
    use tungstenite::error::ProtocolError as P;
    use tungstenite::Error as E;
    match e {
        E::Http(resp) => {
            let status = resp.status().as_u16();
            let body = resp.body().as_deref().unwrap_or_default();
            if status == 200 || status == 101 {
                Error::protocol(server, format!("status {status} to a WebSocket handshake"))
            } else {
                Error::Api(Box::new(ApiError::from_body(status, body)))
            }
        }
        E::Protocol(P::SecWebSocketSubProtocolError(_)) => Error::protocol(
            server,
            format!("the server did not select the WebSocket subprotocol {SUBPROTOCOL}"),
        ),
        E::Protocol(p @ (P::SecWebSocketAcceptKeyMismatch | P::CustomResponseSuccessful)) => {
            Error::protocol(server, format!("not a WebSocket answer: {p}"))
        }
        E::Url(u) => Error::InvalidUrl {
            url: server.to_owned(),
            detail: u.to_string(),
        },
        other => Error::Disconnected {
            server: server.to_owned(),
            detail: describe_ws(&other),
        },
    }
}

/// A short description of a WebSocket failure.
fn describe_ws(e: &tungstenite::Error) -> String {
    use tungstenite::error::ProtocolError as P;
    use tungstenite::Error as E;
    match e {
        E::Io(io) => describe_io(io),
        E::Protocol(P::ResetWithoutClosingHandshake) => {
            "the connection ended without a close frame".to_owned()
        }
        other => other.to_string(),
    }
}

impl Socket {
    /// Queues one JSON message; [`Socket::flush`] sends what is queued.
    ///
    /// # Errors
    /// [`Error::Disconnected`] when the connection failed.
    pub(crate) async fn feed(&mut self, msg: &impl serde::Serialize) -> Result<(), Error> {
        let text = serde_json::to_string(msg).map_err(|e| {
            Error::InvalidArgument(format!("cannot encode a WebSocket message: {e}"))
        })?;
        let r = self.ws.feed(Message::text(text)).await;
        r.map_err(|e| self.failed(&e))
    }

    /// Sends whatever [`Socket::feed`] queued.
    ///
    /// # Errors
    /// [`Error::Disconnected`] when the connection failed.
    pub(crate) async fn flush(&mut self) -> Result<(), Error> {
        let r = self.ws.flush().await;
        r.map_err(|e| self.failed(&e))
    }

    /// Sends a ping: the server answers it once it reads again.
    ///
    /// # Errors
    /// [`Error::Disconnected`] when the connection failed.
    pub(crate) async fn ping(&mut self) -> Result<(), Error> {
        self.send_raw(Message::Ping(Default::default())).await
    }

    async fn send_raw(&mut self, m: Message) -> Result<(), Error> {
        let r = self.ws.send(m).await;
        r.map_err(|e| self.failed(&e))
    }

    fn failed(&self, e: &tungstenite::Error) -> Error {
        Error::Disconnected {
            server: self.server.clone(),
            detail: describe_ws(e),
        }
    }

    /// The next message, skipping pings (answered as a side effect of
    /// reading). Cancel-safe: dropping the future loses nothing.
    ///
    /// # Errors
    /// [`Error::Disconnected`] when the connection failed, ended without a
    /// close frame, or was silent past the idle timeout (the server pings
    /// every `--heartbeat-ms`, so a healthy socket is never silent long);
    /// [`Error::EventTooLarge`] for a message over the limit;
    /// [`Error::Protocol`] for a binary frame or a text frame that is not
    /// JSON of the expected shape.
    pub(crate) async fn read<T: DeserializeOwned>(&mut self) -> Result<Incoming<T>, Error> {
        loop {
            let next = match self.idle_timeout {
                Some(d) => tokio::time::timeout(d, self.ws.next())
                    .await
                    .map_err(|_| Error::idle(&self.server, d))?,
                None => self.ws.next().await,
            };
            let msg = match next {
                None => {
                    return Err(Error::Disconnected {
                        server: self.server.clone(),
                        detail: "the connection ended without a close frame".to_owned(),
                    })
                }
                Some(Err(tungstenite::Error::Capacity(
                    tungstenite::error::CapacityError::MessageTooLong { max_size, .. },
                ))) => return Err(Error::EventTooLarge { limit: max_size }),
                Some(Err(tungstenite::Error::Utf8(detail))) => {
                    return Err(Error::protocol(
                        &self.server,
                        format!("a text frame that is not UTF-8: {detail}"),
                    ))
                }
                Some(Err(e)) => return Err(self.failed(&e)),
                Some(Ok(m)) => m,
            };
            match msg {
                Message::Text(t) => {
                    return serde_json::from_str(t.as_str())
                        .map(Incoming::Message)
                        .map_err(|e| {
                            let mut shown = t.as_str().to_owned();
                            if shown.len() > 200 {
                                let mut end = 200;
                                while !shown.is_char_boundary(end) {
                                    end -= 1;
                                }
                                shown.truncate(end);
                                shown.push('…');
                            }
                            Error::protocol(
                                &self.server,
                                format!("unexpected WebSocket message {shown:?}: {e}"),
                            )
                        })
                }
                Message::Binary(_) => {
                    return Err(Error::protocol(
                        &self.server,
                        "a binary WebSocket frame (gapless sends JSON text only)",
                    ))
                }
                Message::Pong(_) => return Ok(Incoming::Pong),
                Message::Close(frame) => {
                    return Ok(match frame {
                        Some(f) => Incoming::Closed(Some(u16::from(f.code)), f.reason.to_string()),
                        None => Incoming::Closed(None, String::new()),
                    })
                }
                Message::Ping(_) | Message::Frame(_) => {}
            }
        }
    }

    /// After the server's close frame: sends the closing reply and waits
    /// (briefly) for the server to end the connection, so that it need not
    /// wait for us.
    pub(crate) async fn finish(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while let Some(Ok(_)) = self.ws.next().await {}
        })
        .await;
    }
}

/// What a close by the server means for a reconnecting stream: `None` for a
/// clean close (1000, 1001: reconnect at once and resume), else the error.
///
/// `refusal` is the `error` message (code, message) that came just before
/// the close, if any. Application codes (4000 to 4999) become
/// [`Error::Api`] with status `code - 4000`, so that 4404, 4409, 4410, 4400
/// and 4422 are terminal (and 4412, which earlier servers sent for
/// `session_ended`) and 4408 (no answer to ping) is not; 1002, 1003,
/// 1007 and 1009 (this client broke the protocol) are [`Error::Protocol`];
/// any other code (1011, 1012, 1013, …) is [`Error::Disconnected`].
pub(crate) fn close_error(
    server: &str,
    code: Option<u16>,
    reason: &str,
    refusal: Option<(String, String)>,
) -> Option<Error> {
    let said = if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    };
    match code {
        Some(NORMAL | GOING_AWAY) => None,
        // The token ran out mid-stream: reconnect (with a fresh token from
        // the client's callback) and resume, as after a server restart.
        Some(UNAUTHORIZED) if reason.starts_with("token expired") => None,
        Some(c @ 4000..=4999) => {
            let (err, message) = refusal.unwrap_or_else(|| {
                (
                    format!("close_{c}"),
                    if reason.is_empty() {
                        format!("the server closed the WebSocket with {c}")
                    } else {
                        reason.to_owned()
                    },
                )
            });
            Some(Error::Api(Box::new(ApiError::from_ws(
                err,
                message,
                Some(c),
            ))))
        }
        Some(c @ (1002 | 1003 | 1007 | 1009)) => Some(Error::protocol(
            server,
            format!("the server closed the WebSocket with {c}{said} (a client bug)"),
        )),
        Some(c) => Some(Error::Disconnected {
            server: server.to_owned(),
            detail: format!("the server closed the WebSocket with {c}{said}"),
        }),
        None => Some(Error::Disconnected {
            server: server.to_owned(),
            detail: "the server closed the WebSocket without a code".to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_codes_map_to_terminal_or_retryable_errors() {
        let s = "http://h";
        assert!(close_error(s, Some(1000), "", None).is_none());
        assert!(close_error(s, Some(1001), "shutting down", None).is_none());
        for (c, code) in [
            (4404, "session_not_found"),
            (4404, "session_ended"),
            (4409, "session_attached"),
            (4410, "session_not_retained"),
            (4412, "session_ended"),
            (4400, "resume_disabled"),
        ] {
            let e = close_error(s, Some(c), "x", Some((code.to_owned(), "why".to_owned())))
                .expect("an error");
            assert!(e.is_terminal(), "{c}");
            let a = e.api().expect("an API error");
            assert_eq!(
                (a.code.as_str(), a.close_code(), a.status),
                (code, Some(c), c - 4000)
            );
            assert_eq!(a.error_code().map(|e| e.as_str()), Some(code));
        }
        assert!(close_error(s, Some(4401), "token expired; reconnect", None).is_none());
        let refused = close_error(
            s,
            Some(4401),
            "unauthorized",
            Some((
                "unauthorized".to_owned(),
                "the token has expired".to_owned(),
            )),
        )
        .expect("an error");
        assert!(refused.is_terminal());
        let hb = close_error(s, Some(4408), "no answer to ping", None).expect("an error");
        assert!(!hb.is_terminal());
        assert_eq!(hb.api().map(|a| a.code.as_str()), Some("close_4408"));
        assert!(close_error(s, Some(4422), "", None).is_some_and(|e| e.is_terminal()));
        assert!(close_error(s, Some(1009), "", None).is_some_and(|e| e.is_terminal()));
        assert!(close_error(s, Some(1011), "", None).is_some_and(|e| !e.is_terminal()));
        assert!(close_error(s, None, "", None).is_some_and(|e| !e.is_terminal()));
    }
}
