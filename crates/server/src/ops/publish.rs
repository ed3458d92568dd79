//! Publishing, once for every transport: one event (journaled or
//! ephemeral), a batch, the idempotency key and the limits (the channel's
//! namespace's `max_event_bytes` and `ephemeral`, `--max-batch-events`, the
//! publish rate).
//!
//! A transport reads its wire's request into these calls and writes their
//! answers in its own shape. Every refusal is an [`ApiError`] with the same
//! code, message and fields whichever transport carried the publish; only
//! the idempotency key is named as each client sends it ([`KeyName`]).

use crate::auth::{Action, Grant};
use crate::error::ApiError;
use crate::ops::{names, namespaces};
use crate::App;
use gapless_core::journal::Appended;
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::NewEvent;
use std::net::IpAddr;

/// Longest accepted idempotency key, in bytes.
pub(crate) const MAX_IDEMPOTENCY_KEY: usize = 256;

/// How a transport's client names the idempotency key; refusals name it so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyName {
    /// The HTTP header `Idempotency-Key`.
    Header,
    /// The WebSocket message field `idempotency_key`.
    Field,
}

impl KeyName {
    /// The name as the client writes it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            KeyName::Header => "Idempotency-Key",
            KeyName::Field => "idempotency_key",
        }
    }
}

/// What a publish of one event did.
#[derive(Debug)]
pub(crate) enum Published {
    /// Ephemeral: handed to this many current subscribers.
    Ephemeral {
        /// How many subscribers it was handed to.
        subscribers: usize,
    },
    /// Journaled (or, for a retry with a known key, found: `duplicate`).
    Journaled(Appended),
}

/// Checks the target of a publish: a valid channel name the grant may
/// publish to.
///
/// # Errors
/// 400 `invalid_channel`; 401 or 403 from the grant.
pub(crate) fn check_channel(grant: &Grant, channel: &str) -> Result<(), ApiError> {
    names::channel(channel)?;
    grant.require(Action::Publish, channel)
}

/// Checks an idempotency key: 1 to [`MAX_IDEMPOTENCY_KEY`] visible ASCII
/// characters.
///
/// # Errors
/// 400 `invalid_request` naming the key as `name`.
pub(crate) fn check_key(key: &str, name: KeyName) -> Result<(), ApiError> {
    if key.is_empty()
        || key.len() > MAX_IDEMPOTENCY_KEY
        || !key.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(bad_key(name));
    }
    Ok(())
}

/// The refusal of a malformed idempotency key.
pub(crate) fn bad_key(name: KeyName) -> ApiError {
    ApiError::new(
        ErrorCode::InvalidRequest,
        format!(
            "{} must be 1 to {MAX_IDEMPOTENCY_KEY} visible ASCII characters",
            name.as_str()
        ),
    )
}

/// Publishes one event to `channel` (checked with [`check_channel`], its
/// type already checked): its size (the namespace's `max_event_bytes`),
/// whether the namespace takes it ephemeral, the publisher's rate (`peer`
/// keys it on an open server), then either hands it to current subscribers
/// (`ephemeral`, which takes no key) or appends it to the journal, once per
/// idempotency `key`.
///
/// # Errors
/// 413 `too_large`; 403 `forbidden` for an ephemeral event on a namespace
/// with `ephemeral = false`; 429 `rate_limited`; 400 `invalid_request` for a key on
/// an ephemeral event or a malformed key; the journal's refusals, a 503
/// saying that the publish may have been applied
/// ([`ApiError::publish_refused`]).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn one(
    app: &App,
    grant: &Grant,
    peer: Option<IpAddr>,
    channel: &str,
    event: NewEvent,
    ephemeral: bool,
    key: Option<&str>,
    name: KeyName,
) -> Result<Published, ApiError> {
    namespaces::check_data(app, channel, event.data.len(), None)?;
    if ephemeral {
        namespaces::check_ephemeral(app, channel)?;
    }
    app.publish_limiter.take(grant, peer, 1)?;
    if ephemeral {
        if key.is_some() {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "{} does not apply to ephemeral events (they are never journaled)",
                    name.as_str()
                ),
            ));
        }
        let subscribers = app
            .hub
            .publish_ephemeral(channel, event.event_type, event.data);
        return Ok(Published::Ephemeral { subscribers });
    }
    if let Some(k) = key {
        check_key(k, name)?;
    }
    journal(app, channel, vec![event], key, name)
        .await
        .map(Published::Journaled)
}

/// Publishes `events` to `channel` (checked with [`check_channel`])
/// atomically and in order, as one batch: 1 to `--max-batch-events`
/// events, each of at most the namespace's `max_event_bytes` bytes with a valid type, then
/// the publisher's rate for all of them, then the journal, once per `key`
/// (already checked).
///
/// # Errors
/// 400 `invalid_request` (empty), `invalid_type` (naming the item); 413
/// `too_large` with `limit`; 429 `rate_limited`; the journal's refusals.
pub(crate) async fn batch(
    app: &App,
    grant: &Grant,
    peer: Option<IpAddr>,
    channel: &str,
    events: Vec<NewEvent>,
    key: Option<&str>,
) -> Result<Appended, ApiError> {
    let checked = check_batch(app, grant, peer, channel, events)?;
    journal(app, channel, checked, key, KeyName::Header).await
}

/// The limits of [`batch`] without the journal: 1 to `--max-batch-events`
/// events, each of at most the namespace's `max_event_bytes` bytes with a
/// valid type, then the publisher's rate for all of them (taken). Returns
/// the events with their types checked, for a caller that appends them
/// itself (a Durable Streams append, guarded by the channel's metadata).
///
/// # Errors
/// As [`batch`], but for the journal's.
pub(crate) fn check_batch(
    app: &App,
    grant: &Grant,
    peer: Option<IpAddr>,
    channel: &str,
    events: Vec<NewEvent>,
) -> Result<Vec<NewEvent>, ApiError> {
    let cfg = &app.config;
    if events.is_empty() {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "batch is empty; send at least one event",
        ));
    }
    if events.len() > cfg.max_batch_events {
        return Err(ApiError::new(
            ErrorCode::TooLarge,
            format!(
                "batch has {} events; at most {} are allowed (--max-batch-events)",
                events.len(),
                cfg.max_batch_events
            ),
        )
        .with("limit", cfg.max_batch_events));
    }
    let mut checked = Vec::with_capacity(events.len());
    for (i, item) in events.into_iter().enumerate() {
        namespaces::check_data(app, channel, item.data.len(), Some(i))?;
        let event_type = names::event_type(item.event_type.as_deref())
            .map_err(|e| ApiError::new(e.code, format!("event {i} of the batch: {}", e.message)))?;
        checked.push(NewEvent {
            event_type,
            data: item.data,
        });
    }
    app.publish_limiter.take(grant, peer, checked.len())?;
    Ok(checked)
}

/// Appends `events` to the journal; a refusal says, naming the key as
/// `name`, that a publish may have been applied.
async fn journal(
    app: &App,
    channel: &str,
    events: Vec<NewEvent>,
    key: Option<&str>,
    name: KeyName,
) -> Result<Appended, ApiError> {
    // Kept for the comparison a duplicate answer needs (only with a key).
    let sent = key.map(|_| events.clone());
    let appended = app
        .hub
        .publish(channel, events, key)
        .await
        .map_err(|e| ApiError::from(e).publish_refused(name.as_str()))?;
    if let (true, Some(sent)) = (appended.duplicate, sent) {
        check_same(app, channel, &appended, &sent, name).await?;
    }
    Ok(appended)
}

/// Refuses a duplicate whose events differ from those the key first
/// stored: a key reused for other content is a client's bug, and answering
/// the original seqs would drop the new content silently. Compared while the
/// first publish's events are all retained (the journal forgets a key with
/// them); a read that fails or finds them evicted answers as a duplicate.
///
/// # Errors
/// 422 `idempotency_key_reused`, naming the first difference.
async fn check_same(
    app: &App,
    channel: &str,
    appended: &Appended,
    sent: &[NewEvent],
    name: KeyName,
) -> Result<(), ApiError> {
    let stored_count = appended.last_seq + 1 - appended.first_seq;
    let differs = if stored_count != sent.len() as u64 {
        Some(format!(
            "it stored {stored_count} event(s), this publish has {}",
            sent.len()
        ))
    } else {
        let Ok(page) = app
            .hub
            .read(channel, appended.first_seq - 1, sent.len(), usize::MAX)
            .await
        else {
            return Ok(());
        };
        let stored: Vec<_> = page
            .events
            .iter()
            .filter(|e| e.epoch == appended.epoch && e.seq <= appended.last_seq)
            .collect();
        if stored.len() != sent.len() {
            return Ok(()); // evicted: nothing left to compare with
        }
        stored
            .iter()
            .zip(sent)
            .enumerate()
            .find_map(|(i, (old, new))| {
                let what = if old.data != new.data {
                    "data"
                } else if old.event_type != new.event_type {
                    "type"
                } else {
                    return None;
                };
                Some(if sent.len() == 1 {
                    format!("this publish's {what} differs")
                } else {
                    format!("the {what} of event {i} of the batch differs")
                })
            })
    };
    match differs {
        None => Ok(()),
        Some(why) => Err(ApiError::new(
            ErrorCode::IdempotencyKeyReused,
            format!(
                "{} was used on this channel for other events (seq {} to {}): {why}; \
                 nothing was appended. Use a new key for new content",
                name.as_str(),
                appended.first_seq,
                appended.last_seq
            ),
        )
        .with("seq", appended.first_seq)),
    }
}
