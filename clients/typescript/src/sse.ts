/**
 * A standalone, incremental Server-Sent Events parser, spec-exact: the event-stream
 * interpretation of the WHATWG HTML standard ("Interpreting an event stream") over bytes that
 * arrive in chunks of any size. It behaves as the Rust SDK's parser (`crates/client/src/sse.rs`):
 *
 * - lines end with LF, CR or CRLF, including a CRLF split across two chunks;
 * - one leading U+FEFF BOM is stripped (even when split across chunks), a second is content;
 * - a line starting with `:` is a comment; a line without `:` is a field with an empty value;
 *   one space after the colon is removed;
 * - `data` values are joined with LF; `id` is ignored when its value contains NUL; `retry`
 *   only when its value is ASCII digits;
 * - a blank line dispatches: the last event ID takes the buffer's value, and an event fires
 *   only when the data buffer is not empty (an `id:`-only block reports the new ID instead);
 * - a block not ended by a blank line when the stream ends is never dispatched ({@link SseParser.finish});
 * - bytes decode as UTF-8 with U+FFFD for invalid sequences; a code point split across
 *   chunks decodes correctly (lines are decoded whole).
 *
 * Beyond the standard, one event block may hold at most `maxEventBytes` bytes (line ends
 * excluded), so a hostile stream cannot grow memory without bound.
 *
 * @module
 */

import { GaplessError } from "./errors.js";

/** Default limit of one event block: 16 MiB, far above the server's default 1 MiB events. */
export const DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024;

/** What a chunk of the stream produced, in stream order. */
export type SseItem =
  | {
      /** An event fired. */
      kind: "event";
      /** The last `event` field's value, or `"message"` when none (or empty). */
      type: string;
      /** The `data` lines joined with LF. */
      data: string;
      /** The last event ID after this dispatch (set by this block or carried over). */
      lastEventId: string;
    }
  | {
      /** A block without data ended and changed the last event ID to `lastEventId`. */
      kind: "id";
      /** The new last event ID. */
      lastEventId: string;
    }
  | {
      /** A valid `retry` field set the reconnection time. */
      kind: "retry";
      /** The reconnection time, in milliseconds. */
      ms: number;
    };

const LF = 0x0a;
const CR = 0x0d;
const BOM = [0xef, 0xbb, 0xbf];

/** An incremental SSE parser for one stream (see the module doc). */
export class SseParser {
  /** The event size limit, in bytes. */
  readonly maxEventBytes: number;
  #line: Uint8Array[] = [];
  #lineBytes = 0;
  #blockBytes = 0;
  #data = "";
  #hasData = false;
  #eventType = "";
  #idBuffer = "";
  #lastEventId = "";
  #retry: number | undefined;
  #afterCr = false;
  #bom = 0;
  #failed = false;
  readonly #decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

  /** @param maxEventBytes the largest event block accepted, in bytes (default 16 MiB). */
  constructor(maxEventBytes: number = DEFAULT_MAX_EVENT_BYTES) {
    this.maxEventBytes = maxEventBytes;
  }

  /** The last event ID string (empty before any block set one). */
  get lastEventId(): string {
    return this.#lastEventId;
  }

  /** The reconnection time of the last valid `retry` field, in milliseconds. */
  get retry(): number | undefined {
    return this.#retry;
  }

  /**
   * Parses the next chunk, calling `onItem` for every item it completes, in order.
   *
   * @throws {GaplessError} code `event_too_large` when a block exceeds the limit (items
   * completed before it were passed on); the parser then stays failed until {@link reset}.
   */
  feed(chunk: Uint8Array, onItem: (item: SseItem) => void): void {
    if (this.#failed) throw this.#tooLarge();
    let i = 0;
    const n = chunk.length;
    while (this.#bom < 3) {
      if (i >= n) return;
      if (chunk[i] === BOM[this.#bom]) {
        this.#bom++;
        i++;
      } else {
        // Not a BOM: what matched so far starts the first line.
        if (this.#bom > 0) this.#append(Uint8Array.from(BOM.slice(0, this.#bom)));
        this.#bom = 3;
      }
    }
    if (this.#afterCr) {
      if (i >= n) return;
      if (chunk[i] === LF) i++;
      this.#afterCr = false;
    }
    let start = i;
    for (; i < n; i++) {
      const b = chunk[i];
      if (b !== LF && b !== CR) continue;
      this.#append(chunk.subarray(start, i));
      this.#endLine(onItem);
      if (b === CR) {
        if (i + 1 >= n) {
          this.#afterCr = true;
          return;
        }
        if (chunk[i + 1] === LF) i++;
      }
      start = i + 1;
    }
    if (start < n) {
      if (this.#blockBytes + this.#lineBytes + (n - start) > this.maxEventBytes) throw this.#fail();
      // Copy: the caller may reuse its buffer.
      this.#append(chunk.slice(start, n));
    }
  }

  /**
   * The stream ended: a block not terminated by a blank line is discarded (it never fires and
   * its `id` never becomes the last event ID). The last event ID and retry time are kept.
   */
  finish(): void {
    this.#line = [];
    this.#lineBytes = 0;
    this.#blockBytes = 0;
    this.#data = "";
    this.#hasData = false;
    this.#eventType = "";
    this.#idBuffer = this.#lastEventId;
    this.#afterCr = false;
  }

  /**
   * Prepares for a new stream (a reconnection): discards any pending block, clears the failed
   * state and expects an optional BOM again. The new stream's ID buffer starts empty, as the
   * standard says; {@link lastEventId} keeps its value until the next dispatch.
   */
  reset(): void {
    this.finish();
    this.#idBuffer = "";
    this.#bom = 0;
    this.#failed = false;
  }

  #append(bytes: Uint8Array): void {
    if (bytes.length === 0) return;
    this.#line.push(bytes);
    this.#lineBytes += bytes.length;
  }

  #tooLarge(): GaplessError {
    return new GaplessError({
      code: "event_too_large",
      message: `an SSE event is larger than the client's limit of ${this.maxEventBytes} bytes`,
    });
  }

  #fail(): GaplessError {
    this.#failed = true;
    this.finish();
    return this.#tooLarge();
  }

  /** Takes the pending line's bytes as one array. */
  #takeLine(): Uint8Array {
    const parts = this.#line;
    const len = this.#lineBytes;
    this.#line = [];
    this.#lineBytes = 0;
    if (parts.length === 1) return parts[0]!;
    const out = new Uint8Array(len);
    let o = 0;
    for (const p of parts) {
      out.set(p, o);
      o += p.length;
    }
    return out;
  }

  #endLine(onItem: (item: SseItem) => void): void {
    const bytes = this.#takeLine();
    if (bytes.length === 0) {
      this.#dispatch(onItem);
      return;
    }
    this.#blockBytes += bytes.length;
    if (this.#blockBytes > this.maxEventBytes) throw this.#fail();
    if (bytes[0] === 0x3a /* : */) return;
    // ':' is ASCII and the UTF-8 decoder never swallows an ASCII byte into a replacement,
    // so splitting the decoded line at its first ':' is splitting the bytes there.
    const line = this.#decoder.decode(bytes);
    const c = line.indexOf(":");
    let name: string;
    let value: string;
    if (c < 0) {
      name = line;
      value = "";
    } else {
      name = line.slice(0, c);
      value = line.charCodeAt(c + 1) === 0x20 ? line.slice(c + 2) : line.slice(c + 1);
    }
    switch (name) {
      case "event":
        this.#eventType = value;
        break;
      case "data":
        this.#data += value + "\n";
        this.#hasData = true;
        break;
      case "id":
        if (!value.includes("\u0000")) this.#idBuffer = value;
        break;
      case "retry":
        if (/^[0-9]+$/.test(value)) {
          const ms = Number(value);
          this.#retry = Number.isSafeInteger(ms) ? ms : Number.MAX_SAFE_INTEGER;
          onItem({ kind: "retry", ms: this.#retry });
        }
        break;
      default:
        break;
    }
  }

  #dispatch(onItem: (item: SseItem) => void): void {
    this.#blockBytes = 0;
    const idChanged = this.#lastEventId !== this.#idBuffer;
    if (idChanged) this.#lastEventId = this.#idBuffer;
    if (!this.#hasData) {
      this.#eventType = "";
      if (idChanged) onItem({ kind: "id", lastEventId: this.#lastEventId });
      return;
    }
    const data = this.#data.endsWith("\n") ? this.#data.slice(0, -1) : this.#data;
    const type = this.#eventType === "" ? "message" : this.#eventType;
    this.#data = "";
    this.#hasData = false;
    this.#eventType = "";
    onItem({ kind: "event", type, data, lastEventId: this.#lastEventId });
  }
}

/** Parses a whole stream given as one chunk and returns its items (for tests and tools). */
export function parseAll(stream: Uint8Array | string, maxEventBytes = DEFAULT_MAX_EVENT_BYTES): SseItem[] {
  const p = new SseParser(maxEventBytes);
  const out: SseItem[] = [];
  const bytes = typeof stream === "string" ? new TextEncoder().encode(stream) : stream;
  p.feed(bytes, (item) => out.push(item));
  p.finish();
  return out;
}
