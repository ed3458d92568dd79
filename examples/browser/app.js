// The example page: follows one channel with @gapless/client and shows every event and gap.
//
// Query parameters: server (default http://127.0.0.1:8080), channel (default "news"),
// transport ("sse" or "ws"), sse ("fetch" or "eventsource"), since ("live" or "earliest").
// Run it with: node examples/browser/serve.mjs, then open the URL it prints.
import { Client, localStorageStore } from "/sdk/index.js";

const params = new URLSearchParams(location.search);
const server = params.get("server") ?? "http://127.0.0.1:8080";
const channel = params.get("channel") ?? "news";
const $ = (id) => document.getElementById(id);

// What the page has shown, for people and for the browser test that drives it.
const shown = { events: [], gaps: [], errors: [], channelState: null, loads: 0 };
window.example = shown;

const client = new Client(server, {
  // Each update's position is written here as it is handed to the page, so a reload resumes
  // right after the last update the page saw: no loss, no repeat.
  store: localStorageStore(),
  backoff: { initialMs: 200, maxMs: 2000 },
});

const sub = client.subscribe(channel, {
  transport: params.get("transport") ?? "sse",
  sse: params.get("sse") ?? "fetch",
  since: params.get("since") ?? "live",
});

$("channel").textContent = channel;
$("status").textContent = "following";

sub.on("event", (e) => {
  shown.events.push({ seq: e.seq, data: e.data });
  const li = document.createElement("li");
  li.value = e.seq;
  li.textContent = e.data;
  $("events").appendChild(li);
  $("count").textContent = String(shown.events.length);
  $("cursor").textContent = e.cursor.slice(0, 16) + "…";
});

sub.on("gap", async (g) => {
  // The range after g.after up to g.next will never arrive. Show it, then refetch what the
  // page derives from the channel: here, the channel's current state (an app that renders
  // from history would re-read it, or re-run a join, at this point).
  shown.gaps.push({ reason: g.reason, after: g.after, next: g.next });
  const li = document.createElement("li");
  li.textContent = `missed a range of ${g.channel} (${g.reason}); state refetched`;
  $("gaps").appendChild(li);
  const mark = document.createElement("li");
  mark.className = "gap-mark";
  mark.textContent = `— gap (${g.reason}) —`;
  $("events").appendChild(mark);
  shown.channelState = await client.channel(channel);
});

sub.on("error", (err) => {
  shown.errors.push({ code: err.code, message: err.message });
  $("status").textContent = `stopped: ${err.code}: ${err.message}`;
});
