// The official Durable Streams TypeScript client (@durable-streams/client, pinned in
// package-lock.json) against gapless across kill -9 (issue 19, "Real clients nobody here
// wrote"; docs/durable-streams.md, "Clients tested"). Run by scripts/ds-clients.sh with
// GAPLESS_BIN set: `node --test clients.test.mjs`.
//
// Each test creates a stream with the client, follows it live with the client's own reader
// (SSE or long-poll) and appends with its IdempotentProducer, while the server is killed with
// SIGKILL and restarted on the same port and data directory: once while the follower waits at
// the tail, twice with an append in flight, and once before a second producer with the same
// id and epoch (a writer that restarted without its state) re-sends every message already
// acknowledged. The follower must see every message exactly once, in order, and a catch-up read
// from the start must hold exactly the messages. Then HEAD names the follower's offset, and the
// producer closes the stream: the follower is told (`streamClosed`) and its read ends. JSON streams compare messages; binary streams
// compare the bytes (each message holds its index and non-UTF-8 bytes).
import assert from "node:assert/strict"
import { test } from "node:test"
import { DurableStream, IdempotentProducer, stream } from "@durable-streams/client"
import { Gapless, sleep } from "./gapless.mjs"

/** Messages per test. */
const N = 40

/** The i-th message of a JSON stream: text with quotes, a newline, a CR, a line separator
 * and non-ASCII, so SSE framing and JSON escaping are exercised. */
function jsonMessage(i) {
  return { n: i, text: `message ${i}: "quoted"\nline\r\u2028 snow \u2603 ${"x".repeat(i % 7)}` }
}

/** The i-th message of a binary stream: 16 bytes, its index first, then bytes that are not
 * UTF-8 (0xff, a lone continuation byte, an encoded surrogate, 0xf8) and CR, LF, NUL. */
function binaryMessage(i) {
  return Uint8Array.from([
    (i >> 8) & 0xff,
    i & 0xff,
    0xff,
    0xfe,
    0x00,
    0x0a,
    0x0d,
    0xc3,
    0x28,
    0x80,
    0xed,
    0xa0,
    0x80,
    0xf8,
    (i & 0xff) ^ 0xaa,
    0x5c,
  ])
}

function concat(chunks) {
  const out = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0))
  let at = 0
  for (const c of chunks) {
    out.set(c, at)
    at += c.length
  }
  return out
}

/** Which message indexes a binary stream's bytes hold, in order (16 bytes each), or a
 * description of where they first differ from the expected bytes. */
function describeBinary(got, want) {
  if (Buffer.from(got).equals(Buffer.from(want))) return "identical"
  const idx = []
  for (let at = 0; at + 16 <= got.length; at += 16) idx.push((got[at] << 8) | got[at + 1])
  let first = 0
  while (first < got.length && first < want.length && got[first] === want[first]) first++
  return `${got.length} bytes (want ${want.length}), first difference at byte ${first}; message indexes: ${idx.join(",")}`
}

/** A fetch for the producer that retries a request the network refused or cut (the server is
 * down between a kill -9 and its restart): the client's producer leaves such retries to its
 * caller, and a retry with the same producer headers is safe by the protocol. */
function retryingFetch(stats) {
  return async (input, init) => {
    const t0 = Date.now()
    for (;;) {
      try {
        return await fetch(input, init)
      } catch (e) {
        if (init?.signal?.aborted || Date.now() - t0 > 20000) throw e
        stats.retries += 1
        await sleep(50)
      }
    }
  }
}

async function waitFor(what, cond, ms = 20000) {
  const t0 = Date.now()
  while (!cond()) {
    if (Date.now() - t0 > ms) throw new Error(`timed out after ${ms} ms waiting for ${what}`)
    await sleep(20)
  }
}

/**
 * Follows `url` from the start with the client's reader in `live` mode and collects what
 * arrives: JSON items, or the bytes' chunks. The client retries a request the network refused
 * (its backoff) and reconnects an SSE response that ended cleanly, but a response cut by the
 * server's death (SSE, or a long-poll answer cut in its body) ends the read with an error
 * (`closed` rejects); the follower then reads again from the offset of the last batch it
 * received, as an application does. `count()` is the number of messages so far.
 */
function follow(url, live, json) {
  const f = { items: [], chunks: [], errors: [], offset: "-1", res: null, stopped: false }
  f.streamClosed = false
  const abort = new AbortController()
  f.count = () => (json ? f.items.length : f.chunks.reduce((n, c) => n + c.length, 0) / 16)
  f.stop = () => {
    f.stopped = true
    abort.abort()
    f.res?.cancel()
  }
  f.ended = false
  f.done = (async () => {
    while (!f.stopped) {
      try {
        const res = await stream({
          url,
          offset: f.offset,
          live,
          signal: abort.signal,
          backoffOptions: { initialDelay: 50, maxDelay: 500, multiplier: 1.5 },
        })
        f.res = res
        if (f.stopped) res.cancel()
        if (json) {
          res.subscribeJson(async (batch) => {
            f.items.push(...batch.items)
            f.offset = batch.offset
            f.streamClosed ||= batch.streamClosed
          })
        } else {
          res.subscribeBytes(async (chunk) => {
            if (chunk.data.length > 0) f.chunks.push(Uint8Array.from(chunk.data))
            f.offset = chunk.offset
            f.streamClosed ||= chunk.streamClosed
          })
        }
        await res.closed
        // A closed stream's read ends for good (the client stops after `streamClosed`).
        // `closed` may resolve before the subscriber got the last batch (the client reads
        // ahead of its subscriber), so wait for that batch here.
        if (res.streamClosed) {
          await waitFor("the batch that says the stream is closed", () => f.streamClosed, 5000)
          break
        }
        if (!f.stopped) f.errors.push("the read ended")
      } catch (e) {
        if (f.stopped) break
        f.errors.push(String(e))
        await sleep(50)
      }
    }
    f.ended = true
  })()
  return f
}

/** The whole scenario for one stream: content type, the follower's live mode. */
async function scenario(t, { name, contentType, live }) {
  const json = contentType === "application/json"
  const message = json ? jsonMessage : binaryMessage
  const g = await Gapless.start(["--ds-long-poll-timeout-ms", "1000"])
  t.after(() => g.stop())
  const url = g.url(`clients/ts/${name}`)
  const stats = { retries: 0 }
  const producerErrors = []
  const producerOpts = {
    epoch: 0,
    lingerMs: 0,
    maxInFlight: 1,
    fetch: retryingFetch(stats),
    onError: (e) => producerErrors.push(String(e)),
  }
  const kill = async (why) => {
    await g.kill9()
    await sleep(150)
    await g.restart()
    t.diagnostic(`kill -9 and restart: ${why}`)
  }

  const handle = await DurableStream.create({ url, contentType })
  const f = follow(url, live, json)
  t.after(() => f.stop())
  // One message per batch, so a producer's seq i is message i (the replay below relies on it).
  const send = async (p, i) => {
    p.append(json ? JSON.stringify(message(i)) : message(i))
    await p.flush()
  }

  const p1 = new IdempotentProducer(handle, "ts-writer", producerOpts)
  for (let i = 0; i < 10; i++) await send(p1, i)
  await waitFor("the follower to see 10 messages", () => f.count() >= 10)

  // 1. Killed while the follower waits at the tail.
  await kill("the follower is live at the tail")
  for (let i = 10; i < 20; i++) await send(p1, i)

  // 2. Killed with an append in flight (sent, answer not yet read), twice, at two delays.
  for (const [i, delay] of [
    [20, 0],
    [21, 2],
  ]) {
    p1.append(json ? JSON.stringify(message(i)) : message(i))
    const flushed = p1.flush()
    await sleep(delay)
    await kill(`append ${i} in flight`)
    await flushed
  }
  for (let i = 22; i < 30; i++) await send(p1, i)

  // 3. Killed, then a producer with the same id and epoch that lost its state re-sends
  // every message acknowledged before the kill (seq 0 to 29: duplicates, stored once), then
  // goes on with new ones.
  await kill("before a restarted writer re-sends its acknowledged appends")
  const p2 = new IdempotentProducer(handle, "ts-writer", producerOpts)
  for (let i = 0; i < N; i++) await send(p2, i)

  await waitFor(`the follower to see ${N} messages`, () => f.count() >= N)
  await sleep(300) // a duplicate would arrive now

  // HEAD through the client names the offset the follower reached.
  const head = await handle.head()
  assert.equal(head.offset, f.offset, "HEAD's offset is the follower's")
  assert.equal(head.contentType, contentType)

  // The producer closes the stream: the follower is told and its read ends by itself.
  await p2.close()
  await waitFor("the follower to see the stream closed and stop", () => f.streamClosed)
  await waitFor("the follower's read to end after the close", () => f.ended, 10000)
  f.stop()

  assert.deepEqual(producerErrors, [], "the producer reported errors")
  const wantJson = Array.from({ length: N }, (_, i) => message(i))
  const wantBytes = json ? null : concat(wantJson)
  if (json) {
    assert.deepEqual(
      f.items.map((m) => m.n),
      wantJson.map((m) => m.n),
      "the follower saw each message once, in order",
    )
    assert.deepEqual(f.items, wantJson, "the follower saw the messages exactly")
  } else {
    assert.equal(describeBinary(concat(f.chunks), wantBytes), "identical", "the follower's bytes")
  }

  // A catch-up read from the start, with a fresh reader.
  const res = await stream({ url, offset: "-1", live: false })
  if (json) {
    assert.deepEqual(await res.json(), wantJson, "a catch-up read holds each message once")
  } else {
    assert.equal(describeBinary(await res.body(), wantBytes), "identical", "a catch-up read's bytes")
  }
  t.diagnostic(
    `follower resumed ${f.errors.length} times (${[...new Set(f.errors)].join("; ")}); producer retries: ${stats.retries}`,
  )
}

test("JSON stream, followed by SSE, across kill -9", (t) =>
  scenario(t, { name: "json-sse", contentType: "application/json", live: "sse" }))

test("JSON stream, followed by long-poll, across kill -9", (t) =>
  scenario(t, { name: "json-long-poll", contentType: "application/json", live: "long-poll" }))

test("binary stream, followed by SSE (base64), across kill -9", (t) =>
  scenario(t, { name: "binary-sse", contentType: "application/octet-stream", live: "sse" }))

test("binary stream, followed by long-poll, across kill -9", (t) =>
  scenario(t, { name: "binary-long-poll", contentType: "application/octet-stream", live: "long-poll" }))

// gapless answers a catch-up read with at most 1000 messages and about 4 MiB (then without
// Stream-Up-To-Date; PROTOCOL.md allows such chunks). The client's promise helpers with
// `live: true` read on until up to date; with `live: false` the client 0.2.7 stops after the
// first answer, whatever Stream-Up-To-Date said (docs/durable-streams.md, "Clients tested").
test("a catch-up read longer than one answer is whole (JSON and binary)", async (t) => {
  const g = await Gapless.start()
  t.after(() => g.stop())

  const url = g.url("clients/ts/long-json")
  await DurableStream.create({ url, contentType: "application/json" })
  const items = Array.from({ length: 2500 }, (_, i) => ({ i }))
  for (let k = 0; k < items.length; k += 500) {
    // Raw POSTs of 500 messages each (the client's append() makes one message of its argument).
    const r = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(items.slice(k, k + 500)),
    })
    assert.equal(r.status, 204)
  }
  assert.deepEqual(await (await stream({ url, offset: "-1", live: true })).json(), items)
  const sse = await (await stream({ url, offset: "-1", live: "sse" })).json()
  assert.deepEqual(sse, items, "SSE from the start")
  const first = await (await stream({ url, offset: "-1", live: false })).json()
  t.diagnostic(`live: false read ${first.length} of ${items.length} messages (one answer)`)

  const burl = g.url("clients/ts/long-binary")
  const h = await DurableStream.create({ url: burl, contentType: "application/octet-stream" })
  const chunk = (k) => Uint8Array.from({ length: 900 * 1024 }, (_, i) => (i * 7919 + k * 31) & 0xff)
  for (let k = 0; k < 6; k++) await h.append(chunk(k))
  const want = Buffer.concat(Array.from({ length: 6 }, (_, k) => chunk(k)))
  const body = await (await stream({ url: burl, offset: "-1", live: true })).body()
  assert.ok(Buffer.from(body).equals(want), `catch-up: ${body.length} bytes, want ${want.length}`)
  const parts = []
  const res = await stream({ url: burl, offset: "-1", live: "sse" })
  res.subscribeBytes(async (c) => {
    parts.push(Buffer.from(c.data))
  })
  await waitFor("SSE to deliver every byte", () => parts.reduce((n, p) => n + p.length, 0) >= want.length)
  res.cancel()
  assert.ok(Buffer.concat(parts).equals(want), "SSE (base64) from the start")
})
