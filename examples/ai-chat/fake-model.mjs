// A local fake model for the chat example and its tests: no network, no key. It answers every
// prompt with `deltas` text deltas (`answerText` gives the whole text), one every `delayMs`
// milliseconds; with `gate` ({ at, open }), it stops after `at` deltas until the promise
// `open()` returns settles (the tests restart gapless there, in the middle of an answer).
import { MockLanguageModelV3 } from "ai/test"

/** The i-th delta of an answer: words with non-ASCII, quotes and a newline now and then. */
export function delta(i) {
  return `w${i}${i % 17 === 0 ? "\n" : " "}${i % 29 === 0 ? '"snow ☃" ' : ""}`
}

/** The whole text of an answer of `deltas` deltas. */
export function answerText({ deltas = 300 } = {}) {
  let s = ""
  for (let i = 0; i < deltas; i++) s += delta(i)
  return s
}

/** The deltas, paced as the options say. */
async function* deltasOf({ deltas = 300, delayMs = 2, gate } = {}) {
  for (let i = 0; i < deltas; i++) {
    if (gate && i === gate.at) await gate.open()
    if (delayMs > 0) await new Promise((r) => setTimeout(r, delayMs))
    yield delta(i)
  }
}

/** An AI SDK language model (v3 specification) streaming the answer. */
export function fakeModel(options = {}) {
  return new MockLanguageModelV3({
    doStream: async () => {
      const parts = (async function* () {
        yield { type: "stream-start", warnings: [] }
        yield { type: "text-start", id: "t0" }
        for await (const d of deltasOf(options)) yield { type: "text-delta", id: "t0", delta: d }
        yield { type: "text-end", id: "t0" }
        yield {
          type: "finish",
          finishReason: { unified: "stop", raw: "stop" },
          usage: {
            inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
            outputTokens: { total: options.deltas ?? 300, text: options.deltas ?? 300, reasoning: 0 },
          },
        }
      })()
      return { stream: ReadableStream.from(parts) }
    },
  })
}

/** The answer as TanStack AI chunks (AG-UI events), for the TanStack AI transport. */
export async function* tanstackAnswer(options = {}) {
  const messageId = `a-${Date.now()}-${Math.random().toString(36).slice(2)}`
  const model = "fake"
  yield { type: "RUN_STARTED", runId: messageId, model, timestamp: Date.now() }
  yield { type: "TEXT_MESSAGE_START", messageId, role: "assistant", model, timestamp: Date.now() }
  for await (const d of deltasOf(options)) {
    yield { type: "TEXT_MESSAGE_CONTENT", messageId, delta: d, model, timestamp: Date.now() }
  }
  yield { type: "TEXT_MESSAGE_END", messageId, model, timestamp: Date.now() }
  yield { type: "RUN_FINISHED", runId: messageId, finishReason: "stop", model, timestamp: Date.now() }
}
