// Compile-only check of the public types (run by scripts/ts-test.sh with tsc --noEmit): the
// README's snippets, written against the package's declarations. Never executed.
import {
  Client,
  GaplessError,
  fold,
  localStorageStore,
  memoryStore,
  type CursorStore,
  type GapUpdate,
  type Since,
  type Update,
} from "../../dist/index.js";

declare function render(x: unknown): void;
declare const WebSocketImpl: new (url: string, protocols?: string | string[]) => WebSocket;

export async function readme(): Promise<void> {
  const client = new Client("http://127.0.0.1:8080", {
    getToken: async () => "jwt",
    store: localStorageStore(),
    WebSocket: WebSocketImpl,
    backoff: { initialMs: 500, maxMs: 10_000 },
  });
  const p = await client.publish("orders", "{}", { type: "created" });
  const seq: number = p.seq;
  const dup: boolean = (await client.publish("orders", "same", { idempotencyKey: "k" })).duplicate;
  const eph: number = (await client.publish("orders", "typing", { ephemeral: true })).subscribers;
  const batch = await client.publishBatch("orders", ["a", { data: "b", type: "t" }]);
  render([seq, dup, eph, batch.firstSeq, batch.lastSeq, batch.events[0]?.cursor]);

  const page = await client.history("orders", { after: p.cursor, limit: 100 });
  render(page.done ? page.next : page.events.map((e) => e.seq));
  for await (const pg of client.historyAll("orders")) render(pg.events);
  const lastTen = await client.history("orders", { since: "last:10" });
  render([lastTen.gap?.reason, lastTen.gap?.next]);
  const since: Since[] = ["live", "earliest", "last:10", `time:${Date.now() - 60_000}`, { last: 10 }, { time: new Date() }];
  for (const s of since) render(client.subscribe("orders", { since: s }));

  const sub = client.subscribe(["orders", "prices"], { since: "earliest", transport: "ws" });
  for await (const u of sub) {
    if (u.kind === "event") render([u.channel, u.seq + 1, u.data, u.cursor.length, u.time]);
    else if (u.kind === "gap") render([u.after, u.next, u.reason, u.cursor]);
    else render([u.data, u.cursor]);
  }
  const cur: string | undefined = sub.cursor;
  render([cur, sub.cursors.get("orders"), sub.channels]);

  const ui = client.subscribe("orders", { sse: "eventsource", eventTypes: ["created"], store: null });
  const off = ui.on("event", (e) => render(e.seq));
  ui.on("gap", (g: GapUpdate) => render(g.reason));
  ui.on("error", (err) => render([err.code, err.status, err.message, err.terminal, err.retryAfterMs]));
  ui.on("update", (u: Update) => render(u.kind));
  off();
  ui.close();

  const join = client.join("scores", { cursor: "c", pageSize: 500 });
  for await (const step of fold(join, (total: number, u) => (u.kind === "event" ? total + Number(u.data) : total), 0)) {
    render([step.state.toFixed(0), step.cursor, step.update.kind]);
  }
  render(join.cursor);

  const { id } = await client.createSession();
  await client.appendSession(id, "step 1", { type: "t" });
  const consumer = client.attachSession(id, { lastSeq: 1, takeover: true });
  for await (const u of consumer) {
    if (u.kind === "event") render([u.session, u.seq, u.data]);
    if (u.kind === "resumed") render(u.replayedEvents);
    if (u.kind === "completed" || u.kind === "cancelled") break;
  }
  render(consumer.lastSeq);
  await client.completeSession(id);

  try {
    await client.channel("x");
  } catch (e) {
    if (e instanceof GaplessError && e.code === "cursor_not_served") render([e.reason, e.body?.["floor_cursor"], e.closeCode]);
  }
  const store: CursorStore = memoryStore();
  await store.set("k", "v");
}
