/**
 * The exact join: a channel's history, then its live events, with every journaled event
 * delivered once and in order however publishes race the switch-over.
 *
 * Reading history and then opening a stream leaves a window in which a commit is lost;
 * opening the stream first and reading history afterwards overlaps. A join therefore:
 *
 * 1. opens the live stream first (`since=live`, over `fetch` streaming in every environment:
 *    the join needs the stream's `id:`-only preamble, which a native `EventSource` does not
 *    surface) and waits for its preamble, sent once the server registered the subscription;
 *    from then on every commit reaches the stream, which is buffered;
 * 2. pages history from its cursor until the page with `done: true`. That page's `next` is
 *    the **tip** and its `head` the tip's seq: everything up to the tip came from history,
 *    everything after it is (or will be) in the stream;
 * 3. drains the buffer, dropping journaled events whose seq is at or below the tip (the
 *    **tip filter**; it also drops anything at or below the last seq delivered), then follows
 *    the stream with the same filter. Ephemeral events are never filtered.
 *
 * The join remembers the highest applied cursor (the last event delivered, or the tip). After
 * a reconnection the next walk starts there, so a retry reads only what may have been missed.
 * A gap notice on the stream is not passed on: the join walks history again from its applied
 * cursor, and history says what is really lost: a `410 cursor_not_served` becomes a
 * {@link GapUpdate} (`after` = the applied cursor, `next` = the server's `floor_cursor`), and
 * the walk goes on from the oldest retained event.
 *
 * @module
 */

import { Backoff, Retrier } from "./backoff.js";
import type { Core } from "./core.js";
import { GaplessError } from "./errors.js";
import { sleep } from "./internal.js";
import { SseConnection } from "./live.js";
import type { Frame } from "./live.js";
import { UpdateStream } from "./stream.js";
import { retryAfterFailure } from "./subscribe.js";
import type { CursorStore, HistoryPage, Since, Update } from "./types.js";

/**
 * A boundary between two phases of a join, for tests that force publishes into each window.
 * @internal Not part of the stable API.
 */
export type JoinPhase =
  | { phase: "beforeLive" }
  | { phase: "liveOpen" }
  | { phase: "page"; n: number; done: boolean }
  | { phase: "drain"; remaining: number }
  | { phase: "following" };

/** Options of {@link Client.join}. */
export interface JoinOptions {
  /** Start after this cursor (a channel cursor, e.g. a previous join's {@link Join.cursor}); default: from the oldest retained event. Wins over the store. */
  cursor?: string;
  /**
   * Where the join starts when it has no cursor (none given, none in the store): as a
   * subscription's {@link Since} (default `"earliest"`): the history walk's first page asks
   * for it (`"last:N"`, `"time:UNIX_MS"`, or `"live"` for only what comes next), then goes on
   * to the tip and live, each event once. A time before the floor gives a gap (`evicted`)
   * first. After a reconnection the join resumes from its cursor. A value the server refuses
   * (`last:0`) ends the join with a terminal `invalid_request` {@link GaplessError}.
   */
  since?: Since;
  /** Events per history page, 1 to 1000 (default 1000). */
  pageSize?: number;
  /**
   * Most live frames buffered during a history walk (default 100000). Past it the stream is
   * closed and reopened after the walk: memory stays bounded whatever the publish rate.
   */
  maxBuffered?: number;
  /** Whether to reconnect after a drop (default true). Off, a clean close ends the join and a failure is thrown. */
  reconnect?: boolean;
  /** Persist the applied cursor here (overrides the client's `store`); `null` disables the client's. */
  store?: CursorStore | null;
  /** The key of the applied cursor in the store (default `join:` + the channel). */
  storeKey?: string;
  /** @internal Awaited at every phase boundary (tests only). */
  phaseHook?: (p: JoinPhase) => void | Promise<void>;
}

/** Reads one history page. @internal */
export type PageReader = (channel: string, after: string | undefined, limit: number, signal: AbortSignal, since?: Since) => Promise<HistoryPage>;

/** A running join: an async iterable of {@link Update}s (history, then live). */
export class Join extends UpdateStream<Update> {
  /** The channel joined. */
  readonly channel: string;
  readonly #core: Core;
  readonly #opts: JoinOptions;
  readonly #readPage: PageReader;
  #applied: string | undefined;

  /** @internal Use {@link Client.join}. */
  constructor(core: Core, channel: string, opts: JoinOptions, readPage: PageReader) {
    super();
    this.#core = core;
    this.channel = channel;
    this.#opts = opts;
    this.#readPage = readPage;
    this.#applied = opts.cursor;
  }

  /** The highest applied cursor: the last event delivered, or the tip of the last walk. Resume a later join from it. */
  get cursor(): string | undefined {
    return this.#applied;
  }

  /** @internal */
  protected async *run(signal: AbortSignal): AsyncGenerator<Update, void, undefined> {
    const core = this.#core;
    const opts = this.#opts;
    const channel = this.channel;
    const reconnect = opts.reconnect ?? true;
    const pageSize = opts.pageSize ?? 1000;
    const maxBuffered = Math.max(1, opts.maxBuffered ?? 100_000);
    const store = opts.store === null ? undefined : (opts.store ?? core.store);
    const key = opts.storeKey ?? `join:${channel}`;
    const phase = async (p: JoinPhase) => {
      if (opts.phaseHook) await opts.phaseHook(p);
    };
    if (this.#applied === undefined && store) this.#applied = (await store.get(key)) ?? undefined;
    const apply = async (c: string) => {
      this.#applied = c;
      if (store) await store.set(key, c);
    };
    const retrier = new Retrier(new Backoff(core.backoff));
    /** Waits per the failure `e`, or throws it when it is terminal; false when closed. */
    const failed = (e: unknown): Promise<boolean> => retryAfterFailure(e, retrier, core, reconnect, signal);

    cycle: while (!signal.aborted) {
      await phase({ phase: "beforeLive" });
      let conn: SseConnection;
      try {
        const token = await core.auth.fresh();
        conn = await SseConnection.open({
          base: core.base,
          channels: [channel],
          cursor: undefined,
          since: "live",
          token,
          withCredentials: core.withCredentials,
          fetch: core.fetch,
          headers: core.headers,
          idleTimeoutMs: core.idleTimeoutMs,
          maxEventBytes: core.maxEventBytes,
          signal,
        });
        try {
          await conn.waitPreamble();
        } catch (e) {
          conn.close();
          throw e;
        }
      } catch (e) {
        if (!(await failed(e))) return;
        continue cycle;
      }
      retrier.proven();
      const openedAt = Date.now();
      try {
        await phase({ phase: "liveOpen" });
        const buffer: Frame[] = [];
        // The read of the stream in flight while history is fetched (never lost: the drain
        // and the follow loop take it first).
        let inflight: Promise<{ f: Frame | null } | { e: unknown }> | undefined;
        const nextFrame = async (): Promise<Frame | null> => {
          const p = inflight;
          inflight = undefined;
          if (p) {
            const r = await p;
            if ("e" in r) throw r.e;
            return r.f;
          }
          return conn.next();
        };
        walk: for (;;) {
          let liveEnd: { kind: "clean" } | { kind: "failed"; e: unknown } | { kind: "overflow" } | undefined;
          /** Awaits `p` while moving the stream's frames into the buffer. */
          const pump = async <T>(p: Promise<T>): Promise<T> => {
            let settled = false;
            const done = p.then(
              () => {
                settled = true;
              },
              () => {
                settled = true;
              },
            );
            while (!settled && liveEnd === undefined) {
              inflight ??= conn.next().then(
                (f) => ({ f }),
                (e: unknown) => ({ e }),
              );
              const r = await Promise.race([done.then(() => undefined), inflight]);
              if (r === undefined) break;
              inflight = undefined;
              if ("e" in r) liveEnd = { kind: "failed", e: r.e };
              else if (r.f === null) liveEnd = { kind: "clean" };
              else {
                buffer.push(r.f);
                if (buffer.length > maxBuffered) liveEnd = { kind: "overflow" };
              }
            }
            return p;
          };
          // History, from the applied cursor to the tip, buffering the stream.
          let from = this.#applied;
          let n = 0;
          let tip: number;
          for (;;) {
            let page: HistoryPage;
            try {
              // The start applies while the join has no cursor yet.
              const since = from === undefined ? opts.since : undefined;
              page = await pump(this.#readPage(channel, from, pageSize, signal, since));
            } catch (e) {
              const err = e instanceof GaplessError ? e : undefined;
              const floor = err?.body?.["floor_cursor"];
              if (err && err.status === 410 && typeof floor === "string") {
                const after = from ?? null;
                await apply(floor);
                from = floor;
                yield {
                  kind: "gap",
                  channel,
                  cursor: floor,
                  type: "gap",
                  data: JSON.stringify({ channel, after, next: floor, reason: err.reason ?? "unknown" }),
                  after,
                  next: floor,
                  reason: err.reason ?? "unknown",
                };
                continue;
              }
              conn.close();
              if (!(await failed(e))) return;
              continue cycle;
            }
            n++;
            if (page.gap) {
              // A time before the floor: what is gone, then the floor.
              const g = page.gap;
              yield {
                kind: "gap",
                channel,
                cursor: g.next,
                type: "gap",
                data: JSON.stringify({ channel, after: g.after, next: g.next, reason: g.reason }),
                after: g.after,
                next: g.next,
                reason: g.reason,
              };
              if (signal.aborted) return;
            }
            for (const e of page.events) {
              await apply(e.cursor);
              yield { kind: "event", channel: e.channel ?? channel, seq: e.seq, cursor: e.cursor, type: e.type, data: e.data, time: e.time };
              if (signal.aborted) return;
            }
            if (page.done) {
              await apply(page.next);
              await phase({ phase: "page", n, done: true });
              tip = page.head;
              break;
            }
            from = page.next;
            await phase({ phase: "page", n, done: false });
          }
          // The stream stopped during the walk: its buffer may be stale; start over.
          if (liveEnd !== undefined) {
            conn.close();
            inflight = undefined;
            const expired = buffer.find((f) => f.t === "expired");
            if (expired?.t === "expired" && !core.auth.canRefresh) throw expired.error;
            if (liveEnd.kind === "overflow") continue cycle;
            if (liveEnd.kind === "clean") {
              if (!reconnect) return;
              if (!(await sleep(retrier.closed(openedAt), signal))) return;
              continue cycle;
            }
            if (!(await failed(liveEnd.e))) return;
            continue cycle;
          }
          // Drain the buffer, then follow the stream, past the tip only (the tip filter).
          let lastSeq = tip;
          let following = false;
          for (;;) {
            const buffered = buffer.shift();
            let f: Frame | null;
            if (buffered !== undefined) f = buffered;
            else {
              if (!following) {
                following = true;
                await phase({ phase: "following" });
              }
              try {
                f = await nextFrame();
              } catch (e) {
                conn.close();
                if (!(await failed(e))) return;
                continue cycle;
              }
              if (f === null) {
                conn.close();
                if (!reconnect) return;
                if (!(await sleep(retrier.closed(openedAt), signal))) return;
                continue cycle;
              }
            }
            switch (f.t) {
              case "event":
                if (f.u.seq > lastSeq) {
                  lastSeq = f.u.seq;
                  await apply(f.u.cursor);
                  yield f.u;
                  if (signal.aborted) return;
                }
                break;
              case "ephemeral":
                yield { ...f.u, cursor: this.#applied ?? null };
                if (signal.aborted) return;
                break;
              case "gap":
                // The stream skipped a range: history says whether it is really lost.
                continue walk;
              case "expired":
                conn.close();
                if (!core.auth.canRefresh) throw f.error;
                if (!(await sleep(retrier.closed(openedAt), signal))) return;
                continue cycle;
              case "retry":
                retrier.baseMs = f.ms;
                break;
              case "cursor":
                break;
            }
            if (buffered !== undefined) await phase({ phase: "drain", remaining: buffer.length });
          }
        }
      } finally {
        conn.close();
      }
    }
  }
}

/** One step of {@link fold}: the state after an update. */
export interface FoldStep<S> {
  /** The state after `update`. */
  state: S;
  /** What was folded in. */
  update: Update;
  /** The join's applied cursor after `update`: persist it with `state` to resume later. */
  cursor: string | undefined;
}

/**
 * Folds a join (or any stream of updates) into a state view: for each update, `reducer(state,
 * update)` gives the next state, and the step is yielded. Gap updates are folded like any
 * other: a reducer typically resets what it derived from the channel on one.
 *
 * @example
 * ```ts
 * for await (const { state } of fold(client.join("scores"), (s, u) => u.kind === "event" ? s + 1 : s, 0)) render(state);
 * ```
 * @throws the join's terminal {@link GaplessError}, or whatever `reducer` throws (the join is closed then).
 */
export async function* fold<S>(
  join: AsyncIterable<Update> & { cursor?: string | undefined },
  reducer: (state: S, update: Update) => S,
  initial: S,
): AsyncGenerator<FoldStep<S>, void, undefined> {
  let state = initial;
  for await (const update of join) {
    state = reducer(state, update);
    yield { state, update, cursor: join.cursor };
  }
}
