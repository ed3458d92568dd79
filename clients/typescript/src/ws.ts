/**
 * One WebSocket (subprotocol `gapless.v1`) as a queue of messages, and the meaning of the
 * server's close codes. Works with the platform's `WebSocket` (browsers, Node 22+, Deno) or a
 * compatible constructor (the `ws` package on Node 20).
 *
 * @module
 * @internal
 */

import { GaplessError } from "./errors.js";
import { withQuery } from "./internal.js";
import type { Core } from "./core.js";

/** What a socket yields. @internal */
export type WsItem =
  | { t: "message"; msg: Record<string, unknown> }
  | { t: "closed"; code: number; reason: string };

/** The subprotocol of every gapless socket. */
export const SUBPROTOCOL = "gapless.v1";

/** The `ws:`/`wss:` URL of `path` on the client's server, with the token in `access_token`. @internal */
export function wsUrl(core: Core, path: string, query: [string, string][], token: string | undefined): string {
  const base = core.base.replace(/^http(s?):/i, "ws$1:");
  const q = token === undefined ? query : [...query, ["access_token", token] as [string, string]];
  return withQuery(base + path, q);
}

/** An open socket and the messages it brought, in order. @internal */
export class WsConn {
  readonly #ws: WebSocket;
  readonly #queue: WsItem[] = [];
  #wake: (() => void) | undefined;
  #closed = false;
  readonly #maxBytes: number;

  private constructor(ws: WebSocket, maxBytes: number) {
    this.#ws = ws;
    this.#maxBytes = maxBytes;
  }

  /**
   * Opens a socket and waits until it is open.
   * @throws {GaplessError} `invalid_argument` when no WebSocket constructor is available;
   * `network` when the socket failed or closed before opening (with its close code).
   */
  static async open(core: Core, url: string, signal: AbortSignal): Promise<WsConn> {
    const Ctor = core.WebSocket ?? (globalThis as { WebSocket?: typeof WebSocket }).WebSocket;
    if (!Ctor) {
      throw new GaplessError({
        code: "invalid_argument",
        message:
          "this platform has no WebSocket: pass one as the client's `WebSocket` option (on Node 20: `import { WebSocket } from 'ws'`)",
      });
    }
    const ws = new Ctor(url, SUBPROTOCOL);
    const conn = new WsConn(ws, core.maxEventBytes);
    const opened = await new Promise<boolean>((resolve) => {
      const onAbort = () => resolve(false);
      signal.addEventListener("abort", onAbort, { once: true });
      ws.addEventListener("open", () => {
        signal.removeEventListener("abort", onAbort);
        resolve(true);
      });
      ws.addEventListener("close", () => {
        signal.removeEventListener("abort", onAbort);
        resolve(false);
      });
      // A failed connection also fires `close` (1006), which is what is acted on; listening
      // here matters on Node's `ws` package, where an unheard `error` is thrown.
      ws.addEventListener("error", () => {});
      ws.addEventListener("message", (ev: MessageEvent) => conn.#onMessage(ev));
      ws.addEventListener("close", (ev: CloseEvent) => conn.#push({ t: "closed", code: ev.code, reason: ev.reason }));
    });
    if (signal.aborted) {
      conn.close();
      throw new DOMException("closed", "AbortError");
    }
    if (!opened) {
      const first = conn.#queue.find((i) => i.t === "closed");
      const code = first?.t === "closed" ? first.code : 1006;
      const reason = first?.t === "closed" ? first.reason : "";
      const refusal = closeError(code, reason, undefined);
      if (refusal && code !== 1006) throw refusal;
      throw new GaplessError({
        code: "network",
        message: `WebSocket ${url.replace(/access_token=[^&]*/, "access_token=…")} failed to open (close ${code}${reason ? `: ${reason}` : ""})`,
      });
    }
    return conn;
  }

  /** Sends one JSON message (dropped if the socket is no longer open). */
  send(msg: unknown): void {
    if (this.#ws.readyState === 1) this.#ws.send(JSON.stringify(msg));
  }

  /** The next message or the close; rejects with an `AbortError` when `signal` aborts. */
  async next(signal: AbortSignal): Promise<WsItem> {
    for (;;) {
      const item = this.#queue.shift();
      if (item !== undefined) return item;
      if (signal.aborted) throw new DOMException("closed", "AbortError");
      await new Promise<void>((resolve) => {
        const onAbort = () => resolve();
        signal.addEventListener("abort", onAbort, { once: true });
        this.#wake = () => {
          signal.removeEventListener("abort", onAbort);
          resolve();
        };
      });
      this.#wake = undefined;
    }
  }

  /** Closes the socket (1000) at once. */
  close(): void {
    this.#closed = true;
    try {
      if (this.#ws.readyState <= 1) this.#ws.close(1000);
    } catch {
      /* already closing */
    }
  }

  #push(item: WsItem): void {
    this.#queue.push(item);
    const w = this.#wake;
    this.#wake = undefined;
    w?.();
  }

  #onMessage(ev: MessageEvent): void {
    if (this.#closed) return;
    const data: unknown = ev.data;
    if (typeof data !== "string") {
      this.#push({ t: "closed", code: 1003, reason: "the server sent a binary message" });
      this.close();
      return;
    }
    if (data.length > this.#maxBytes) {
      this.#push({ t: "closed", code: 1009, reason: `a message larger than the client's limit of ${this.#maxBytes} bytes` });
      this.close();
      return;
    }
    try {
      const msg = JSON.parse(data) as unknown;
      if (msg !== null && typeof msg === "object" && !Array.isArray(msg)) {
        this.#push({ t: "message", msg: msg as Record<string, unknown> });
      }
    } catch {
      this.#push({ t: "closed", code: 1007, reason: "the server sent a message that is not JSON" });
      this.close();
    }
  }
}

/**
 * The error a close code means, or `undefined` for a clean close (1000 normal, 1001 going away).
 * `refusal` is the `{"op":"error"}` message that came just before, if any.
 *
 * - 4401: the token was refused or expired (`unauthorized`, or `token_expired` when the reason
 *   says so); 4403: `forbidden`;
 * - 4400, 4404, 4409, 4410: session refusals (`resume_disabled`; `session_not_found` or
 *   `session_ended`, told apart by the `error` message's code; `session_attached`;
 *   `session_not_retained`): terminal. 4412, which earlier servers sent for `session_ended`,
 *   is retired; it is still read as terminal `session_ended`;
 * - 4408: no answer to the server's pings: not terminal (reconnect);
 * - 4422, 1002, 1003, 1007, 1009: the client broke the protocol: terminal `protocol`;
 * - anything else (1006 when the connection simply broke): `disconnected`, not terminal.
 * @internal
 */
export function closeError(
  code: number,
  reason: string,
  refusal: { code: string; message: string } | undefined,
): GaplessError | undefined {
  const said = reason ? `: ${reason}` : "";
  switch (code) {
    case 1000:
    case 1001:
      return undefined;
    case 4401: {
      const expired = /expired/i.test(reason) || refusal?.code === "token_expired";
      return new GaplessError({
        code: expired ? "token_expired" : (refusal?.code ?? "unauthorized"),
        message: refusal?.message ?? (reason || "the server refused the token"),
        status: 401,
        closeCode: code,
      });
    }
    case 4403:
      return new GaplessError({
        code: refusal?.code ?? "forbidden",
        message: refusal?.message ?? (reason || "the token does not allow this"),
        status: 403,
        closeCode: code,
      });
    case 4400:
    case 4404:
    case 4409:
    case 4410:
    case 4412 /* retired: earlier servers' `session_ended` */: {
      const fallback = {
        4400: "resume_disabled",
        4404: "session_not_found",
        4409: "session_attached",
        4410: "session_not_retained",
        4412: "session_ended",
      }[code];
      return new GaplessError({
        code: refusal?.code ?? fallback,
        message: refusal?.message ?? (reason || `the server closed the WebSocket with ${code}`),
        closeCode: code,
      });
    }
    case 4408:
      return new GaplessError({
        code: "disconnected",
        message: `the server closed the WebSocket with 4408 (no answer to its pings)${said}`,
        closeCode: code,
      });
    case 4422:
    case 1002:
    case 1003:
    case 1007:
    case 1009:
      return new GaplessError({
        code: "protocol",
        message: `the WebSocket closed with ${code}${said} (a client or server bug)`,
        closeCode: code,
      });
    default:
      return new GaplessError({
        code: "disconnected",
        message: `the WebSocket closed with ${code}${said}`,
        closeCode: code,
      });
  }
}
