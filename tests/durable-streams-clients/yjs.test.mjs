// Yjs documents over gapless (issue 29; docs/durable-streams.md, "Integrations"): the official
// Yjs server and provider of @durable-streams/y-durable-streams (pinned in package-lock.json)
// with gapless as their Durable Streams server, unchanged. Run by scripts/ds-clients.sh with
// GAPLESS_BIN set: `node --test yjs.test.mjs`.
//
// The Yjs server builds its stream URLs as `new URL("/v1/stream/...", dsServerUrl)`, so gapless
// serves Durable Streams at `--ds-prefix /v1/stream`. Its compaction writes a snapshot at an
// offset and reads the updates after it from that offset with 1 added to its number: gapless's
// offsets read such a stepped offset from the earlier boundary, so nothing is skipped. A small
// compaction threshold makes compaction happen every few lines.
import assert from "node:assert/strict"
import { test } from "node:test"
import * as Y from "yjs"
import { Awareness } from "y-protocols/awareness"
import { YjsProvider } from "@durable-streams/y-durable-streams"
import { YjsServer } from "@durable-streams/y-durable-streams/server"
import { Gapless, sleep } from "./gapless.mjs"

/** Bytes of updates after which the Yjs server compacts: a few lines. */
const COMPACTION_THRESHOLD = 200

/** Waits until `check()` is true, for at most `ms`; fails with `what` otherwise. */
async function until(check, what, ms = 20000) {
  const t0 = Date.now()
  while (!(await check())) {
    if (Date.now() - t0 > ms) assert.fail(`timed out waiting for ${what}`)
    await sleep(25)
  }
}

/** gapless at /v1/stream and a Yjs server in front of it. */
async function start() {
  const g = await Gapless.start([], "/v1/stream")
  const yjs = new YjsServer({
    port: 0,
    host: "127.0.0.1",
    dsServerUrl: g.base,
    compactionThreshold: COMPACTION_THRESHOLD,
  })
  await yjs.start()
  return { g, yjs, baseUrl: `${yjs.url}/v1/yjs/notes` }
}

/** A provider of a new Y.Doc on `docId`, synced; `liveMode` is the provider's (SSE by
 * default). */
async function join(baseUrl, docId, { awareness = false, liveMode = "sse" } = {}) {
  const doc = new Y.Doc()
  const a = awareness ? new Awareness(doc) : undefined
  const provider = new YjsProvider({ doc, baseUrl, docId, awareness: a, liveMode })
  provider.on("error", () => {}) // the tests assert on the document itself
  await until(() => provider.synced, `provider of ${docId} to sync`)
  return { doc, provider, awareness: a, text: () => doc.getText("t").toString() }
}

/** Types lines `from` to `to - 1` at the end of the document, each flushed to the server
 * as its own update. */
async function type(p, from, to) {
  for (let i = from; i < to; i++) {
    const t = p.doc.getText("t")
    t.insert(t.length, `line ${i}\n`)
    await p.provider.flush()
  }
}

function lines(from, to) {
  let s = ""
  for (let i = from; i < to; i++) s += `line ${i}\n`
  return s
}

/** The snapshots the Yjs server has recorded for `docId` (its index stream on gapless). */
async function compactions(g, docId) {
  const r = await fetch(g.url(`yjs/notes/docs/${docId}/.index?offset=-1`))
  if (r.status === 404) return 0
  const body = await r.text()
  assert.equal(r.status, 200, body)
  return JSON.parse(body).length
}

test("a provider joining after compactions holds the same text", async () => {
  const { g, yjs, baseUrl } = await start()
  try {
    const a = await join(baseUrl, "doc")
    await type(a, 0, 60)
    await until(async () => (await compactions(g, "doc")) >= 2, "two compactions")
    // Updates after the last snapshot, read from its stepped offset.
    await type(a, 60, 63)
    const b = await join(baseUrl, "doc")
    assert.equal(b.text(), lines(0, 63))
    assert.equal(a.text(), lines(0, 63))
    // And live: what one types, the other gets.
    await type(b, 63, 64)
    await until(() => a.text() === lines(0, 64), "the first provider to get line 63")
    a.provider.destroy()
    b.provider.destroy()
  } finally {
    await yjs.stop()
    await g.stop()
  }
})

test("the document survives two kill -9 of gapless: no line lost or doubled", async () => {
  const { g, yjs, baseUrl } = await start()
  try {
    // A provider that stays connected across the restarts, following live. It long-polls:
    // the Yjs server (0.2.7) proxies an SSE read without ending its own response when the
    // upstream one breaks, so an SSE follower would wait forever on a dead proxy response
    // after a kill -9 of any Durable Streams server (docs/durable-streams.md, "Integrations").
    const follower = await join(baseUrl, "doc", { liveMode: "long-poll" })
    for (let round = 0; round < 3; round++) {
      // A writer joins after each restart, from snapshot and updates.
      const w = await join(baseUrl, "doc")
      assert.equal(w.text(), lines(0, 20 * round), `round ${round}: the writer joins`)
      await type(w, 20 * round, 20 * round + 20)
      w.provider.destroy()
      await until(
        () => follower.text() === lines(0, 20 * round + 20),
        `round ${round}: the follower to get every line`,
      )
      if (round < 2) await g.restart() // kill -9, then start on the same data directory
    }
    assert.ok((await compactions(g, "doc")) >= 3, "compactions happened across the restarts")
    const fresh = await join(baseUrl, "doc")
    assert.equal(fresh.text(), lines(0, 60))
    follower.provider.destroy()
    fresh.provider.destroy()
  } finally {
    await yjs.stop()
    await g.stop()
  }
})

test("awareness passes between two providers", async () => {
  const { g, yjs, baseUrl } = await start()
  try {
    const a = await join(baseUrl, "room", { awareness: true })
    const b = await join(baseUrl, "room", { awareness: true })
    a.awareness.setLocalStateField("user", { name: "ada", cursor: 3 })
    b.awareness.setLocalStateField("user", { name: "bob", cursor: 7 })
    const seen = (p, id) => p.awareness.getStates().get(id)?.user
    await until(() => seen(b, a.doc.clientID)?.name === "ada", "bob to see ada")
    await until(() => seen(a, b.doc.clientID)?.name === "bob", "ada to see bob")
    assert.deepEqual(seen(b, a.doc.clientID), { name: "ada", cursor: 3 })
    a.awareness.setLocalStateField("user", { name: "ada", cursor: 9 })
    await until(() => seen(b, a.doc.clientID)?.cursor === 9, "bob to see ada's cursor move")
    a.provider.destroy()
    b.provider.destroy()
  } finally {
    await yjs.stop()
    await g.stop()
  }
})
