/**
 * The {@link Client}: publish, history, subscriptions, the exact join and sessions, against
 * one gapless server.
 *
 * @module
 */

import type { BackoffOptions } from "./backoff.js";
import { request, requestJson } from "./core.js";
import type { Core, EventSourceConstructor } from "./core.js";
import { GaplessError } from "./errors.js";
import { Auth, payloadOf, segment, sinceParam } from "./internal.js";
import { Join } from "./join.js";
import type { JoinOptions } from "./join.js";
import { SessionConsumer } from "./session.js";
import type { AttachOptions } from "./session.js";
import { DEFAULT_MAX_EVENT_BYTES } from "./sse.js";
import { Subscription } from "./subscribe.js";
import type { SubscribeOptions } from "./subscribe.js";
import type {
  BatchItem,
  BatchPublished,
  ChannelInfo,
  ChannelPresence,
  CursorStore,
  EphemeralDelivered,
  HistoryEvent,
  HistoryPage,
  Published,
  SessionAppended,
  SessionInfo,
  Since,
  WebSocketConstructor,
} from "./types.js";

/** Options of a {@link Client}. */
export interface ClientOptions {
  /** A bearer token (JWT) sent with every request and connection. */
  token?: string;
  /**
   * Supplies a fresh token before each (re)connect of a stream, and for requests (its last
   * answer is reused by plain requests until a 401 asks for a new one). Preferred over `token`.
   * When a stream's token expires the SDK calls it and resumes from the last delivered cursor.
   */
  getToken?: () => string | Promise<string>;
  /**
   * Send cookies (e.g. `gapless_token`) with cross-origin requests: `fetch` with
   * `credentials: "include"`, `EventSource` with `withCredentials`. Default false
   * (same-origin cookies are always sent).
   */
  withCredentials?: boolean;
  /** Positions of subscriptions and joins are persisted here (see {@link localStorageStore}). Default: none. */
  store?: CursorStore;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  /** The WebSocket constructor (default: the global one; on Node 20 pass the `ws` package's). */
  WebSocket?: WebSocketConstructor;
  /** The EventSource constructor for `sse: "eventsource"` (default: the global one). */
  EventSource?: EventSourceConstructor;
  /** Extra headers for every HTTP request (not for WebSocket or native EventSource). */
  headers?: Record<string, string>;
  /** Reconnection delays of streams (full jitter; initial 1000 ms, max 30000 ms). */
  backoff?: BackoffOptions;
  /**
   * Treat an SSE stream that brings no byte for this long as dropped and reconnect, in
   * milliseconds (default 45000: three of the server's default 15 s heartbeats); 0 = never.
   */
  idleTimeoutMs?: number;
  /** The largest SSE event block or WebSocket message accepted, in bytes (default 16 MiB). */
  maxEventBytes?: number;
}

/** Options of {@link Client.publish}. */
export interface PublishOptions {
  /** The event's type (1 to 64 of `A-Z a-z 0-9 _ - . :`; `gap` and `gapless.*` are reserved). */
  type?: string;
  /** 1 to 256 visible ASCII characters: a retry with the same key appends nothing and answers the original seq. */
  idempotencyKey?: string;
  /** Deliver live only: no seq, never journaled, never replayed. */
  ephemeral?: boolean;
  /** Aborts the request. */
  signal?: AbortSignal;
}

/** Options of {@link Client.history} and {@link Client.historyAll}. */
export interface HistoryOptions {
  /** Start after this cursor (default: from the oldest retained event). Wins over `since`. */
  after?: string;
  /**
   * Without `after`: where the page starts ({@link Since}): `"earliest"` (the default),
   * `"live"` (an empty page at the head), `"last:N"`, `"time:UNIX_MS"` (with the page's `gap`
   * when an event no longer retained may be at or after it). {@link Client.historyAll} reads on
   * with `after`.
   */
  since?: Since;
  /** Events per page, 1 to 1000 (default 100 on the server). */
  limit?: number;
  /** Aborts the request(s). */
  signal?: AbortSignal;
}

interface RawPage {
  channel: string;
  epoch: string;
  floor: number;
  head: number;
  events: (Omit<HistoryEvent, "channel" | "data"> & { data: string; encoding?: string })[];
  next: string;
  done: boolean;
  gap?: HistoryPage["gap"];
}

/**
 * A client of one gapless server. Cheap to create; holds no connection itself.
 *
 * @example
 * ```ts
 * const client = new Client("http://127.0.0.1:8080");
 * await client.publish("news", "hello");
 * for await (const u of client.subscribe(["news"])) console.log(u.kind, u.data);
 * ```
 */
export class Client {
  /** The server's base URL, without a trailing slash. */
  readonly url: string;
  readonly #core: Core;

  /**
   * @param url the server, e.g. `http://127.0.0.1:8080` (a path prefix is kept).
   * @throws {GaplessError} `invalid_argument` for a URL that is not http(s), or when the platform has no `fetch` and none is given.
   */
  constructor(url: string, opts: ClientOptions = {}) {
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw new GaplessError({ code: "invalid_argument", message: `not a URL: ${JSON.stringify(url)}` });
    }
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
      throw new GaplessError({ code: "invalid_argument", message: `the server URL must be http(s): ${url}` });
    }
    const f = opts.fetch ?? globalThis.fetch?.bind(globalThis);
    if (!f) throw new GaplessError({ code: "invalid_argument", message: "this platform has no fetch; pass one as the `fetch` option" });
    this.url = url.replace(/\/+$/, "");
    this.#core = {
      base: this.url,
      auth: new Auth(opts.token, opts.getToken),
      fetch: f,
      WebSocket: opts.WebSocket,
      EventSource: opts.EventSource,
      withCredentials: opts.withCredentials ?? false,
      headers: opts.headers ?? {},
      store: opts.store,
      backoff: opts.backoff ?? {},
      idleTimeoutMs: opts.idleTimeoutMs ?? 45_000,
      maxEventBytes: opts.maxEventBytes ?? DEFAULT_MAX_EVENT_BYTES,
    };
  }

  /**
   * Publishes one event (`POST /v1/channels/{channel}/events`).
   * @returns {@link Published} (`duplicate` on an idempotent retry), or {@link EphemeralDelivered} when `ephemeral`.
   * @throws {GaplessError} 400 `invalid_channel`/`invalid_type`/`invalid_request`, 413 `too_large`,
   * 401/403, 429 `rate_limited` (see `retryAfterMs`), 500 `journal_failed`, 503, `network`.
   */
  publish(channel: string, data: string, opts: PublishOptions & { ephemeral: true }): Promise<EphemeralDelivered>;
  publish(channel: string, data: string, opts?: PublishOptions & { ephemeral?: false }): Promise<Published>;
  publish(channel: string, data: string, opts?: PublishOptions): Promise<Published | EphemeralDelivered>;
  async publish(channel: string, data: string, opts: PublishOptions = {}): Promise<Published | EphemeralDelivered> {
    const query: [string, string][] = [];
    if (opts.type !== undefined) query.push(["type", opts.type]);
    if (opts.ephemeral) query.push(["ephemeral", "true"]);
    const headers: Record<string, string> = { "content-type": "text/plain; charset=utf-8" };
    if (opts.idempotencyKey !== undefined) headers["idempotency-key"] = opts.idempotencyKey;
    const { status, body } = await requestJson<Record<string, unknown>>(this.#core, {
      method: "POST",
      path: `/v1/channels/${segment(channel)}/events`,
      query,
      body: data,
      headers,
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
    if (opts.ephemeral) return { channel: String(body["channel"]), subscribers: Number(body["subscribers"] ?? 0) };
    return { channel: String(body["channel"]), seq: Number(body["seq"]), cursor: String(body["cursor"]), duplicate: status === 200 };
  }

  /**
   * Publishes several events atomically (all or none), in order, with consecutive seqs
   * (`POST /v1/channels/{channel}/batch`).
   * @param events 1 to `--max-batch-events` (1000) items; strings are data without a type.
   * @throws {GaplessError} as {@link publish}; 413 `too_large` over the batch limits.
   */
  async publishBatch(
    channel: string,
    events: (string | { data: string; type?: string })[],
    opts: { idempotencyKey?: string; signal?: AbortSignal } = {},
  ): Promise<BatchPublished> {
    const items = events.map((e) => (typeof e === "string" ? { data: e } : e.type === undefined ? { data: e.data } : { data: e.data, type: e.type }));
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (opts.idempotencyKey !== undefined) headers["idempotency-key"] = opts.idempotencyKey;
    const { status, body } = await requestJson<{
      channel: string;
      first_seq: number;
      last_seq: number;
      cursor: string;
      events: BatchItem[];
    }>(this.#core, {
      method: "POST",
      path: `/v1/channels/${segment(channel)}/batch`,
      body: JSON.stringify(items),
      headers,
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
    return {
      channel: body.channel,
      firstSeq: body.first_seq,
      lastSeq: body.last_seq,
      cursor: body.cursor,
      events: body.events,
      duplicate: status === 200,
    };
  }

  /**
   * One page of history (`GET /v1/channels/{channel}/events`): the events after `after` (or
   * from the oldest retained), at most `limit`. Pass the page's `next` as `after` for the next
   * page; the page with `done: true` has the tip as `next` (subscribe from it to follow live).
   * @throws {GaplessError} 410 `cursor_not_served` (see `reason`, and `body.floor_cursor`, the
   * cursor that reads everything retained), 400 `invalid_cursor`, 401/403, `network`.
   */
  async history(channel: string, opts: HistoryOptions = {}): Promise<HistoryPage> {
    const query: [string, string][] = [];
    if (opts.after !== undefined) query.push(["after", opts.after]);
    else if (opts.since !== undefined) query.push(["since", sinceParam(opts.since)]);
    if (opts.limit !== undefined) query.push(["limit", String(opts.limit)]);
    const { body } = await requestJson<RawPage>(this.#core, {
      method: "GET",
      path: `/v1/channels/${segment(channel)}/events`,
      query,
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
    const events = body.events.map(({ encoding, ...e }) => ({ ...e, channel: body.channel, data: payloadOf(e.data, encoding) }));
    return { ...body, events };
  }

  /**
   * Every retained event after `after`, page by page, up to the head at the time of the last
   * page (an async iterator over pages; stops after the page with `done: true`).
   * @throws {GaplessError} as {@link history}.
   */
  async *historyAll(channel: string, opts: HistoryOptions = {}): AsyncGenerator<HistoryPage, void, undefined> {
    let after = opts.after;
    for (;;) {
      const page = await this.history(channel, { ...opts, ...(after !== undefined ? { after } : {}) });
      yield page;
      if (page.done) return;
      after = page.next;
    }
  }

  /**
   * Purges a channel (`DELETE /v1/channels/{channel}`): removes every event and starts a new
   * epoch. Every subscriber gets one `epoch` gap, then the events published after the purge;
   * a channel never published to is purged too (nothing changes). Needs the publish right.
   * @throws {GaplessError} 400 `invalid_channel`, 401/403, `network`.
   */
  async purge(channel: string): Promise<void> {
    const res = await request(this.#core, { method: "DELETE", path: `/v1/channels/${segment(channel)}` });
    await res.body?.cancel().catch(() => {});
  }

  /**
   * Who follows a channel (`GET /v1/channels/{channel}/presence`): its occupancy (connections,
   * members' or not) and its members sorted by id. Needs the subscribe right; the channel's
   * namespace must have presence.
   * @throws {GaplessError} 404 `presence_disabled`, 400 `invalid_channel`, 401/403, `network`.
   */
  async presence(channel: string): Promise<ChannelPresence> {
    return (await requestJson<ChannelPresence>(this.#core, { method: "GET", path: `/v1/channels/${segment(channel)}/presence` }))
      .body;
  }

  /**
   * A channel's state (`GET /v1/channels/{channel}`).
   * @throws {GaplessError} 400 `invalid_channel`, 401/403, `network`.
   */
  async channel(channel: string): Promise<ChannelInfo> {
    const { body } = await requestJson<Partial<ChannelInfo> & Omit<ChannelInfo, "namespace" | "retention">>(this.#core, {
      method: "GET",
      path: `/v1/channels/${segment(channel)}`,
    });
    const r = body.retention;
    return {
      ...body,
      namespace: body.namespace ?? "",
      retention: { events: r?.events ?? 0, ms: r?.ms ?? 0, bytes: r?.bytes ?? 0 },
    };
  }

  /**
   * Follows `channels` (one or several) and resumes after any drop from the last update
   * delivered; see {@link Subscription}. Starts when first iterated (or on the first `on`).
   * Without `cursor`, a position in the store (if any) is used, else `since`.
   */
  subscribe(channels: string | string[], opts: SubscribeOptions = {}): Subscription {
    return new Subscription(this.#core, typeof channels === "string" ? [channels] : channels, opts);
  }

  /**
   * The exact join of `channel`: its history after `cursor` (default: everything retained),
   * then live, each event once and in order; see {@link Join}.
   */
  join(channel: string, opts: JoinOptions = {}): Join {
    return new Join(this.#core, channel, opts, (ch, after, limit, signal, since) =>
      this.history(ch, { ...(after !== undefined ? { after } : since !== undefined ? { since } : {}), limit, signal }),
    );
  }

  /**
   * Creates a session (`POST /v1/sessions`): with `id` (1 to 128 of `A-Z a-z 0-9 _ -`), or a
   * random 128-bit hex id drawn by the server. Its head is 1 (the opening marker).
   * @throws {GaplessError} 409 `session_exists`, 400 `invalid_request`, 401/403, `network`.
   */
  async createSession(id?: string): Promise<SessionInfo> {
    return (
      await requestJson<SessionInfo>(this.#core, {
        method: "POST",
        path: "/v1/sessions",
        ...(id !== undefined ? { body: JSON.stringify({ id }), headers: { "content-type": "application/json" } } : {}),
      })
    ).body;
  }

  /**
   * Appends an event to a session (`POST /v1/sessions/{id}/events`).
   * @throws {GaplessError} 404 `session_not_found`, 409 `session_ended` (`body.status` says how), 400, 413.
   */
  async appendSession(id: string, data: string, opts: { type?: string; idempotencyKey?: string } = {}): Promise<SessionAppended> {
    const query: [string, string][] = opts.type !== undefined ? [["type", opts.type]] : [];
    const headers: Record<string, string> = { "content-type": "text/plain; charset=utf-8" };
    if (opts.idempotencyKey !== undefined) headers["idempotency-key"] = opts.idempotencyKey;
    const { status, body } = await requestJson<{ id: string; seq: number; attached: boolean }>(this.#core, {
      method: "POST",
      path: `/v1/sessions/${segment(id)}/events`,
      query,
      body: data,
      headers,
    });
    return { ...body, duplicate: status === 200 };
  }

  /** Completes a session. @throws {GaplessError} 404, 409 `session_ended`. */
  async completeSession(id: string): Promise<SessionInfo> {
    return (await requestJson<SessionInfo>(this.#core, { method: "POST", path: `/v1/sessions/${segment(id)}/complete` })).body;
  }

  /** Cancels a session. @throws {GaplessError} 404, 409 `session_ended`. */
  async cancelSession(id: string): Promise<SessionInfo> {
    return (await requestJson<SessionInfo>(this.#core, { method: "POST", path: `/v1/sessions/${segment(id)}/cancel` })).body;
  }

  /** A session's state. @throws {GaplessError} 404 `session_not_found`. */
  async sessionInfo(id: string): Promise<SessionInfo> {
    return (await requestJson<SessionInfo>(this.#core, { method: "GET", path: `/v1/sessions/${segment(id)}` })).body;
  }

  /**
   * Attaches to a session as its consumer over WebSocket; see {@link SessionConsumer}.
   * Refusals (4400, 4404, 4409, 4410, 4403) end it with a typed error and never reconnect.
   */
  attachSession(id: string, opts: AttachOptions = {}): SessionConsumer {
    return new SessionConsumer(this.#core, id, opts, (sid) => this.sessionInfo(sid));
  }
}
