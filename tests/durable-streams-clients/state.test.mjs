// StreamDB over gapless (issue 29; docs/durable-streams.md, "Integrations"): the state
// protocol's reactive database of @durable-streams/state (pinned in package-lock.json, with its
// @tanstack/db peer) follows a gapless stream of insert, update and delete events live; after a
// kill -9 of gapless a database loaded again holds every row and follows on. (StreamDB 0.3.1
// ends its live read when the connection breaks, "Stream consumer closed unexpectedly", and
// does not read again, with any server: a database is loaded again after a restart.) Run by
// scripts/ds-clients.sh with GAPLESS_BIN set: `node --test state.test.mjs`.
import assert from "node:assert/strict"
import { test } from "node:test"
import { DurableStream } from "@durable-streams/client"
import { createStateSchema } from "@durable-streams/state"
import { createStreamDB } from "@durable-streams/state/db"
import { Gapless, sleep } from "./gapless.mjs"

/** A Standard Schema validator that takes any object with a string `id`. */
const user = {
  "~standard": {
    version: 1,
    vendor: "gapless-tests",
    validate: (v) =>
      v && typeof v.id === "string" ? { value: v } : { issues: [{ message: "needs an id" }] },
  },
}

const schema = createStateSchema({ users: { schema: user, type: "user", primaryKey: "id" } })

async function until(check, what, ms = 20000) {
  const t0 = Date.now()
  while (!(await check())) {
    if (Date.now() - t0 > ms) assert.fail(`timed out waiting for ${what}`)
    await sleep(20)
  }
}

/** The rows of a database's users, sorted by id, as `id:name`. */
function rows(db) {
  return [...db.collections.users.values()]
    .map((u) => `${u.id}:${u.name}`)
    .sort()
}

test("StreamDB follows inserts, updates and deletes, and loads whole after a kill -9", async () => {
  const g = await Gapless.start()
  const url = g.url("state/users")
  try {
    const stream = await DurableStream.create({ url, contentType: "application/json" })
    const put = (e) => stream.append(JSON.stringify(e))
    for (let i = 0; i < 10; i++) {
      await put(schema.users.insert({ value: { id: `u${i}`, name: `name ${i}` } }))
    }
    const db = createStreamDB({ streamOptions: { url, contentType: "application/json" }, live: "sse", state: schema })
    await db.preload()
    const want = Array.from({ length: 10 }, (_, i) => `u${i}:name ${i}`).sort()
    assert.deepEqual(rows(db), want)

    await put(schema.users.update({ value: { id: "u3", name: "renamed ☃" } }))
    await put(schema.users.delete({ key: "u7" }))
    const live = want
      .filter((r) => !r.startsWith("u7:") && !r.startsWith("u3:"))
      .concat(["u3:renamed ☃"])
      .sort()
    await until(() => JSON.stringify(rows(db)) === JSON.stringify(live), "the live rows")
    db.close()

    await g.restart() // kill -9, then the same data directory
    const again = createStreamDB({ streamOptions: { url, contentType: "application/json" }, live: "sse", state: schema })
    await again.preload()
    assert.deepEqual(rows(again), live, "loaded after the restart")
    await put(schema.users.insert({ value: { id: "u10", name: "name 10" } }))
    const after = [...live, "u10:name 10"].sort()
    await until(() => JSON.stringify(rows(again)) === JSON.stringify(after), "rows after it")
    const fresh = createStreamDB({ streamOptions: { url, contentType: "application/json" }, live: false, state: schema })
    await fresh.preload()
    assert.deepEqual(rows(fresh), after)
    again.close()
    fresh.close()
  } finally {
    await g.stop()
  }
})
