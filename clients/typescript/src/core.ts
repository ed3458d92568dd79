/**
 * The client's shared settings and its one HTTP request helper (auth, errors).
 *
 * @module
 * @internal
 */

import type { BackoffOptions } from "./backoff.js";
import { GaplessError, errorFromResponse, networkError } from "./errors.js";
import { Auth, withQuery } from "./internal.js";
import type { CursorStore, WebSocketConstructor } from "./types.js";

/** A constructor of `EventSource`s (the platform's, or a polyfill). */
export type EventSourceConstructor = new (url: string, init?: { withCredentials?: boolean }) => EventSource;

/** Settings every part of a client shares. @internal */
export interface Core {
  /** Base URL without a trailing slash, e.g. `http://127.0.0.1:8080`. */
  base: string;
  auth: Auth;
  fetch: typeof fetch;
  WebSocket: WebSocketConstructor | undefined;
  EventSource: EventSourceConstructor | undefined;
  withCredentials: boolean;
  headers: Record<string, string>;
  store: CursorStore | undefined;
  backoff: BackoffOptions;
  idleTimeoutMs: number;
  maxEventBytes: number;
}

/** A request's parts. @internal */
export interface RequestInit2 {
  method: "GET" | "POST" | "DELETE";
  path: string;
  query?: [string, string][];
  body?: string;
  headers?: Record<string, string>;
  signal?: AbortSignal;
}

/**
 * Sends one request with the client's token and returns the 2xx response. A 401 when a
 * `getToken` exists asks it for a fresh token and tries once more.
 * @throws {GaplessError} the server's refusal, or `network` when there was no answer.
 * @internal
 */
export async function request(core: Core, r: RequestInit2): Promise<Response> {
  const url = withQuery(core.base + r.path, r.query ?? []);
  const what = `${r.method} ${url}`;
  let token = await core.auth.current();
  for (let attempt = 0; ; attempt++) {
    const headers: Record<string, string> = { ...core.headers, ...r.headers };
    if (token !== undefined) headers["authorization"] = `Bearer ${token}`;
    let res: Response;
    try {
      const init: RequestInit = {
        method: r.method,
        headers,
        credentials: core.withCredentials ? "include" : "same-origin",
        cache: "no-store",
      };
      if (r.body !== undefined) init.body = r.body;
      if (r.signal !== undefined) init.signal = r.signal;
      res = await core.fetch(url, init);
    } catch (e) {
      if (r.signal?.aborted) throw e;
      throw networkError(what, e);
    }
    if (res.status >= 200 && res.status < 300) return res;
    if (res.status === 401 && attempt === 0 && core.auth.canRefresh) {
      await res.body?.cancel().catch(() => {});
      token = await core.auth.fresh();
      continue;
    }
    throw await errorFromResponse(res, what);
  }
}

/** Sends a request and parses its JSON answer. @internal */
export async function requestJson<T>(core: Core, r: RequestInit2): Promise<{ status: number; body: T }> {
  const res = await request(core, r);
  const text = await res.text();
  try {
    return { status: res.status, body: JSON.parse(text) as T };
  } catch {
    throw new GaplessError({
      code: "protocol",
      message: `${r.method} ${r.path}: the answer is not JSON: ${text.slice(0, 200)}`,
      status: res.status,
    });
  }
}
