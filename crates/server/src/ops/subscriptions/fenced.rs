//! The wake-scoped operations (PROTOCOL.md 7.1-7.3): a webhook's callback,
//! a pull-wake's ack and release. Each carries the wake's own token, its
//! `generation` and its `wake_id`, which must all be the current wake's
//! (else [`Error::Fenced`]); acks, lease extensions and the wake's end are
//! journaled before the answer.

use super::model::{self, Kind, Sub};
use super::{Cx, Error};
use crate::ops::streams::names;
use gapless_core::journal::now_ms;
use serde_json::{json, Value};

/// A wake-scoped operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Webhook callback: acks, heartbeat, done.
    Callback,
    /// Pull-wake ack: the same.
    Ack,
    /// Pull-wake release: ends the lease without acks.
    Release,
}

impl Op {
    fn fits(self, kind: Kind) -> bool {
        match self {
            Op::Callback => kind == Kind::Webhook,
            Op::Ack | Op::Release => kind == Kind::PullWake,
        }
    }
}

/// Whether `bearer` (its hash `presented`), and the body's `wake_id` and
/// `generation`, are the current wake's.
fn current(s: &Sub, presented: &str, v: &Value) -> bool {
    s.wake.as_ref().is_some_and(|w| {
        w.token_hash
            .as_deref()
            .is_some_and(|h| model::constant_eq(h, presented))
            && v.get("wake_id").and_then(Value::as_str) == Some(w.id.as_str())
    }) && v.get("generation").and_then(Value::as_u64) == Some(s.generation)
}

/// The body's acks, checked: each names a linked stream and an offset.
fn acks(s: &Sub, v: &Value) -> Result<Vec<(String, String)>, Error> {
    let mut out = Vec::new();
    match v.get("acks") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            for item in a {
                let (Some(path), Some(off)) = (
                    item.get("stream").and_then(Value::as_str),
                    item.get("offset").and_then(Value::as_str),
                ) else {
                    return Err(Error::Invalid(
                        "each ack is {\"stream\": PATH, \"offset\": OFFSET}".into(),
                    ));
                };
                if !s.links.contains_key(path) {
                    return Err(Error::Invalid(format!(
                        "{path:?} is not a stream of this subscription"
                    )));
                }
                if !matches!(names::parse_offset(Some(off)), Ok(names::Offset::At { .. })) {
                    return Err(Error::Invalid(format!("{off:?} is not a stream offset")));
                }
                out.push((path.to_owned(), off.to_owned()));
            }
        }
        Some(_) => return Err(Error::Invalid("acks must be an array".into())),
    }
    Ok(out)
}

impl Cx {
    /// Callback, ack or release of the subscription `id` under `root`, with
    /// the wake token `bearer` and the request body `v`. The answer's body
    /// (`None`: release, no body).
    ///
    /// # Errors
    /// [`Error::NotFound`], an operation of the other type, [`Error::Fenced`],
    /// malformed acks, or the journal's refusal.
    pub async fn fenced(
        &self,
        root: &str,
        id: &str,
        bearer: &str,
        v: &Value,
        op: Op,
    ) -> Result<Option<Value>, Error> {
        let presented = model::token_hash(bearer);
        let channel = super::store::sub_channel(root, id);
        let mut tx = self
            .subs
            .store
            .begin(&self.app, channel, self.fresh())
            .await?;
        loop {
            let Some(cur) = tx.current() else {
                return Err(Error::NotFound(id.to_owned()));
            };
            if !op.fits(cur.config.kind) {
                return Err(Error::Invalid(format!(
                    "this operation is not for a {} subscription",
                    cur.config.kind.as_str()
                )));
            }
            if !current(&cur, &presented, v) {
                return Err(Error::Fenced);
            }
            let (s, answer) = self.fenced_change(&cur, v, op).await?;
            if tx.write(Some(s)).await? {
                return Ok(answer);
            }
        }
    }

    /// What a current wake's operation makes of the subscription, and the
    /// answer.
    async fn fenced_change(
        &self,
        cur: &Sub,
        v: &Value,
        op: Op,
    ) -> Result<(Sub, Option<Value>), Error> {
        let mut s = cur.clone();
        if op == Op::Release {
            s.wake = None;
            return Ok((s, None));
        }
        for (path, off) in acks(&s, v)? {
            s.ack(&path, off);
        }
        if !v.get("done").and_then(Value::as_bool).unwrap_or(false) {
            // A heartbeat: the lease is extended (and journaled, so every
            // node sees it held).
            let until = now_ms() + s.config.lease_ttl_ms;
            if let Some(w) = s.wake.as_mut() {
                w.lease_until = Some(until);
            }
            return Ok((s, Some(json!({ "ok": true, "next_wake": false }))));
        }
        s.wake = None;
        // Whether work remains: the delivery task wakes again for it.
        let next = self.snapshot(&s).await.iter().any(|p| p.pending);
        Ok((s, Some(json!({ "ok": true, "next_wake": next }))))
    }
}
