/**
 * One SSE connection over `fetch` streaming: the request, the status checks, and the frames it
 * carries, decoded from `?format=envelope` data by {@link SseParser}. Subscriptions and joins
 * build their reconnecting logic on top; a connection never reconnects by itself.
 *
 * @module
 * @internal
 */

import { GaplessError, errorFromResponse, isAbort, networkError } from "./errors.js";
import { SseParser } from "./sse.js";
import type { SseItem } from "./sse.js";
import type { EphemeralUpdate, EventUpdate, GapUpdate, PresenceUpdate } from "./types.js";
import { segment, withQuery } from "./internal.js";
import { payloadOf, sinceParam } from "./internal.js";
import type { Since } from "./internal.js";

/** A gap notice before the `id:` frame that follows it gives its position. @internal */
export type RawGap = Omit<GapUpdate, "cursor">;

/** What one SSE connection carries, in stream order. @internal */
export type Frame =
  | { t: "event"; u: EventUpdate }
  | { t: "ephemeral"; u: Omit<EphemeralUpdate, "cursor"> }
  | { t: "presence"; u: Omit<PresenceUpdate, "cursor"> }
  | { t: "gap"; g: RawGap }
  | { t: "cursor"; cursor: string }
  | { t: "retry"; ms: number }
  | { t: "expired"; error: GaplessError };

/** How to open a stream. @internal */
export interface LiveTarget {
  base: string;
  channels: string[];
  /** Sent as `Last-Event-ID`: wins over `since`. */
  cursor: string | undefined;
  since: Since;
  token: string | undefined;
  withCredentials: boolean;
  fetch: typeof fetch;
  headers: Record<string, string>;
  /** Treat a stream silent this long (ms) as dropped; 0 = never. */
  idleTimeoutMs: number;
  maxEventBytes: number;
  /** The caller's close. */
  signal: AbortSignal;
  /** `?client_id=`: who the subscriber is for presence, on a server without keys. */
  clientId?: string | undefined;
  /** `?presence=true`: the join and leave notices of the channels' members. */
  presence?: boolean | undefined;
}

/** The query parameters of a stream's presence options. @internal */
export function presenceParams(clientId: string | undefined, presence: boolean | undefined): [string, string][] {
  const extra: [string, string][] = [];
  if (clientId !== undefined) extra.push(["client_id", clientId]);
  if (presence) extra.push(["presence", "true"]);
  return extra;
}

/** The URL of an SSE stream of `channels` (envelope format). @internal */
export function sseUrl(base: string, channels: string[], extra: [string, string][]): string {
  if (channels.length === 1) {
    return withQuery(`${base}/v1/channels/${segment(channels[0]!)}/sse`, [["format", "envelope"], ...extra]);
  }
  return withQuery(`${base}/v1/sse`, [...channels.map((c): [string, string] => ["channel", c]), ["format", "envelope"], ...extra]);
}

/** Decodes one dispatched SSE item into a frame (envelope data). @internal */
export function frameOf(item: SseItem): Frame | undefined {
  switch (item.kind) {
    case "retry":
      return { t: "retry", ms: item.ms };
    case "id":
      return item.lastEventId === "" ? undefined : { t: "cursor", cursor: item.lastEventId };
    case "event":
      break;
  }
  if (item.type === "gapless.expired") {
    let body: Record<string, unknown> | undefined;
    try {
      body = JSON.parse(item.data) as Record<string, unknown>;
    } catch {
      body = undefined;
    }
    const message = typeof body?.["message"] === "string" ? (body["message"] as string) : "token expired";
    return { t: "expired", error: new GaplessError({ code: "token_expired", message, status: 401, body }) };
  }
  if (item.type === "gapless.presence") {
    let p: Record<string, unknown> | undefined;
    try {
      p = JSON.parse(item.data) as Record<string, unknown>;
    } catch {
      p = undefined;
    }
    const action = p?.["action"];
    if (typeof p?.["channel"] !== "string" || typeof p["id"] !== "string" || (action !== "join" && action !== "leave")) {
      throw new GaplessError({ code: "protocol", message: `malformed presence notice: ${item.data.slice(0, 200)}` });
    }
    return {
      t: "presence",
      u: { kind: "presence", channel: p["channel"], action, id: p["id"], type: "gapless.presence", data: item.data },
    };
  }
  let v: Record<string, unknown>;
  try {
    v = JSON.parse(item.data) as Record<string, unknown>;
    if (v === null || typeof v !== "object") throw new Error("not an object");
  } catch (e) {
    throw new GaplessError({ code: "protocol", message: `SSE data is not a gapless envelope: ${String(e)}` });
  }
  if (item.type === "gap") {
    if (typeof v["channel"] !== "string" || typeof v["next"] !== "string") {
      throw new GaplessError({ code: "protocol", message: `malformed gap notice: ${item.data}` });
    }
    return {
      t: "gap",
      g: {
        kind: "gap",
        channel: v["channel"],
        type: "gap",
        data: item.data,
        after: typeof v["after"] === "string" ? v["after"] : null,
        next: v["next"],
        reason: typeof v["reason"] === "string" ? v["reason"] : "unknown",
      },
    };
  }
  if (typeof v["channel"] !== "string" || typeof v["data"] !== "string") {
    throw new GaplessError({ code: "protocol", message: `SSE data is not a gapless envelope: ${item.data.slice(0, 200)}` });
  }
  const type = typeof v["type"] === "string" ? v["type"] : null;
  const time = typeof v["time"] === "number" ? v["time"] : 0;
  const data = payloadOf(v["data"], v["encoding"]);
  if (typeof v["seq"] !== "number") {
    return { t: "ephemeral", u: { kind: "ephemeral", channel: v["channel"], type, data, time } };
  }
  if (item.lastEventId === "") {
    throw new GaplessError({ code: "protocol", message: "a journaled event arrived with no id" });
  }
  return {
    t: "event",
    u: { kind: "event", channel: v["channel"], seq: v["seq"], cursor: item.lastEventId, type, data, time },
  };
}

/** An open SSE response and its parser. @internal */
export class SseConnection {
  readonly #reader: ReadableStreamDefaultReader<Uint8Array>;
  readonly #parser: SseParser;
  readonly #queue: Frame[] = [];
  readonly #ctl: AbortController;
  readonly #idleTimeoutMs: number;
  readonly #unlink: () => void;
  #ended = false;
  #idle = false;
  #pendingError: GaplessError | undefined;

  private constructor(
    reader: ReadableStreamDefaultReader<Uint8Array>,
    ctl: AbortController,
    t: LiveTarget,
    unlink: () => void,
  ) {
    this.#reader = reader;
    this.#ctl = ctl;
    this.#parser = new SseParser(t.maxEventBytes);
    this.#idleTimeoutMs = t.idleTimeoutMs;
    this.#unlink = unlink;
  }

  /**
   * Opens a stream and checks the answer: 200 with `text/event-stream`.
   * @throws {GaplessError} `network` (unreachable), the server's refusal (401, 403, 400, 503...),
   * `protocol` (a 2xx answer that is not an event stream). Rejects with an `AbortError` when
   * the caller's signal aborts.
   */
  static async open(t: LiveTarget): Promise<SseConnection> {
    if (t.channels.length === 0) {
      throw new GaplessError({ code: "invalid_argument", message: "a subscription needs at least one channel" });
    }
    const ctl = new AbortController();
    const onAbort = () => ctl.abort();
    t.signal.addEventListener("abort", onAbort, { once: true });
    const unlink = () => t.signal.removeEventListener("abort", onAbort);
    if (t.signal.aborted) ctl.abort();
    const headers: Record<string, string> = { ...t.headers, accept: "text/event-stream" };
    if (t.cursor !== undefined) headers["last-event-id"] = t.cursor;
    if (t.token !== undefined) headers["authorization"] = `Bearer ${t.token}`;
    const extra: [string, string][] = t.cursor === undefined && t.since !== "live" ? [["since", sinceParam(t.since)]] : [];
    extra.push(...presenceParams(t.clientId, t.presence));
    const url = sseUrl(t.base, t.channels, extra);
    let timer: ReturnType<typeof setTimeout> | undefined;
    if (t.idleTimeoutMs > 0) timer = setTimeout(() => ctl.abort(), t.idleTimeoutMs);
    let res: Response;
    try {
      res = await t.fetch(url, {
        headers,
        signal: ctl.signal,
        cache: "no-store",
        credentials: t.withCredentials ? "include" : "same-origin",
      });
    } catch (e) {
      unlink();
      if (t.signal.aborted) throw e;
      if (isAbort(e)) {
        throw new GaplessError({ code: "network", message: `no answer from ${url} within ${t.idleTimeoutMs} ms` });
      }
      throw networkError(`GET ${url}`, e);
    } finally {
      if (timer !== undefined) clearTimeout(timer);
    }
    if (res.status < 200 || res.status >= 300) {
      unlink();
      throw await errorFromResponse(res, `GET ${url}`);
    }
    const ctype = res.headers.get("content-type") ?? "";
    if (res.status !== 200 || !ctype.startsWith("text/event-stream") || res.body === null) {
      unlink();
      ctl.abort();
      throw new GaplessError({
        code: "protocol",
        message: `status ${res.status} with content type ${JSON.stringify(ctype)} where an event stream was expected`,
      });
    }
    return new SseConnection(res.body.getReader(), ctl, t, unlink);
  }

  /**
   * The next frame; `null` once the server closed the stream cleanly (an unterminated last
   * block is dropped, as the standard says).
   * @throws {GaplessError} the connection failed or was idle too long, a frame was malformed,
   * or an event was too large. Rejects with an `AbortError` after {@link close}.
   */
  async next(): Promise<Frame | null> {
    for (;;) {
      const f = this.#queue.shift();
      if (f !== undefined) return f;
      if (this.#pendingError) throw this.#pendingError;
      if (this.#ended) return null;
      await this.#readChunk();
    }
  }

  /** The next frame if it is already parsed and is an `id:`-only frame (taken), else undefined. */
  takeCursor(): string | undefined {
    const f = this.#queue[0];
    if (f?.t !== "cursor") return undefined;
    this.#queue.shift();
    return f.cursor;
  }

  /** Puts a frame back at the head of the queue (after a look ahead). */
  unshift(f: Frame): void {
    this.#queue.unshift(f);
  }

  /** Whether a frame is already parsed and waiting. */
  get hasQueued(): boolean {
    return this.#queue.length > 0;
  }

  /**
   * Reads until the stream's preamble is complete: its first `id:`-only frame, sent once the
   * server registered the subscription (after `retry:` and any gap notices, which stay queued).
   */
  async waitPreamble(): Promise<void> {
    for (;;) {
      if (this.#queue.some((f) => f.t === "cursor")) return;
      if (this.#pendingError) throw this.#pendingError;
      if (this.#ended) {
        throw new GaplessError({ code: "disconnected", message: "the stream ended before its first position" });
      }
      await this.#readChunk();
    }
  }

  /** The first `id:`-only frame already received, if nothing but `retry:` comes before it. */
  leadingCursor(): string | undefined {
    for (const f of this.#queue) {
      if (f.t === "retry") continue;
      return f.t === "cursor" ? f.cursor : undefined;
    }
    return undefined;
  }

  /** Closes the connection at once. */
  close(): void {
    this.#ended = true;
    this.#unlink();
    this.#ctl.abort();
    this.#reader.cancel().catch(() => {});
  }

  async #readChunk(): Promise<void> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    if (this.#idleTimeoutMs > 0) {
      timer = setTimeout(() => {
        this.#idle = true;
        this.#ctl.abort();
      }, this.#idleTimeoutMs);
    }
    let r: ReadableStreamReadResult<Uint8Array>;
    try {
      r = await this.#reader.read();
    } catch (e) {
      if (this.#idle) {
        this.#ended = true;
        this.#pendingError = new GaplessError({
          code: "disconnected",
          message: `the stream brought nothing for ${this.#idleTimeoutMs} ms`,
        });
        throw this.#pendingError;
      }
      if (isAbort(e)) throw e;
      this.#ended = true;
      this.#pendingError = new GaplessError({
        code: "network",
        message: `the stream broke: ${(e as Error)?.message ?? String(e)}`,
        cause: e,
      });
      throw this.#pendingError;
    } finally {
      if (timer !== undefined) clearTimeout(timer);
    }
    if (r.done) {
      this.#parser.finish();
      this.#ended = true;
      this.#unlink();
      return;
    }
    try {
      this.#parser.feed(r.value, (item) => {
        const f = frameOf(item);
        if (f !== undefined) this.#queue.push(f);
      });
    } catch (e) {
      this.#pendingError =
        e instanceof GaplessError ? e : new GaplessError({ code: "protocol", message: String(e), cause: e });
      this.close();
    }
  }
}
