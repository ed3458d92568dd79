/**
 * Subscriptions: follow one or several channels over Server-Sent Events or WebSocket and
 * resume, after any drop, from the last position handed to the caller.
 *
 * A {@link Subscription} remembers the cursor of the last update it *delivered* (handed to the
 * iterator's caller or to the listeners), never one received but not yet delivered: a frame
 * read from the network but still queued is read again after a reconnection. The server's
 * `id:`-only frames (at the start of a stream and after a gap notice) count as delivered once
 * everything before them has been: nothing is owed before such a position.
 *
 * Reconnection: a clean close by the server reconnects at once; a failure waits per
 * {@link Backoff} (full jitter, from the server's `retry:`; a `Retry-After` is a floor); a
 * terminal refusal (400, 403, 404, ...) is thrown and ends the subscription. A token that
 * expires mid-stream (SSE `event: gapless.expired`, WebSocket close 4401) makes it ask
 * `getToken` for a new one and reconnect from the last delivered cursor: no loss, no repeat.
 * Without `getToken` it ends with a `token_expired` {@link GaplessError}. A 401 when
 * reconnecting asks `getToken` once more, then ends with the error.
 *
 * @module
 */

import { Backoff, Retrier } from "./backoff.js";
import type { Core } from "./core.js";
import { GaplessError, errorFromResponse, isAbort, networkError } from "./errors.js";
import { payloadOf, sinceParam, sleep } from "./internal.js";
import type { Since } from "./internal.js";
import { SseConnection, frameOf, presenceParams, sseUrl } from "./live.js";
import type { Frame } from "./live.js";
import { UpdateStream } from "./stream.js";
import type { CursorStore, EphemeralUpdate, EventUpdate, GapUpdate, PresenceUpdate, Update } from "./types.js";
import { WsConn, closeError, wsUrl } from "./ws.js";

/** How a subscription talks to the server. */
export type Transport = "sse" | "ws";

/**
 * Which SSE implementation: `"fetch"` (default, everywhere: `fetch` streaming with the SDK's
 * own parser; it can send `Authorization`, sees every frame and every status) or
 * `"eventsource"` (the platform's `EventSource`: the browser reconnects by itself; it cannot
 * send headers, so a token goes in the `access_token` query parameter; it only dispatches
 * events whose type is `message` or listed in {@link SubscribeOptions.eventTypes}).
 */
export type SseImplementation = "fetch" | "eventsource";

/** Options of {@link Client.subscribe}. */
export interface SubscribeOptions {
  /**
   * Resume after this cursor (one the server issued for these channels). Wins over `since` and
   * over the store. Over SSE a multi-channel subscription's cursor covers every channel;
   * over WebSocket it must name a position on every channel (a single-channel cursor, or the
   * cursor of an SSE subscription of these channels).
   */
  cursor?: string;
  /**
   * Where to start without a cursor (or a stored position): `"live"` (default: events published
   * from now on), `"earliest"` (everything retained), `"last:N"` / `{ last: N }` (the last N
   * retained events, 1 to 1000), `"time:UNIX_MS"` / `{ time: Date | UNIX_MS }` (from the first
   * retained event at or after that time; a gap first when an event no longer retained may
   * be), each then live; see {@link Since}. Applied on the first connection only.
   */
  since?: Since;
  /** `"sse"` (default) or `"ws"`. */
  transport?: Transport;
  /** For SSE: `"fetch"` (default) or `"eventsource"`; see {@link SseImplementation}. */
  sse?: SseImplementation;
  /** With `sse: "eventsource"`: the event types to listen for besides untyped (`message`) events. */
  eventTypes?: string[];
  /** Persist positions here (overrides the client's `store`); `null` disables the client's. */
  store?: CursorStore | null;
  /**
   * The key under which positions are stored. Default: `sse:` + the channels joined with
   * `,` over SSE; over WebSocket each channel is stored under `ws:` + its name (this option
   * then replaces `ws:` as the prefix).
   */
  storeKey?: string;
  /** Whether to reconnect after a drop (default true). Off, a clean close ends the iterator and a failure is thrown. */
  reconnect?: boolean;
  /**
   * On a server without keys, who this subscriber is for presence (1 to 128 characters of
   * `A-Z a-z 0-9 . _ : @ -`): its connection to each channel whose namespace has presence makes
   * it a member there. On a server with keys a member is its token's `sub`, and this is refused
   * (`invalid_request`).
   */
  clientId?: string;
  /**
   * Also yield the join and leave of the channels' members ({@link PresenceUpdate}); default
   * false. Over SSE, channels without presence give none (none with it: `presence_disabled`);
   * over WebSocket every channel's namespace must have presence.
   */
  presence?: boolean;
}

/** A live subscription: an async iterable of {@link Update}s that resumes across drops. */
export class Subscription extends UpdateStream<Update> {
  /** The channels followed, without duplicates, in the order given. */
  readonly channels: readonly string[];
  readonly #core: Core;
  readonly #opts: SubscribeOptions;
  #cursor: string | undefined;
  readonly #wsCursors = new Map<string, string>();

  /** @internal Use {@link Client.subscribe}. */
  constructor(core: Core, channels: string[], opts: SubscribeOptions) {
    super();
    this.#core = core;
    this.#opts = opts;
    this.channels = [...new Set(channels)];
    this.#cursor = opts.cursor;
  }

  /**
   * Over SSE: the position after the last update delivered (or the last `id:`-only frame that
   * followed it); resume from it with `subscribe(channels, {cursor})`. `undefined` before
   * any position is known. Over WebSocket: the cursor of the only channel, if there is one.
   */
  get cursor(): string | undefined {
    if ((this.#opts.transport ?? "sse") === "ws") {
      return this.channels.length === 1 ? this.#wsCursors.get(this.channels[0]!) : undefined;
    }
    return this.#cursor;
  }

  /** Over WebSocket: each channel's position after the last update of it delivered. */
  get cursors(): ReadonlyMap<string, string> {
    return this.#wsCursors;
  }

  get #store(): CursorStore | undefined {
    return this.#opts.store === null ? undefined : (this.#opts.store ?? this.#core.store);
  }

  /** @internal */
  protected run(signal: AbortSignal): AsyncGenerator<Update, void, undefined> {
    if (this.channels.length === 0) {
      return (async function* () {
        throw new GaplessError({ code: "invalid_argument", message: "a subscription needs at least one channel" });
      })();
    }
    if ((this.#opts.transport ?? "sse") === "ws") return this.#runWs(signal);
    if (this.#opts.sse === "eventsource") return this.#runEventSource(signal);
    return this.#runFetch(signal);
  }

  async #persist(key: string, cursor: string): Promise<void> {
    const s = this.#store;
    if (s) await s.set(key, cursor);
  }

  #sseKey(): string {
    return this.#opts.storeKey ?? `sse:${this.channels.join(",")}`;
  }

  async #loadSseCursor(): Promise<void> {
    if (this.#cursor === undefined && this.#store) {
      const c = await this.#store.get(this.#sseKey());
      if (c) this.#cursor = c;
    }
  }

  async *#runFetch(signal: AbortSignal): AsyncGenerator<Update, void, undefined> {
    const core = this.#core;
    const reconnect = this.#opts.reconnect ?? true;
    const retrier = new Retrier(new Backoff(core.backoff));
    const key = this.#sseKey();
    await this.#loadSseCursor();
    while (!signal.aborted) {
      let conn: SseConnection;
      try {
        const token = await core.auth.fresh();
        conn = await SseConnection.open({
          base: core.base,
          channels: [...this.channels],
          cursor: this.#cursor,
          since: this.#opts.since ?? "live",
          token,
          withCredentials: core.withCredentials,
          fetch: core.fetch,
          headers: core.headers,
          idleTimeoutMs: core.idleTimeoutMs,
          maxEventBytes: core.maxEventBytes,
          signal,
          clientId: this.#opts.clientId,
          presence: this.#opts.presence,
        });
      } catch (e) {
        if (!(await retryAfterFailure(e, retrier, core, reconnect, signal))) return;
        continue;
      }
      const openedAt = Date.now();
      let end: { kind: "clean" } | { kind: "error"; error: GaplessError } | { kind: "expired"; error: GaplessError };
      try {
        for (;;) {
          const f = await conn.next();
          if (f === null) {
            end = { kind: "clean" };
            break;
          }
          if (f.t === "retry") {
            retrier.baseMs = f.ms;
            continue;
          }
          if (f.t === "expired") {
            end = { kind: "expired", error: f.error };
            break;
          }
          if (f.t === "cursor") {
            this.#cursor = f.cursor;
            retrier.proven();
            await this.#persist(key, f.cursor);
            continue;
          }
          let update: Update;
          if (f.t === "event") {
            this.#cursor = f.u.cursor;
            update = f.u;
          } else if (f.t === "ephemeral") {
            update = { ...f.u, cursor: this.#cursor ?? null } as EphemeralUpdate;
          } else if (f.t === "presence") {
            update = { ...f.u, cursor: this.#cursor ?? null } as PresenceUpdate;
          } else {
            // The server follows a gap notice with an id:-only frame carrying the new position.
            let next = conn.takeCursor();
            if (next === undefined && !conn.hasQueued) {
              const peek = await conn.next().catch(() => null);
              if (peek?.t === "cursor") next = peek.cursor;
              else if (peek) conn.unshift(peek);
            }
            if (next !== undefined) this.#cursor = next;
            update = { ...f.g, cursor: next ?? f.g.next } as GapUpdate;
          }
          // An id:-only frame right behind (as after a gap) takes effect with the update.
          const after = conn.takeCursor();
          if (after !== undefined) this.#cursor = after;
          if (this.#cursor !== undefined && update.kind !== "ephemeral" && update.kind !== "presence") {
            await this.#persist(key, this.#cursor);
          }
          if (signal.aborted) return;
          yield update;
          if (signal.aborted) return;
        }
      } catch (e) {
        if (signal.aborted || isAbort(e)) return;
        end = { kind: "error", error: asError(e) };
      } finally {
        conn.close();
      }
      if (end.kind === "expired") {
        if (!core.auth.canRefresh) throw end.error;
        // The loop asks getToken for a fresh token and resumes from the cursor: at once,
        // unless streams keep expiring right after they open (a token that is born stale).
        if (!(await sleep(retrier.closed(openedAt), signal))) return;
        continue;
      }
      if (end.kind === "clean") {
        if (!reconnect) return;
        if (!(await sleep(retrier.closed(openedAt), signal))) return;
        continue;
      }
      if (end.error.terminal || !reconnect) throw end.error;
      if (!(await sleep(retrier.failed(end.error.retryAfterMs), signal))) return;
    }
  }

  async *#runEventSource(signal: AbortSignal): AsyncGenerator<Update, void, undefined> {
    const core = this.#core;
    const ES = core.EventSource ?? (globalThis as { EventSource?: typeof EventSource }).EventSource;
    if (!ES) {
      throw new GaplessError({
        code: "invalid_argument",
        message: "this platform has no EventSource: use sse: \"fetch\" (the default) or pass one as the client's `EventSource` option",
      });
    }
    const reconnect = this.#opts.reconnect ?? true;
    const retrier = new Retrier(new Backoff(core.backoff));
    const key = this.#sseKey();
    await this.#loadSseCursor();
    type Item = { f: Frame } | { failed: true } | { error: GaplessError };
    while (!signal.aborted) {
      const token = await core.auth.fresh();
      const extra: [string, string][] = [];
      if (this.#cursor !== undefined) extra.push(["last_event_id", this.#cursor]);
      else if (this.#opts.since !== undefined && this.#opts.since !== "live") {
        extra.push(["since", sinceParam(this.#opts.since)]);
      }
      extra.push(...presenceParams(this.#opts.clientId, this.#opts.presence));
      if (token !== undefined) extra.push(["access_token", token]);
      const url = sseUrl(core.base, [...this.channels], extra);
      const es = new ES(url, { withCredentials: core.withCredentials });
      const openedAt = Date.now();
      const queue: Item[] = [];
      let wake: (() => void) | undefined;
      const push = (i: Item) => {
        queue.push(i);
        const w = wake;
        wake = undefined;
        w?.();
      };
      const onFrame = (type: string) => (ev: Event) => {
        const m = ev as MessageEvent<string>;
        try {
          const f = frameOf({ kind: "event", type, data: m.data, lastEventId: m.lastEventId });
          if (f) push({ f });
        } catch (e) {
          push({ error: asError(e) });
        }
      };
      const presence = this.#opts.presence ? ["gapless.presence"] : [];
      for (const t of new Set(["message", "gap", "gapless.expired", ...presence, ...(this.#opts.eventTypes ?? [])])) {
        es.addEventListener(t, onFrame(t));
      }
      es.addEventListener("open", () => {
        retrier.proven();
      });
      // readyState 2 (CLOSED) after an error: the browser gave up (a non-200 answer or a
      // wrong content type); 0 (CONNECTING): it is reconnecting by itself, with Last-Event-ID.
      es.addEventListener("error", () => {
        if (es.readyState === 2) push({ failed: true });
      });
      const onAbort = () => {
        es.close();
        const w = wake;
        wake = undefined;
        w?.();
      };
      signal.addEventListener("abort", onAbort, { once: true });
      let end: { kind: "failed" } | { kind: "expired"; error: GaplessError } | { kind: "error"; error: GaplessError } | undefined;
      try {
        while (!signal.aborted && end === undefined) {
          const item = queue.shift();
          if (item === undefined) {
            await new Promise<void>((r) => (wake = r));
            continue;
          }
          if ("failed" in item) end = { kind: "failed" };
          else if ("error" in item) end = { kind: "error", error: item.error };
          else {
            const f = item.f;
            let update: Update | undefined;
            if (f.t === "event") {
              this.#cursor = f.u.cursor;
              update = f.u;
            } else if (f.t === "ephemeral") update = { ...f.u, cursor: this.#cursor ?? null } as EphemeralUpdate;
            else if (f.t === "gap") update = { ...f.g, cursor: this.#cursor ?? f.g.next } as GapUpdate;
            else if (f.t === "expired") end = { kind: "expired", error: f.error };
            if (update) {
              if (this.#cursor !== undefined && update.kind === "event") await this.#persist(key, this.#cursor);
              yield update;
            }
          }
        }
      } finally {
        es.close();
        signal.removeEventListener("abort", onAbort);
      }
      if (signal.aborted || end === undefined) return;
      if (end.kind === "expired") {
        if (!core.auth.canRefresh) throw end.error;
        if (!(await sleep(retrier.closed(openedAt), signal))) return;
        continue;
      }
      if (end.kind === "error") throw end.error;
      // The browser gave up: ask the server why with a plain request, then decide.
      const why = await probe(core, url, token, signal);
      if (signal.aborted) return;
      if (why) {
        if (why.status === 401 && core.auth.canRefresh && !retrier.authRetried) {
          retrier.authRetried = true;
          continue;
        }
        if (why.terminal || !reconnect) throw why;
      } else if (!reconnect) return;
      if (!(await sleep(retrier.failed(why?.retryAfterMs), signal))) return;
    }
  }

  async *#runWs(signal: AbortSignal): AsyncGenerator<Update, void, undefined> {
    const core = this.#core;
    const reconnect = this.#opts.reconnect ?? true;
    const retrier = new Retrier(new Backoff(core.backoff));
    const prefix = this.#opts.storeKey ?? "ws:";
    const chans = this.channels;
    const since = sinceParam(this.#opts.since ?? "live");
    const store = this.#store;
    for (const ch of chans) {
      let c = this.#opts.cursor;
      if (c === undefined && store) c = (await store.get(prefix + ch)) ?? undefined;
      if (c !== undefined) this.#wsCursors.set(ch, c);
    }
    const setCursor = async (ch: string, c: string) => {
      this.#wsCursors.set(ch, c);
      if (store) await store.set(prefix + ch, c);
    };
    while (!signal.aborted) {
      let conn: WsConn;
      try {
        const token = await core.auth.fresh();
        conn = await WsConn.open(core, wsUrl(core, "/v1/ws", [], token), signal);
      } catch (e) {
        if (!(await retryAfterFailure(e, retrier, core, reconnect, signal))) return;
        continue;
      }
      chans.forEach((ch, i) => {
        const c = this.#wsCursors.get(ch);
        const msg: Record<string, unknown> = { op: "subscribe", id: i, channel: ch };
        if (c !== undefined) msg["cursor"] = c;
        else msg["since"] = since;
        if (this.#opts.clientId !== undefined) msg["client_id"] = this.#opts.clientId;
        if (this.#opts.presence) msg["presence"] = true;
        conn.send(msg);
      });
      const openedAt = Date.now();
      const touched = new Set<string>();
      // An `error` that answers none of our requests (a refused token): its close code follows.
      let refusal: { code: string; message: string } | undefined;
      let end: { kind: "clean" } | { kind: "error"; error: GaplessError };
      try {
        for (;;) {
          const item = await conn.next(signal);
          if (item.t === "closed") {
            const err = closeError(item.code, item.reason, refusal);
            end = err ? { kind: "error", error: err } : { kind: "clean" };
            break;
          }
          const m = item.msg;
          const op = m["op"];
          if (op === "error") {
            const i = typeof m["id"] === "number" ? m["id"] : -1;
            const ch = chans[i];
            if (ch === undefined) {
              refusal = { code: String(m["code"] ?? "error"), message: String(m["message"] ?? "") };
              continue;
            }
            const code = String(m["code"] ?? "error");
            const err = new GaplessError({
              code,
              message: `subscribe ${JSON.stringify(ch)}: ${String(m["message"] ?? code)}`,
              body: m,
            });
            // A refused subscribe (invalid_cursor, forbidden, limit_reached...) cannot be
            // fixed by retrying it; only 5xx codes are retried.
            if (err.status < 500 || !reconnect) throw err;
            end = { kind: "error", error: err };
            break;
          }
          const ch = typeof m["channel"] === "string" ? m["channel"] : undefined;
          if (ch === undefined || !chans.includes(ch)) continue;
          if (op === "subscribed") {
            retrier.proven();
            if (typeof m["cursor"] === "string" && !touched.has(ch)) await setCursor(ch, m["cursor"]);
            continue;
          }
          let update: Update;
          if (op === "event") {
            retrier.attempt = 0;
            touched.add(ch);
            const u: EventUpdate = {
              kind: "event",
              channel: ch,
              seq: Number(m["seq"]),
              cursor: String(m["cursor"]),
              type: typeof m["type"] === "string" ? m["type"] : null,
              data: payloadOf(m["data"], m["encoding"]),
              time: Number(m["time"] ?? 0),
            };
            await setCursor(ch, u.cursor);
            update = u;
          } else if (op === "gap") {
            touched.add(ch);
            const next = String(m["next"]);
            await setCursor(ch, next);
            update = {
              kind: "gap",
              channel: ch,
              cursor: next,
              type: "gap",
              data: JSON.stringify({ channel: ch, after: m["after"] ?? null, next, reason: m["reason"] }),
              after: typeof m["after"] === "string" ? m["after"] : null,
              next,
              reason: typeof m["reason"] === "string" ? m["reason"] : "unknown",
            };
          } else if (op === "presence") {
            const action = m["action"];
            if ((action !== "join" && action !== "leave") || typeof m["id"] !== "string") continue;
            update = {
              kind: "presence",
              channel: ch,
              cursor: this.#wsCursors.get(ch) ?? null,
              action,
              id: m["id"],
              type: "gapless.presence",
              data: JSON.stringify({ action, channel: ch, id: m["id"] }),
            };
          } else if (op === "ephemeral") {
            update = {
              kind: "ephemeral",
              channel: ch,
              cursor: this.#wsCursors.get(ch) ?? null,
              type: typeof m["type"] === "string" ? m["type"] : null,
              data: payloadOf(m["data"], m["encoding"]),
              time: Number(m["time"] ?? 0),
            };
          } else continue;
          if (signal.aborted) return;
          yield update;
          if (signal.aborted) return;
        }
      } catch (e) {
        if (signal.aborted || isAbort(e)) return;
        throw e;
      } finally {
        conn.close();
      }
      if (end.kind === "clean") {
        if (!reconnect) return;
        if (!(await sleep(retrier.closed(openedAt), signal))) return;
        continue;
      }
      const err = end.error;
      if (err.closeCode === 4401 && core.auth.canRefresh && (err.code === "token_expired" || !retrier.authRetried)) {
        if (err.code !== "token_expired") retrier.authRetried = true;
        else if (!(await sleep(retrier.closed(openedAt), signal))) return;
        continue;
      }
      if (err.terminal || !reconnect) throw err;
      if (!(await sleep(retrier.failed(err.retryAfterMs), signal))) return;
    }
  }
}

/** Any thrown value as a {@link GaplessError}. @internal */
export function asError(e: unknown): GaplessError {
  if (e instanceof GaplessError) return e;
  return new GaplessError({ code: "protocol", message: e instanceof Error ? e.message : String(e), cause: e });
}

/**
 * What every reconnecting loop does when opening a connection failed with `e`: true to try
 * again (at once for a 401 that a fresh token may answer, once until a connection proves
 * itself; otherwise after the backoff wait), false when `signal` ended it. Throws the error
 * when it is terminal, or when `reconnect` is off.
 * @internal
 */
export async function retryAfterFailure(
  e: unknown,
  retrier: Retrier,
  core: Core,
  reconnect: boolean,
  signal: AbortSignal,
): Promise<boolean> {
  if (signal.aborted || isAbort(e)) return false;
  const err = asError(e);
  if (err.status === 401 && core.auth.canRefresh && !retrier.authRetried) {
    retrier.authRetried = true;
    return true;
  }
  if (err.terminal || !reconnect) throw err;
  return sleep(retrier.failed(err.retryAfterMs), signal);
}

/**
 * Asks the server why an EventSource gave up, with a plain GET of the same stream: the
 * refusal, or `undefined` when the stream opens fine now (or the server is unreachable: then
 * a `network` error).
 */
async function probe(core: Core, url: string, token: string | undefined, signal: AbortSignal): Promise<GaplessError | undefined> {
  const ctl = new AbortController();
  const onAbort = () => ctl.abort();
  signal.addEventListener("abort", onAbort, { once: true });
  try {
    const headers: Record<string, string> = { accept: "text/event-stream" };
    if (token !== undefined) headers["authorization"] = `Bearer ${token}`;
    const res = await core.fetch(url, {
      headers,
      signal: ctl.signal,
      credentials: core.withCredentials ? "include" : "same-origin",
    });
    if (res.status >= 200 && res.status < 300) return undefined;
    return await errorFromResponse(res, `GET ${url}`);
  } catch (e) {
    return networkError(`GET ${url}`, e);
  } finally {
    ctl.abort();
    signal.removeEventListener("abort", onAbort);
  }
}
