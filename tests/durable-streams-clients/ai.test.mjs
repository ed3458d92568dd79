// AI chat streams over gapless (issue 29; docs/durable-streams.md, "Integrations"): the chat
// app of examples/ai-chat (its fake model, its routes on the published transports) with the
// clients of @durable-streams/aisdk-transport (the AI SDK's `useChat` transport) and
// @durable-streams/tanstack-ai-transport, pinned in package-lock.json. Run by
// scripts/ds-clients.sh with GAPLESS_BIN set: `node --test ai.test.mjs`.
//
// In each test the model stops in the middle of its answer, gapless is killed with SIGKILL and
// restarted on the same data directory, and the model goes on: the client's message must be
// the whole generated text, each delta once, in order.
import assert from "node:assert/strict"
import { test } from "node:test"
import { readUIMessageStream } from "ai"
import { createDurableChatTransport } from "@durable-streams/aisdk-transport"
import {
  durableStreamConnection,
  materializeSnapshotFromDurableStream,
} from "@durable-streams/tanstack-ai-transport"
import { startApp } from "../../examples/ai-chat/app.mjs"
import { answerText } from "../../examples/ai-chat/fake-model.mjs"
import { Gapless, sleep } from "./gapless.mjs"

/** Deltas per answer; the model stops after HALF of them until the test opens its gate. */
const DELTAS = 300
const HALF = 150

async function until(check, what, ms = 20000) {
  const t0 = Date.now()
  while (!(await check())) {
    if (Date.now() - t0 > ms) assert.fail(`timed out waiting for ${what}`)
    await sleep(20)
  }
}

/** A gate the model waits at; `reached` once it does, `release()` lets it go on. */
function gate() {
  let release
  let reached = false
  const opened = new Promise((r) => (release = r))
  return {
    at: HALF,
    open: () => {
      reached = true
      return opened
    },
    get reached() {
      return reached
    },
    release: () => release(),
  }
}

const whole = answerText({ deltas: DELTAS })
const firstHalf = answerText({ deltas: HALF })

const textOf = (message) =>
  (message?.parts ?? [])
    .filter((p) => p.type === "text")
    .map((p) => p.text ?? p.content ?? "")
    .join("")

test("AI SDK: an answer streamed across a kill -9 of gapless arrives whole", async () => {
  const g = await Gapless.start()
  const model = gate()
  const app = await startApp({ streams: `${g.base}/ds`, model: { deltas: DELTAS, gate: model } })
  try {
    const transport = createDurableChatTransport({ api: `${app.url}/api/chat` })
    const user = { id: "u1", role: "user", parts: [{ type: "text", text: "hello" }] }
    const chunks = await transport.sendMessages({
      trigger: "submit-message",
      chatId: "c1",
      messageId: undefined,
      messages: [user],
      abortSignal: undefined,
    })
    let text = ""
    const reading = (async () => {
      for await (const m of readUIMessageStream({ stream: chunks })) text = textOf(m)
    })()
    await until(() => model.reached && text === firstHalf, "the first half to arrive")
    // A second client, as `useChat({ resume: true })` after a reload, finds the running answer.
    const resumed = await transport.reconnectToStream({ chatId: "c1" })
    assert.ok(resumed, "a running generation is found")
    await g.restart() // kill -9 in the middle of the answer
    model.release()
    await reading
    assert.equal(text, whole)
    let again = ""
    for await (const m of readUIMessageStream({ stream: resumed })) again = textOf(m)
    assert.equal(again, whole, "the resumed client")
    // Finished: nothing to resume.
    await until(async () => (await transport.reconnectToStream({ chatId: "c1" })) === null, "204")
  } finally {
    model.release()
    await app.close()
    await g.stop()
  }
})

test("TanStack AI: an answer streamed across a kill -9 of gapless arrives whole", async () => {
  const g = await Gapless.start()
  const model = gate()
  const app = await startApp({ streams: `${g.base}/ds`, model: { deltas: DELTAS, gate: model } })
  try {
    const readUrl = g.url("tanstack/c2")
    const connection = durableStreamConnection({ sendUrl: `${app.url}/api/tanstack?id=c2`, readUrl })
    const user = { id: "u1", role: "user", parts: [{ type: "text", content: "hello" }] }
    await connection.send([user])
    // The client's message: the snapshot of the session so far, then live chunks. The
    // connection's `subscribe` ends with the error when its read breaks (a kill -9); the
    // connection keeps its offset, and subscribing again goes on from it, as a live TanStack
    // chat client does.
    let assistant = ""
    let finished = false
    let breaks = 0
    const reading = (async () => {
      while (!finished) {
        try {
          for await (const chunk of connection.subscribe()) {
            if (chunk.type === "MESSAGES_SNAPSHOT") {
              assistant = textOf(chunk.messages.find((m) => m.role === "assistant"))
            } else if (chunk.type === "TEXT_MESSAGE_CONTENT" && chunk.model !== "client") {
              assistant += chunk.delta
            } else if (chunk.type === "RUN_FINISHED") {
              finished = true
              break
            }
          }
        } catch {
          breaks += 1
          await sleep(100)
        }
      }
    })()
    await until(() => model.reached && assistant === firstHalf, "the first half to arrive")
    await g.restart() // kill -9 in the middle of the answer
    model.release()
    await reading
    assert.ok(finished, "the run finished")
    assert.equal(assistant, whole)
    assert.ok(breaks <= 2, `the read broke ${breaks} times`)
    // A reader after the fact (the transport's server-side rendering helper) sees the same.
    const { messages } = await materializeSnapshotFromDurableStream({ readUrl })
    assert.deepEqual(
      messages.map((m) => [m.role, textOf(m)]),
      [
        ["user", "hello"],
        ["assistant", whole],
      ],
    )
  } finally {
    model.release()
    await app.close()
    await g.stop()
  }
})
