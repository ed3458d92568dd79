/**
 * `@gapless/client`: the TypeScript SDK of gapless, for browsers, Node 20+ and Deno.
 *
 * - {@link Client}: publish, history, {@link Client.subscribe | subscribe} (SSE or WebSocket,
 *   resuming from the last delivered cursor), {@link Client.join | join} (history then live,
 *   no gap, no duplicate), sessions.
 * - {@link fold}: a state view over a join.
 * - {@link localStorageStore}: cursors that survive a page reload.
 * - {@link GaplessError}: every failure, typed.
 * - {@link SseParser}: the spec-exact SSE parser the SDK uses over `fetch` streaming.
 *
 * @packageDocumentation
 */

export { Client } from "./client.js";
export type { ClientOptions, HistoryOptions, PublishOptions } from "./client.js";
export type { EventSourceConstructor } from "./core.js";
export { Subscription } from "./subscribe.js";
export type { SseImplementation, SubscribeOptions, Transport } from "./subscribe.js";
export { Join, fold } from "./join.js";
export type { FoldStep, JoinOptions, JoinPhase } from "./join.js";
export { SessionConsumer } from "./session.js";
export type { AttachOptions } from "./session.js";
export { UpdateStream } from "./stream.js";
export type { Listener } from "./stream.js";
export { localStorageStore, memoryStore } from "./store.js";
export { GaplessError } from "./errors.js";
export type { ClientErrorCode, ErrorCode, GaplessErrorInit, ServerErrorCode } from "./errors.js";
export { Backoff } from "./backoff.js";
export type { BackoffOptions } from "./backoff.js";
export { DEFAULT_MAX_EVENT_BYTES, SseParser, parseAll } from "./sse.js";
export type { SseItem } from "./sse.js";
export type {
  BatchItem,
  BatchPublished,
  ChannelInfo,
  CursorStore,
  EphemeralDelivered,
  EphemeralUpdate,
  EventUpdate,
  GapReason,
  GapUpdate,
  HistoryEvent,
  HistoryPage,
  PresenceMember,
  PresenceUpdate,
  ChannelPresence,
  Published,
  RetentionLimits,
  SessionAppended,
  SessionInfo,
  SessionUpdate,
  Since,
  Update,
  WebSocketConstructor,
} from "./types.js";
