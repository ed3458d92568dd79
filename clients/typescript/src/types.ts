/**
 * The shapes the SDK hands out and takes in. Field names follow the wire protocol's terms
 * (channel, seq, cursor, gap, session); times are Unix milliseconds.
 *
 * @module
 */

/**
 * Why a range was not delivered (a gap notice's `reason`):
 * - `evicted`: retention removed events after the position;
 * - `epoch`: the position belongs to another incarnation of the journal (e.g. a `--memory`
 *   server restarted): history was really lost;
 * - `ahead`: the position is beyond the head (e.g. after a restored backup): re-anchor;
 * - `unknown`: a cursor this server cannot read: re-anchor.
 *
 * Unknown reasons from a newer server are passed on as they are.
 */
export type GapReason = "evicted" | "epoch" | "ahead" | "unknown" | (string & {});

/**
 * Where a subscription (or a history read) starts when it has no cursor:
 * - `"live"`: only events published from now on (a subscription's default);
 * - `"earliest"`: every retained event, then live (history's default);
 * - `"last:N"` or `{ last: N }`: the last N retained events (1 to 1000; fewer when fewer are
 *   retained), then live;
 * - `"time:UNIX_MS"` or `{ time: Date | UNIX_MS }`: from the first retained event whose `time`
 *   is at or after it, then live (live only when none is). When an event no longer retained
 *   may be at or after it, the start is the floor, after a gap of reason `evicted` (on a
 *   history page: its `gap`).
 *
 * A value the server refuses (`last:0`, `last:1001`, a time before 1970...) ends the
 * subscription with a terminal `invalid_request` {@link GaplessError}. A subscription applies
 * its start on its first connection only: after a drop it resumes from its cursor.
 */
export type Since =
  | "live"
  | "earliest"
  | `last:${number}`
  | `time:${number}`
  | { last: number }
  | { time: Date | number };

/** A journaled event delivered to the caller. */
export interface EventUpdate {
  /** Discriminant. */
  kind: "event";
  /** The event's channel. */
  channel: string;
  /** The event's position in its channel: dense, from 1. */
  seq: number;
  /**
   * The position just after this event, to resume from. Over SSE it is the subscription's
   * cursor (covering every channel of a multi-channel stream); over WebSocket and in history
   * it is the channel's cursor. Opaque: relay it, never parse it.
   */
  cursor: string;
  /** The event's type, or `null` when it has none. */
  type: string | null;
  /**
   * The event's data: the text as published, or for a binary event (published as bytes:
   * `application/octet-stream`, or `"encoding": "base64"`) its bytes, decoded from the wire's
   * base64. Tell them apart with `typeof data === "string"`.
   */
  data: string | Uint8Array;
  /** Commit time, Unix milliseconds. */
  time: number;
}

/** An ephemeral event: live only, no seq, never replayed; it does not move the cursor. */
export interface EphemeralUpdate {
  /** Discriminant. */
  kind: "ephemeral";
  /** The event's channel. */
  channel: string;
  /** Always absent: ephemeral events have no position. */
  seq?: undefined;
  /** The subscription's position, unchanged by this update (`null` before any is known). */
  cursor: string | null;
  /** The event's type, or `null`. */
  type: string | null;
  /** The event's data: text, or the bytes of a binary event (as {@link EventUpdate.data}). */
  data: string | Uint8Array;
  /** Time the server handled it, Unix milliseconds. */
  time: number;
}

/**
 * A gap notice: the range after `after` (exclusive) up to `next` was not delivered and will
 * not be. Refetch the state the app derives from the channel (e.g. a fresh `history` or a new
 * `join`), then carry on: delivery continues after `next`.
 */
export interface GapUpdate {
  /** Discriminant. */
  kind: "gap";
  /** The channel that has the hole. */
  channel: string;
  /** Always absent. */
  seq?: undefined;
  /** The position after the notice, to resume from (the subscription's position when known, else `next`). */
  cursor: string;
  /** Always `"gap"`. */
  type: "gap";
  /** The notice as JSON text, as the server sent it. */
  data: string;
  /** The last position delivered before the hole (exclusive); `null` when unknown. */
  after: string | null;
  /** Where delivery continues: the channel's cursor at the end of the hole. */
  next: string;
  /** Why the range was missed. */
  reason: GapReason;
}

/**
 * A member joined or left a channel (only for a subscription with `presence: true`): not an
 * event, no seq, never replayed; it does not move the cursor (docs/api.md, "Presence").
 */
export interface PresenceUpdate {
  /** Discriminant. */
  kind: "presence";
  /** The channel. */
  channel: string;
  /** Always absent: presence notices have no position. */
  seq?: undefined;
  /** The subscription's position, unchanged by this update (`null` before any is known). */
  cursor: string | null;
  /** `"join"`: the member's first connection to the channel started; `"leave"`: its last one has been gone `presence_linger_ms`. */
  action: "join" | "leave";
  /** The member: a token's `sub`, or on a server without keys a subscriber's `clientId`. */
  id: string;
  /** Always `"gapless.presence"` (the SSE event type of the notice). */
  type: "gapless.presence";
  /** The notice as JSON text, `{"action","channel","id"}`. */
  data: string;
}

/** What a subscription or join yields. */
export type Update = EventUpdate | EphemeralUpdate | GapUpdate | PresenceUpdate;

/** One member of a channel, in {@link ChannelPresence}. */
export interface PresenceMember {
  /** The member: a token's `sub`, or a `clientId`. */
  id: string;
  /** Its connections to the channel now; 0 while its last one is gone for less than `presence_linger_ms`. */
  connections: number;
  /** When it joined, Unix milliseconds. */
  since: number;
}

/** Who follows a channel (`GET /v1/channels/{channel}/presence`). */
export interface ChannelPresence {
  /** The channel. */
  channel: string;
  /** Connections to the channel now (SSE streams and WebSocket subscriptions), members' or not. */
  occupancy: number;
  /** Its members, sorted by id. */
  members: PresenceMember[];
}

/** An event as history returns it. */
export interface HistoryEvent {
  /** The channel. */
  channel: string;
  /** Position in the channel. */
  seq: number;
  /** The channel's cursor after this event. */
  cursor: string;
  /** Type, or `null`. */
  type: string | null;
  /** Data: text, or the bytes of a binary event (as {@link EventUpdate.data}). */
  data: string | Uint8Array;
  /** Commit time, Unix milliseconds. */
  time: number;
}

/** One page of history (`GET /v1/channels/{channel}/events`). */
export interface HistoryPage {
  /** The channel. */
  channel: string;
  /** The journal's incarnation, 16 hex digits. */
  epoch: string;
  /** Oldest retained seq. */
  floor: number;
  /** Newest seq when the page was read (0 when never published to). */
  head: number;
  /** The events of this page, in seq order (at most `limit`). */
  events: HistoryEvent[];
  /** The cursor to pass as `after` for the next page; on the `done` page, the tip. */
  next: string;
  /** Whether this page reached the head. */
  done: boolean;
  /**
   * Only on a page read with `since: "time:…"` that starts at the floor because an event no
   * longer retained may be at or after that time: the evicted seqs (`after` at seq 0, `next`
   * at the floor - 1, reason `evicted`).
   */
  gap?: { channel: string; after: string | null; next: string; reason: GapReason };
}

/** Answer to a durable publish. */
export interface Published {
  /** The channel. */
  channel: string;
  /** The event's seq. */
  seq: number;
  /** The channel's cursor after the event. */
  cursor: string;
  /** True when an `idempotencyKey` matched an earlier publish (HTTP 200): nothing was appended. */
  duplicate: boolean;
}

/** Answer to an ephemeral publish (the server's `EphemeralDelivered`). */
export interface EphemeralDelivered {
  /** The channel. */
  channel: string;
  /** How many subscribers it was handed to. */
  subscribers: number;
}

/** One event of a batch answer (the server's `BatchItem`). */
export interface BatchItem {
  /** The event's seq. */
  seq: number;
  /** The channel's cursor after the event. */
  cursor: string;
}

/** Answer to a batch publish (the server's `BatchPublished`). */
export interface BatchPublished {
  /** The channel. */
  channel: string;
  /** Seq of the first event. */
  firstSeq: number;
  /** Seq of the last event. */
  lastSeq: number;
  /** The channel's cursor after the last event. */
  cursor: string;
  /** Each event's seq and cursor, in order. */
  events: BatchItem[];
  /** True for an idempotent retry (HTTP 200): nothing was appended. */
  duplicate: boolean;
}

/** A channel's state (`GET /v1/channels/{channel}`). */
export interface ChannelInfo {
  /** The channel. */
  channel: string;
  /** Journal incarnation, 16 hex digits. */
  epoch: string;
  /** Oldest retained seq (1 for a channel never published to). */
  floor: number;
  /** Newest seq (0 for a channel never published to). */
  head: number;
  /** Current subscribers. */
  subscribers: number;
  /**
   * The channel's namespace: its name up to the first `:`, `"default"` for a name without one
   * (the server's docs/api.md, "Namespaces"); `""` from a server before namespaces.
   */
  namespace: string;
  /** The retention that applies to the channel (its namespace's); see {@link RetentionLimits}. */
  retention: RetentionLimits;
}

/**
 * A channel's retention: every limit applies, whichever evicts more wins; 0 is no limit of that
 * kind (all 0 from a server before namespaces).
 */
export interface RetentionLimits {
  /** Most events kept (`retention_events`). */
  events: number;
  /** Age in milliseconds after which events are evicted (`retention_ms`). */
  ms: number;
  /** Most bytes of event data kept (`retention_bytes`); the newest event is always kept. */
  bytes: number;
}

/** A session's state. */
export interface SessionInfo {
  /** The session id. */
  id: string;
  /** `open`, `completed` or `cancelled`. */
  status: "open" | "completed" | "cancelled" | (string & {});
  /** Newest seq (seq 1 is the opening marker). */
  head: number;
  /** Whether a consumer was attached when the server answered. */
  attached: boolean;
}

/** Answer to a session append. */
export interface SessionAppended {
  /** The session id. */
  id: string;
  /** The event's seq. */
  seq: number;
  /** Whether a consumer was attached. */
  attached: boolean;
  /** True for an idempotent retry (HTTP 200). */
  duplicate: boolean;
}

/** What a session consumer yields. */
export type SessionUpdate =
  | {
      /** A session event. */
      kind: "event";
      /** The session id. */
      session: string;
      /** Its seq (from 2: seq 1 is the opening marker). */
      seq: number;
      /** Type, or `null`. */
      type: string | null;
      /** Data: text, or the bytes of a binary event (as {@link EventUpdate.data}). */
      data: string | Uint8Array;
      /** Commit time, Unix milliseconds. */
      time: number;
    }
  | {
      /**
       * The attach is done: after the replay of an attach with `lastSeq`, or at once for a
       * live attach (0 replayed). Live events follow: those with seq greater than `head`.
       */
      kind: "resumed";
      /** How many events the replay held. */
      replayedEvents: number;
      /** The seq after which live delivery continues (`undefined` from servers before it was sent). */
      head?: number;
    }
  | {
      /** The session completed; the consumer then ends. */
      kind: "completed";
      /** Seq of the end marker. */
      seq: number;
    }
  | {
      /** The session was cancelled; the consumer then ends. */
      kind: "cancelled";
      /** Seq of the end marker. */
      seq: number;
    };

/**
 * Where cursors are persisted: any object with `get` and `set` (sync or async). The SDK
 * writes a position each time it hands an update to the caller, so after a reload a new
 * subscription resumes right after the last update the app saw. See {@link localStorageStore}.
 */
export interface CursorStore {
  /** The stored cursor under `key`, or `null`/`undefined` when none. */
  get(key: string): string | null | undefined | Promise<string | null | undefined>;
  /** Stores `cursor` under `key`. */
  set(key: string, cursor: string): void | Promise<void>;
}

/** A WebSocket constructor: the platform's `WebSocket`, or e.g. the `ws` package's on Node 20. */
export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocket;
