//! [`Client`]: the entry point. Publishing and reading history are plain
//! request/response calls made here; subscriptions and joins are built here
//! and live in their own modules.

use crate::error::{ApiError, Error};
use crate::join::JoinBuilder;
use crate::subscribe::SubscribeBuilder;
use crate::types::{
    BatchPublished, ChannelInfo, Cursor, EphemeralDelivered, Event, HistoryPage, PresenceAnswer,
    Published, Start,
};
use crate::ws_subscribe::WsSubscribeBuilder;
use futures::Stream;
use gapless_protocol::answers;
use gapless_protocol::NewEvent;
use std::sync::Arc;
use std::time::Duration;

/// Longest error body read from a refusal, in bytes.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// A handle on one gapless server. Cheap to clone (it shares one connection pool).
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) http: reqwest::Client,
    /// The base URL without a trailing slash, e.g. `http://127.0.0.1:8080`.
    pub(crate) base: String,
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) token: Option<TokenSource>,
}

impl Inner {
    /// The token to send now: the fixed one, or a fresh one from the
    /// callback (called before every request and every (re)connect).
    ///
    /// # Errors
    /// What the callback returned.
    pub(crate) async fn token(&self) -> Result<Option<String>, Error> {
        match &self.token {
            None => Ok(None),
            Some(TokenSource::Fixed(t)) => Ok(Some(t.clone())),
            Some(TokenSource::Fetch(f)) => f().await.map(Some),
        }
    }
}

/// A callback that supplies a token: see [`ClientBuilder::token_fn`].
pub type TokenFn = Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, Error>> + Send>>
        + Send
        + Sync,
>;

/// Where a client's token comes from.
#[derive(Clone)]
pub(crate) enum TokenSource {
    Fixed(String),
    Fetch(TokenFn),
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TokenSource::Fixed(_) => "Fixed([redacted])",
            TokenSource::Fetch(_) => "Fetch(callback)",
        })
    }
}

/// Settings for a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base: String,
    connect_timeout: Duration,
    request_timeout: Duration,
    token: Option<TokenSource>,
}

impl ClientBuilder {
    /// A token (JWT) sent as `Authorization: Bearer` on every request and
    /// stream, for a server started with `--jwt-secret` or
    /// `--jwt-public-key` (`docs/security.md`). A stream whose token expires
    /// ends; it reconnects with the same token, which the server then
    /// refuses (401): use [`ClientBuilder::token_fn`] for long-lived streams.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(TokenSource::Fixed(token.into()));
        self
    }

    /// A callback that supplies a token before every request and every
    /// (re)connect of a stream, so a stream cut at its token's expiry
    /// resumes with a fresh one from its cursor: no event lost or repeated.
    /// Cache inside the callback; an error it returns ends the call or the
    /// stream with that error.
    ///
    /// ```rust,ignore
    /// let client = Client::builder(url)
    ///     .token_fn(|| Box::pin(async { Ok(fetch_token_from_my_backend().await) }))
    ///     .build()?;
    /// ```
    pub fn token_fn<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<String, Error>> + Send + 'static,
    {
        self.token = Some(TokenSource::Fetch(Arc::new(move || Box::pin(f()))));
        self
    }

    /// How long to wait for a TCP connection. Default 10 s.
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// How long a publish or history request may take in all. Default 30 s.
    /// Streams have no such limit (see their idle timeout).
    pub fn request_timeout(mut self, t: Duration) -> Self {
        self.request_timeout = t;
        self
    }

    /// Builds the client.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] when the base URL is not `http://host[:port][/prefix]`.
    pub fn build(self) -> Result<Client, Error> {
        let base = self.base.trim().trim_end_matches('/').to_owned();
        let bad = |detail: &str| Error::InvalidUrl {
            url: self.base.clone(),
            detail: detail.to_owned(),
        };
        let Some(rest) = base.strip_prefix("http://") else {
            return Err(if base.starts_with("https://") {
                bad("this client speaks plain http only; use http://")
            } else {
                bad("it must start with http://, e.g. http://127.0.0.1:8080")
            });
        };
        if rest.is_empty() || rest.starts_with('/') {
            return Err(bad("it names no host"));
        }
        if base.contains(['?', '#']) {
            return Err(bad("it must not have a query or fragment"));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| bad(&e.to_string()))?;
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                base,
                request_timeout: self.request_timeout,
                connect_timeout: self.connect_timeout,
                token: self.token,
            }),
        })
    }
}

impl Client {
    /// A client for the server at `base_url` (e.g. `http://127.0.0.1:8080`)
    /// with default settings.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] when the URL is not `http://host[:port][/prefix]`.
    pub fn new(base_url: &str) -> Result<Client, Error> {
        Self::builder(base_url).build()
    }

    /// Settings for a client of the server at `base_url`.
    pub fn builder(base_url: &str) -> ClientBuilder {
        ClientBuilder {
            base: base_url.to_owned(),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            token: None,
        }
    }

    /// The server's base URL, without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.inner.base
    }

    /// Publishes one event whose data is `data`. Set a type or an idempotency
    /// key on the returned request, then [`PublishRequest::send`] it.
    pub fn publish(&self, channel: &str, data: impl Into<String>) -> PublishRequest<'_> {
        PublishRequest {
            client: self,
            channel: channel.to_owned(),
            data: data.into(),
            event_type: None,
            key: None,
        }
    }

    /// Publishes several events atomically and in order (consecutive seqs);
    /// [`BatchRequest::send`] sends them.
    pub fn publish_batch(
        &self,
        channel: &str,
        events: impl IntoIterator<Item = NewEvent>,
    ) -> BatchRequest<'_> {
        BatchRequest {
            client: self,
            channel: channel.to_owned(),
            events: events.into_iter().collect(),
            key: None,
        }
    }

    /// Reads the channel's history: one page ([`HistoryRequest::page`]) or
    /// every page ([`HistoryRequest::stream`]).
    pub fn history(&self, channel: &str) -> HistoryRequest<'_> {
        HistoryRequest {
            client: self,
            channel: channel.to_owned(),
            after: None,
            since: None,
            limit: None,
        }
    }

    /// Follows `channels` over Server-Sent Events; see [`SubscribeBuilder`].
    pub fn subscribe<I, S>(&self, channels: I) -> SubscribeBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        SubscribeBuilder::new(self.clone(), channels.into_iter().map(Into::into).collect())
    }

    /// Follows `channels` over one WebSocket (`/v1/ws`); see
    /// [`WsSubscribeBuilder`].
    ///
    /// A separate entry point rather than a transport option of
    /// [`Client::subscribe`], because the two differ in what a caller
    /// stores: an SSE subscription has one cursor for all its channels
    /// ([`Subscription::cursor`](crate::Subscription::cursor)), a WebSocket
    /// one has a cursor per channel
    /// ([`WsSubscription::cursors`](crate::WsSubscription::cursors)), and
    /// [`Event::cursor`] follows suit. Both yield the same [`Update`](crate::Update)s.
    pub fn subscribe_ws<I, S>(&self, channels: I) -> WsSubscribeBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        WsSubscribeBuilder::new(self.clone(), channels.into_iter().map(Into::into).collect())
    }

    /// Reads `channel`'s history then follows it live, with no event lost or
    /// repeated between the two; see [`JoinBuilder`].
    pub fn join(&self, channel: &str) -> JoinBuilder {
        JoinBuilder::new(self.clone(), channel.to_owned())
    }

    /// The channel's bounds and subscriber count (`GET /v1/channels/{channel}`).
    ///
    /// # Errors
    /// [`Error::Api`] (400 `invalid_channel`), or a connection error.
    pub async fn channel_info(&self, channel: &str) -> Result<ChannelInfo, Error> {
        let req = self
            .inner
            .http
            .get(self.url(&format!("/v1/channels/{}", segment(channel))));
        let (_, body) = self.call(req).await?;
        let a: answers::ChannelInfo = self.decode(&body)?;
        Ok(a.into())
    }

    /// Who follows `channel` (`GET /v1/channels/{channel}/presence`): its
    /// occupancy (connections, members' or not) and its members sorted by
    /// id, each with its connections and when it joined. Needs the
    /// subscribe right; the channel's namespace must have presence.
    ///
    /// # Errors
    /// [`Error::Api`] (400 `invalid_channel`, 401, 403, 404
    /// `presence_disabled`, 503 in cluster mode while Redis is unreachable),
    /// or a connection error.
    pub async fn presence(&self, channel: &str) -> Result<PresenceAnswer, Error> {
        let req = self
            .inner
            .http
            .get(self.url(&format!("/v1/channels/{}/presence", segment(channel))));
        let (_, body) = self.call(req).await?;
        self.decode(&body)
    }

    /// Purges `channel` (`DELETE /v1/channels/{channel}`): removes every
    /// event and starts a new epoch; every subscriber gets one `epoch` gap,
    /// then the events published after the purge. Needs the publish right.
    /// A channel never published to is purged too (nothing changes).
    ///
    /// # Errors
    /// [`Error::Api`] (400 `invalid_channel`, 401, 403 `forbidden`, 5xx), or
    /// a connection error.
    pub async fn purge(&self, channel: &str) -> Result<(), Error> {
        let req = self
            .inner
            .http
            .delete(self.url(&format!("/v1/channels/{}", segment(channel))));
        self.call(req).await?;
        Ok(())
    }

    /// The URL of `path` (which starts with `/`).
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.inner.base)
    }

    /// Sends a request with the request timeout; returns the status and body
    /// of a 2xx answer and maps everything else to [`Error`].
    pub(crate) async fn call(&self, req: reqwest::RequestBuilder) -> Result<(u16, Vec<u8>), Error> {
        let base = &self.inner.base;
        let mut req = req;
        if let Some(t) = self.inner.token().await? {
            req = req.bearer_auth(t);
        }
        let resp = req
            .timeout(self.inner.request_timeout)
            .send()
            .await
            .map_err(|e| Error::from_reqwest(base, &e))?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(read_refusal(base, resp).await);
        }
        let body = resp
            .bytes()
            .await
            .map_err(|e| Error::from_reqwest(base, &e))?;
        Ok((status, body.to_vec()))
    }

    pub(crate) fn decode<T: serde::de::DeserializeOwned>(&self, body: &[u8]) -> Result<T, Error> {
        serde_json::from_slice(body)
            .map_err(|e| Error::protocol(&self.inner.base, format!("unexpected JSON answer: {e}")))
    }
}

/// Reads a non-2xx answer into [`Error::Api`] (the body is read up to
/// [`MAX_ERROR_BODY`] bytes).
pub(crate) async fn read_refusal(base: &str, mut resp: reqwest::Response) -> Error {
    let status = resp.status().as_u16();
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY {
        match resp.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => break,
            Err(e) => {
                if body.is_empty() {
                    return Error::from_reqwest(base, &e);
                }
                break;
            }
        }
    }
    Error::Api(Box::new(ApiError::from_body(status, &body)))
}

/// Percent-encodes a path segment (channel names need none; anything else is
/// sent intact so that the server can say what is wrong with it).
pub(crate) fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b':' | b'@') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A single publish, ready to send. Built by [`Client::publish`].
#[derive(Debug)]
#[must_use = "a publish request does nothing until sent"]
pub struct PublishRequest<'a> {
    client: &'a Client,
    channel: String,
    data: String,
    event_type: Option<String>,
    key: Option<String>,
}

impl PublishRequest<'_> {
    /// The event's type (`A-Z a-z 0-9 _ - . :`, 1 to 64 characters; `gap` and
    /// `gapless.*` are reserved).
    pub fn event_type(mut self, t: impl Into<String>) -> Self {
        self.event_type = Some(t.into());
        self
    }

    /// An `Idempotency-Key` (1 to 256 visible ASCII characters): a retry with
    /// the same key on the same channel appends nothing while the first
    /// publish's event is retained, and answers with its seq and cursor.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    fn request(&self, ephemeral: bool) -> reqwest::RequestBuilder {
        let c = self.client;
        let mut req = c
            .inner
            .http
            .post(c.url(&format!("/v1/channels/{}/events", segment(&self.channel))))
            .header(reqwest::header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(self.data.clone());
        if let Some(t) = &self.event_type {
            req = req.query(&[("type", t.as_str())]);
        }
        if ephemeral {
            req = req.query(&[("ephemeral", "true")]);
        }
        if let Some(k) = &self.key {
            req = req.header("idempotency-key", k.as_str());
        }
        req
    }

    /// Appends the event to the channel's journal.
    ///
    /// A connection error leaves it unknown whether the event was appended:
    /// retry with the same idempotency key to be sure it is appended once.
    ///
    /// # Errors
    /// [`Error::Api`]: 400 (`invalid_channel`, `invalid_type`,
    /// `invalid_request`), 413 `too_large`, 500 `journal_failed` (nothing was
    /// appended), 503; or a connection error.
    pub async fn send(self) -> Result<Published, Error> {
        let (status, body) = self.client.call(self.request(false)).await?;
        let a: answers::Published = self.client.decode(&body)?;
        Ok(Published::read(a, status == 200))
    }

    /// Delivers the event live only, to the channel's current subscribers: no
    /// seq, never journaled or replayed. An idempotency key is refused (400).
    ///
    /// # Errors
    /// As for [`PublishRequest::send`].
    pub async fn send_ephemeral(self) -> Result<EphemeralDelivered, Error> {
        let (_, body) = self.client.call(self.request(true)).await?;
        let a: answers::EphemeralDelivered = self.client.decode(&body)?;
        Ok(a.into())
    }
}

/// A batch publish, ready to send. Built by [`Client::publish_batch`].
#[derive(Debug)]
#[must_use = "a batch request does nothing until sent"]
pub struct BatchRequest<'a> {
    client: &'a Client,
    channel: String,
    events: Vec<NewEvent>,
    key: Option<String>,
}

impl BatchRequest<'_> {
    /// An `Idempotency-Key` for the whole batch (see
    /// [`PublishRequest::idempotency_key`]).
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Appends every event, all or none, in order.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty batch; [`Error::Api`]: 400
    /// `invalid_request` / `invalid_type` (the message names the item), 413
    /// `too_large` (over the server's `--max-batch-events`,
    /// `--max-batch-bytes` or `--max-event-bytes`); or a connection error.
    pub async fn send(self) -> Result<BatchPublished, Error> {
        if self.events.is_empty() {
            return Err(Error::InvalidArgument(
                "a batch needs at least one event".to_owned(),
            ));
        }
        let items: Vec<answers::BatchEvent> = self
            .events
            .into_iter()
            .map(|e| answers::BatchEvent {
                data: e.data.wire().into_owned(),
                encoding: e.data.encoding(),
                event_type: e.event_type,
            })
            .collect();
        let body = serde_json::to_vec(&items)
            .map_err(|e| Error::InvalidArgument(format!("cannot encode the batch: {e}")))?;
        let c = self.client;
        let mut req = c
            .inner
            .http
            .post(c.url(&format!("/v1/channels/{}/batch", segment(&self.channel))))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(k) = &self.key {
            req = req.header("idempotency-key", k.as_str());
        }
        let (status, body) = c.call(req).await?;
        let a: answers::BatchPublished = c.decode(&body)?;
        Ok(BatchPublished::read(a, status == 200))
    }
}

/// A history read. Built by [`Client::history`].
#[derive(Debug, Clone)]
#[must_use = "a history request does nothing until read"]
pub struct HistoryRequest<'a> {
    client: &'a Client,
    channel: String,
    after: Option<Cursor>,
    /// `since=` of the first page, when there is no `after`.
    since: Option<String>,
    limit: Option<u32>,
}

impl<'a> HistoryRequest<'a> {
    /// Where to start (default: from the oldest retained event):
    /// [`Start::After`] is [`HistoryRequest::after`]; the others are sent as
    /// `since` (`live`: an empty page at the head; [`Start::Last`]: the last
    /// N retained events; [`Start::Time`]: the first retained event at or
    /// after the time, with [`HistoryPage::gap`] when an event no longer
    /// retained may be). [`HistoryRequest::stream`] reads on with `after`.
    pub fn start(mut self, start: Start) -> Self {
        match start {
            Start::After(c) => {
                self.after = Some(c);
                self.since = None;
            }
            other => {
                self.after = None;
                self.since = other.since();
            }
        }
        self
    }

    /// Start after this cursor (default: from the oldest retained event).
    pub fn after(mut self, cursor: Cursor) -> Self {
        self.after = Some(cursor);
        self
    }

    /// Start after this cursor, or from the oldest retained event when `None`.
    pub fn after_opt(mut self, cursor: Option<Cursor>) -> Self {
        self.after = cursor;
        self
    }

    /// Events per page, 1 to 1000 (server default 100).
    pub fn limit(mut self, n: u32) -> Self {
        self.limit = Some(n);
        self
    }

    /// Reads one page.
    ///
    /// # Errors
    /// [`Error::Api`]: 410 `cursor_not_served` when the journal cannot serve
    /// `after` (see [`ApiError::gap_reason`] and [`ApiError::floor_cursor`]),
    /// 400 `invalid_cursor` / `invalid_channel` / `invalid_request`; or a
    /// connection error.
    pub async fn page(&self) -> Result<HistoryPage, Error> {
        let since = self.since.as_deref().filter(|_| self.after.is_none());
        read_page(
            self.client,
            &self.channel,
            self.after.as_ref(),
            since,
            self.limit,
        )
        .await
    }

    /// Every event after `after` (or from where [`HistoryRequest::start`]
    /// says) up to the head as it is when the last page is read, page by
    /// page. The stream ends after the page that reports `done`; an error
    /// ends it after being yielded. A first page's [`HistoryPage::gap`] is
    /// not part of the stream: read it with [`HistoryRequest::page`].
    pub fn stream(self) -> impl Stream<Item = Result<Event, Error>> + Send + 'a {
        async_stream::stream! {
            let mut after = self.after;
            let mut since = self.since;
            loop {
                let first = since.as_deref().filter(|_| after.is_none());
                match read_page(self.client, &self.channel, after.as_ref(), first, self.limit).await {
                    Ok(page) => {
                        for e in page.events {
                            yield Ok(e);
                        }
                        if page.done {
                            return;
                        }
                        after = Some(page.next);
                        since = None;
                    }
                    Err(e) => {
                        yield Err(e);
                        return;
                    }
                }
            }
        }
    }
}

/// `GET /v1/channels/{channel}/events?after=&since=&limit=`.
pub(crate) async fn read_page(
    client: &Client,
    channel: &str,
    after: Option<&Cursor>,
    since: Option<&str>,
    limit: Option<u32>,
) -> Result<HistoryPage, Error> {
    let mut req = client
        .inner
        .http
        .get(client.url(&format!("/v1/channels/{}/events", segment(channel))));
    if let Some(a) = after {
        req = req.query(&[("after", a.as_str())]);
    }
    if let Some(s) = since {
        req = req.query(&[("since", s)]);
    }
    if let Some(n) = limit {
        req = req.query(&[("limit", n)]);
    }
    let (_, body) = client.call(req).await?;
    let p: answers::HistoryPage = client.decode(&body)?;
    Ok(p.into())
}
