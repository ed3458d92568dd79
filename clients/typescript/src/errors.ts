/**
 * Typed errors: every failure the SDK reports is a {@link GaplessError}, never a bare string.
 *
 * A refusal by the server keeps the server's JSON (`{"error": CODE, "message": TEXT, ...}`):
 * `code` is its `error`, `status` its HTTP status, `message` its `message`, and `body` the
 * whole object (e.g. `reason` and `floor_cursor` of a 410 `cursor_not_served`). Failures that
 * never reached an answer carry a client-side code ({@link ClientErrorCode}) and status 0.
 *
 * @module
 */

/** Error codes the server sends (HTTP `error` field, WebSocket `op: "error"` `code`). */
export type ServerErrorCode =
  | "invalid_channel"
  | "invalid_type"
  | "invalid_utf8"
  | "invalid_cursor"
  | "invalid_request"
  | "not_found"
  | "method_not_allowed"
  | "cursor_not_served"
  | "too_large"
  | "limit_reached"
  | "shutting_down"
  | "journal_failed"
  | "invalid_message"
  | "not_subscribed"
  | "session_not_found"
  | "session_exists"
  | "session_ended"
  | "session_attached"
  | "session_not_retained"
  | "resume_disabled"
  | "unauthorized"
  | "forbidden"
  | "rate_limited"
  | "presence_disabled";

/**
 * Codes the SDK itself uses, for failures that are not a server's JSON answer:
 * - `network`: the server could not be reached, or the connection broke (status 0);
 * - `disconnected`: a stream or socket ended where it should not have;
 * - `protocol`: the server sent something that is not gapless protocol (a bug or a proxy);
 * - `event_too_large`: one SSE event block or WebSocket message exceeded the client's limit;
 * - `token_expired`: the server ended a stream because its token expired and the client
 *   has no `getToken` to fetch a new one (status 401);
 * - `invalid_argument`: the call itself is wrong (e.g. no channel).
 * - `http_error`: a non-2xx answer without a gapless JSON body (e.g. from a proxy).
 */
export type ClientErrorCode =
  | "network"
  | "disconnected"
  | "protocol"
  | "event_too_large"
  | "token_expired"
  | "invalid_argument"
  | "http_error";

/** Any error code; unknown server codes are kept as they are (the protocol may add some). */
export type ErrorCode = ServerErrorCode | ClientErrorCode | (string & {});

/** The HTTP status the server uses for a code that may arrive without one (WebSocket). */
const STATUS_OF: Record<string, number> = {
  invalid_channel: 400,
  invalid_type: 400,
  invalid_utf8: 400,
  invalid_cursor: 400,
  invalid_request: 400,
  invalid_message: 400,
  not_subscribed: 400,
  resume_disabled: 400,
  unauthorized: 401,
  token_expired: 401,
  forbidden: 403,
  not_found: 404,
  session_not_found: 404,
  session_exists: 409,
  session_ended: 409,
  session_attached: 409,
  cursor_not_served: 410,
  session_not_retained: 410,
  too_large: 413,
  rate_limited: 429,
  journal_failed: 500,
  limit_reached: 503,
  shutting_down: 503,
};

/** What a {@link GaplessError} is built from. */
export interface GaplessErrorInit {
  /** The error code (server's `error`, or a {@link ClientErrorCode}). */
  code: ErrorCode;
  /** Human-readable text (the server's `message`). */
  message: string;
  /** HTTP status; 0 when there was no HTTP answer. Defaults from `code`. */
  status?: number;
  /** The WebSocket close code that carried the refusal (4400, 4401, 4403, 4404, 4409, 4410, 4422...). */
  closeCode?: number;
  /** The server's `Retry-After`, in milliseconds. */
  retryAfterMs?: number;
  /** The server's whole JSON error object, when there was one. */
  body?: Record<string, unknown>;
  /** The underlying error (e.g. the `TypeError` of a failed `fetch`). */
  cause?: unknown;
}

/**
 * The one error type of the SDK.
 *
 * @example
 * ```ts
 * try { await client.publish("news", "hi"); }
 * catch (e) { if (e instanceof GaplessError && e.code === "too_large") shrink(); else throw e; }
 * ```
 */
export class GaplessError extends Error {
  /** The error code: the server's `error` string, or a {@link ClientErrorCode}. */
  readonly code: ErrorCode;
  /** The HTTP status (or the status the server uses for this code over WebSocket); 0 when none. */
  readonly status: number;
  /** The WebSocket close code that carried the refusal, if any. */
  readonly closeCode: number | undefined;
  /** The server's `Retry-After` in milliseconds (429 `rate_limited`, 503 `limit_reached`), if sent. */
  readonly retryAfterMs: number | undefined;
  /** The server's whole JSON error object (e.g. `reason`, `floor_cursor`, `limit`), if any. */
  readonly body: Record<string, unknown> | undefined;

  constructor(init: GaplessErrorInit) {
    super(init.message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = "GaplessError";
    this.code = init.code;
    this.status = init.status ?? STATUS_OF[init.code] ?? 0;
    this.closeCode = init.closeCode;
    this.retryAfterMs = init.retryAfterMs;
    this.body = init.body;
  }

  /**
   * True for failures a retry cannot change: a 4xx status other than 408 and 429, a
   * protocol violation, an oversized event or an invalid argument. Network failures,
   * disconnections, 408, 429 and 5xx are not terminal (subscriptions retry them).
   */
  get terminal(): boolean {
    switch (this.code) {
      case "network":
      case "disconnected":
        return false;
      case "protocol":
      case "event_too_large":
      case "invalid_argument":
        return true;
      default:
        return this.status >= 400 && this.status < 500 && this.status !== 408 && this.status !== 429;
    }
  }

  /** For 410 `cursor_not_served`: the `reason` (`evicted`, `epoch`, `ahead`, `unknown`). */
  get reason(): string | undefined {
    const r = this.body?.["reason"];
    return typeof r === "string" ? r : undefined;
  }
}

/** Parses a `Retry-After` header (seconds, or an HTTP date) into milliseconds. */
export function parseRetryAfter(value: string | null): number | undefined {
  if (value === null || value.trim() === "") return undefined;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v) * 1000;
  const t = Date.parse(v);
  return Number.isNaN(t) ? undefined : Math.max(0, t - Date.now());
}

/**
 * Builds the error of a non-2xx HTTP answer from its JSON body (or its text when it is not
 * gapless JSON).
 */
export async function errorFromResponse(res: Response, what: string): Promise<GaplessError> {
  let text = "";
  try {
    text = await res.text();
  } catch {
    /* the body could not be read: the status still says enough */
  }
  const retryAfterMs = parseRetryAfter(res.headers.get("retry-after"));
  let body: Record<string, unknown> | undefined;
  try {
    const parsed: unknown = JSON.parse(text);
    if (parsed !== null && typeof parsed === "object" && !Array.isArray(parsed)) {
      body = parsed as Record<string, unknown>;
    }
  } catch {
    /* not JSON */
  }
  const code = typeof body?.["error"] === "string" ? (body["error"] as string) : "http_error";
  const message =
    typeof body?.["message"] === "string"
      ? (body["message"] as string)
      : `${what}: HTTP ${res.status}${text ? `: ${text.slice(0, 200)}` : ""}`;
  return new GaplessError({ code, message, status: res.status, retryAfterMs, body });
}

/** The error of a `fetch` that never got an answer. */
export function networkError(what: string, cause: unknown): GaplessError {
  const detail = cause instanceof Error ? cause.message : String(cause);
  return new GaplessError({ code: "network", message: `${what}: ${detail}`, status: 0, cause });
}

/** Whether `e` is the rejection of an aborted operation (our own `close()`). */
export function isAbort(e: unknown): boolean {
  return (
    e !== null &&
    typeof e === "object" &&
    "name" in e &&
    (e as { name: unknown }).name === "AbortError"
  );
}
