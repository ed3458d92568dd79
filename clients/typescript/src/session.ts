/**
 * The consumer side of a session, over WebSocket (`GET /v1/sessions/{id}/ws`).
 *
 * A {@link SessionConsumer} yields {@link SessionUpdate}s: events, `resumed` after the replay
 * of an attach with `lastSeq`, and the end (`completed` or `cancelled`), after which it ends.
 * It remembers the seq of the last event it delivered ({@link SessionConsumer.lastSeq}).
 *
 * After a drop it attaches again with `last_seq` = that seq (so it gets every event after it
 * exactly once, then `resumed`, then live events) and with `takeover=true`: after a network
 * change the server may still hold the old connection, which is this consumer's own. When
 * nothing was delivered yet it uses the starting `lastSeq` or, for a live first attach, the
 * session's head read just before that attach.
 *
 * Refusals end it with a {@link GaplessError} carrying `closeCode` and never reconnect:
 * 4404 with code `session_not_found` (unknown or expired) or `session_ended` (completed or
 * cancelled, attached without `lastSeq`: nothing live to attach to), 4409 `session_attached` (held elsewhere without takeover, or
 * taken over by a newer connection), 4410 `session_not_retained` (the events after `lastSeq`
 * are gone: start over), 4400 `resume_disabled`, 4403 `forbidden`, and 4401 once `getToken`
 * could not help. A close 1001 (server shutting down) re-attaches at once; other drops wait
 * per the backoff.
 *
 * @module
 */

import { Backoff, Retrier } from "./backoff.js";
import type { Core } from "./core.js";
import { GaplessError, isAbort } from "./errors.js";
import { payloadOf, segment, sleep } from "./internal.js";
import { UpdateStream } from "./stream.js";
import { retryAfterFailure } from "./subscribe.js";
import type { SessionInfo, SessionUpdate } from "./types.js";
import { WsConn, closeError, wsUrl } from "./ws.js";

/** Options of {@link Client.attachSession}. */
export interface AttachOptions {
  /** Resume after this seq: every retained event with a greater seq, then `resumed`, then live. Without it: `resumed` (0 replayed) at once, then live only. */
  lastSeq?: number;
  /** Take the session over from a connection that holds it (default false: refused with 4409). */
  takeover?: boolean;
  /** Whether to re-attach after a drop (default true). */
  reconnect?: boolean;
}

/** A session consumer: an async iterable of {@link SessionUpdate}s that re-attaches across drops. */
export class SessionConsumer extends UpdateStream<SessionUpdate> {
  /** The session id. */
  readonly id: string;
  readonly #core: Core;
  readonly #opts: AttachOptions;
  readonly #info: (id: string) => Promise<SessionInfo>;
  #lastSeq: number | undefined;

  /** @internal Use {@link Client.attachSession}. */
  constructor(core: Core, id: string, opts: AttachOptions, info: (id: string) => Promise<SessionInfo>) {
    super();
    this.#core = core;
    this.id = id;
    this.#opts = opts;
    this.#info = info;
    this.#lastSeq = opts.lastSeq;
  }

  /** The seq of the last event delivered (or the starting `lastSeq`); attach again later with it. */
  get lastSeq(): number | undefined {
    return this.#lastSeq;
  }

  /** @internal */
  protected async *run(signal: AbortSignal): AsyncGenerator<SessionUpdate, void, undefined> {
    const core = this.#core;
    const reconnect = this.#opts.reconnect ?? true;
    const retrier = new Retrier(new Backoff(core.backoff));
    let anchor: number | undefined;
    if (this.#lastSeq === undefined && reconnect) {
      anchor = await this.#info(this.id).then(
        (i) => i.head,
        () => undefined,
      );
    }
    let reattach = false;
    while (!signal.aborted) {
      const from = reattach ? (this.#lastSeq ?? anchor) : this.#lastSeq;
      const takeover = reattach ? true : (this.#opts.takeover ?? false);
      const query: [string, string][] = [];
      if (from !== undefined) query.push(["last_seq", String(from)]);
      if (takeover) query.push(["takeover", "true"]);
      let conn: WsConn;
      try {
        const token = await core.auth.fresh();
        conn = await WsConn.open(core, wsUrl(core, `/v1/sessions/${segment(this.id)}/ws`, query, token), signal);
      } catch (e) {
        if (!(await retryAfterFailure(e, retrier, core, reconnect, signal))) return;
        continue;
      }
      reattach = true;
      const openedAt = Date.now();
      let refusal: { code: string; message: string } | undefined;
      let end: GaplessError | undefined;
      try {
        for (;;) {
          const item = await conn.next(signal);
          if (item.t === "closed") {
            end = closeError(item.code, item.reason, refusal);
            break;
          }
          const m = item.msg;
          switch (m["op"]) {
            case "event": {
              retrier.proven();
              const seq = Number(m["seq"]);
              this.#lastSeq = seq;
              yield {
                kind: "event",
                session: String(m["session"] ?? this.id),
                seq,
                type: typeof m["type"] === "string" ? m["type"] : null,
                data: payloadOf(m["data"], m["encoding"]),
                time: Number(m["time"] ?? 0),
              };
              break;
            }
            case "session.resumed":
              retrier.proven();
              yield {
                kind: "resumed",
                replayedEvents: Number(m["replayed_events"] ?? 0),
                ...(typeof m["head"] === "number" ? { head: m["head"] } : {}),
              };
              break;
            case "session.completed":
              yield { kind: "completed", seq: Number(m["seq"]) };
              return;
            case "session.cancelled":
              yield { kind: "cancelled", seq: Number(m["seq"]) };
              return;
            case "error":
              // A refusal or a takeover: its close code follows.
              refusal = { code: String(m["code"] ?? "error"), message: String(m["message"] ?? "") };
              break;
            default:
              break;
          }
          if (signal.aborted) return;
        }
      } catch (e) {
        if (signal.aborted || isAbort(e)) return;
        throw e;
      } finally {
        conn.close();
      }
      if (end === undefined) {
        if (!reconnect) return;
        if (!(await sleep(retrier.closed(openedAt), signal))) return;
        continue;
      }
      if (end.closeCode === 4401 && core.auth.canRefresh && (end.code === "token_expired" || !retrier.authRetried)) {
        if (end.code !== "token_expired") retrier.authRetried = true;
        else if (!(await sleep(retrier.closed(openedAt), signal))) return;
        continue;
      }
      if (end.terminal || !reconnect) throw end;
      if (!(await sleep(retrier.failed(end.retryAfterMs), signal))) return;
    }
  }
}
