/**
 * Shared plumbing: token handling, abortable waits, URL building. Not part of the public API.
 *
 * @module
 * @internal
 */

import type { Since } from "./types.js";

export type { Since };

/**
 * The `since` value as sent (`live`, `earliest`, `last:N`, `time:UNIX_MS`); a `Date` or a
 * number of milliseconds is rounded down to a whole millisecond.
 * @internal
 */
export function sinceParam(since: Since): string {
  if (typeof since === "string") return since;
  if ("last" in since) return `last:${since.last}`;
  const ms = since.time instanceof Date ? since.time.getTime() : since.time;
  return `time:${Math.floor(ms)}`;
}

/**
 * Supplies the bearer token of each request and (re)connect.
 * @internal
 */
export class Auth {
  readonly #token: string | undefined;
  readonly #getToken: (() => string | Promise<string>) | undefined;
  #cached: string | undefined;

  constructor(token: string | undefined, getToken: (() => string | Promise<string>) | undefined) {
    this.#token = token;
    this.#getToken = getToken;
  }

  /** Whether a fresh token can be asked for (a `getToken` was given). */
  get canRefresh(): boolean {
    return this.#getToken !== undefined;
  }

  /** Whether any token is in use (then a native EventSource needs it in the query). */
  get inUse(): boolean {
    return this.#token !== undefined || this.#getToken !== undefined;
  }

  /** The token for a plain request: the last one fetched, else `token`, else a fetched one. */
  async current(): Promise<string | undefined> {
    if (this.#cached !== undefined) return this.#cached;
    if (this.#getToken) return this.fresh();
    return this.#token;
  }

  /** A fresh token from `getToken` (preferred), else the fixed `token`. */
  async fresh(): Promise<string | undefined> {
    if (!this.#getToken) return this.#token;
    const t = await this.#getToken();
    this.#cached = t;
    return t;
  }
}

/**
 * Waits `ms` milliseconds; resolves `false` early when `signal` aborts, `true` otherwise.
 * @internal
 */
export function sleep(ms: number, signal?: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(false);
    if (ms <= 0) return resolve(true);
    const onAbort = () => {
      clearTimeout(t);
      resolve(false);
    };
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve(true);
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Percent-encodes one path segment. @internal */
export function segment(s: string): string {
  return encodeURIComponent(s);
}

/** Appends query pairs to a URL. @internal */
export function withQuery(url: string, pairs: [string, string][]): string {
  if (pairs.length === 0) return url;
  const q = pairs.map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join("&");
  return url + (url.includes("?") ? "&" : "?") + q;
}

/** A promise and its resolvers. @internal */
export interface Deferred<T> {
  promise: Promise<T>;
  resolve: (v: T) => void;
  reject: (e: unknown) => void;
}

/** @internal */
export function deferred<T>(): Deferred<T> {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}
