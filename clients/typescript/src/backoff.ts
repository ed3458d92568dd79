/**
 * Reconnection delays: exponential backoff with full jitter, capped, whose base is the
 * server's `retry:` (or {@link BackoffOptions.initialMs} until one arrives, and always over
 * WebSocket, which has no `retry:`).
 *
 * Retry number `n` (0 for the first after a failure) waits a uniformly random time in
 * `[0, min(maxMs, base × 2ⁿ)]` ("full jitter": many clients cut off together do not come back
 * together). A clean close by the server reconnects at once, unless two streams in a row
 * closed within a second of opening (then it waits as after a failure, so a server that
 * accepts and closes at once cannot make a client spin). A `Retry-After` from the server
 * (429, 503) is a floor on the wait.
 *
 * @module
 */

/** Settings of {@link Backoff}. */
export interface BackoffOptions {
  /** The base, in milliseconds, before the server has sent `retry:`. Default 1000. */
  initialMs?: number;
  /** The cap on any one wait, in milliseconds. Default 30000. */
  maxMs?: number;
  /** A source of uniform random numbers in [0, 1) (default `Math.random`; tests inject one). */
  random?: () => number;
}

/** Full-jitter exponential backoff (see the module doc). */
export class Backoff {
  /** The base before any `retry:`, in milliseconds. */
  readonly initialMs: number;
  /** The cap on one wait, in milliseconds. */
  readonly maxMs: number;
  readonly #random: () => number;

  constructor(opts: BackoffOptions = {}) {
    this.initialMs = Math.max(0, opts.initialMs ?? 1000);
    this.maxMs = Math.max(0, opts.maxMs ?? 30_000);
    this.#random = opts.random ?? Math.random;
  }

  /** The largest wait before retry `attempt` (from 0) given `baseMs`: `min(maxMs, baseMs × 2^attempt)`. */
  ceiling(baseMs: number, attempt: number): number {
    const factor = 2 ** Math.min(Math.max(0, Math.floor(attempt)), 30);
    return Math.min(this.maxMs, Math.max(0, baseMs) * factor);
  }

  /** A random wait in `[0, ceiling(baseMs, attempt)]`, in whole milliseconds. */
  delay(baseMs: number, attempt: number): number {
    const c = Math.floor(this.ceiling(baseMs, attempt));
    return Math.min(c, Math.floor(this.#random() * (c + 1)));
  }
}

/**
 * Tracks consecutive failures of one reconnecting stream and decides each wait.
 * @internal
 */
export class Retrier {
  /** The server's last `retry:` in ms, or the backoff's initial base. */
  baseMs: number;
  /** Consecutive failures; reset when a connection proves itself (its preamble or a message). */
  attempt = 0;
  /**
   * Whether a 401 was already answered by fetching a fresh token and retrying at once (done
   * once until a connection proves itself: a token source that keeps failing then waits the
   * backoff like any failure, or ends the subscription).
   */
  authRetried = false;
  #quickClose = false;
  readonly #backoff: Backoff;

  constructor(backoff: Backoff) {
    this.#backoff = backoff;
    this.baseMs = backoff.initialMs;
  }

  /** A connection proved itself (its preamble or a message): failures count from zero again. */
  proven(): void {
    this.attempt = 0;
    this.authRetried = false;
  }

  /** The wait after a failure; `retryAfterMs` (the server's `Retry-After`) is a floor. */
  failed(retryAfterMs?: number): number {
    const d = this.#backoff.delay(this.baseMs, this.attempt);
    this.attempt++;
    this.#quickClose = false;
    return Math.max(d, retryAfterMs ?? 0);
  }

  /** The wait after a clean close of a stream opened at `openedAt` (ms since epoch). */
  closed(openedAt: number, now: number = Date.now()): number {
    const quick = now - openedAt < 1000;
    let d = 0;
    if (quick && this.#quickClose) {
      d = this.#backoff.delay(this.baseMs, this.attempt);
      this.attempt++;
    }
    this.#quickClose = quick;
    return d;
  }
}
