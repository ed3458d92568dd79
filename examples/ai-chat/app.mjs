// A chat app whose answers are Durable Streams on gapless, so an answer survives a reload, a
// dropped connection or a restart of gapless: the model's output is appended to a stream as it
// is generated, and the client reads the stream, not the POST's response.
//
// Two transports, each the published one for its framework:
// - AI SDK (`useChat`): POST /api/chat answers `Location: <stream URL>` at once
//   (`@durable-streams/aisdk-transport`'s `toDurableStreamResponse`); GET
//   /api/chat/<id>/stream answers the stream of a generation still running (204 when none), for
//   `useChat({ resume: true })`.
// - TanStack AI: POST /api/tanstack?id=<chat> appends the user's message and the answer to the
//   chat's one session stream (`@durable-streams/tanstack-ai-transport`'s
//   `toDurableChatSessionResponse`); the client reads that stream directly.
//
// The model is local and fake (fake-model.mjs): no network, no key. Run: see README.md.
import { createServer } from "node:http"
import { streamText } from "ai"
import { toDurableStreamResponse } from "@durable-streams/aisdk-transport"
import { toDurableChatSessionResponse } from "@durable-streams/tanstack-ai-transport"
import { fakeModel, tanstackAnswer } from "./fake-model.mjs"

/**
 * Starts the app on `port` (0: any free one) of 127.0.0.1.
 * `streams`: the Durable Streams base URL, e.g. `http://127.0.0.1:8080/ds`.
 * `model`: options for the fake model (`deltas`, `delayMs`, `gate`).
 * Returns `{ url, close }`.
 */
export async function startApp({ streams, port = 0, model = {} }) {
  const active = new Map() // chat id -> the stream URL of its running generation
  let turn = 0

  async function chat(body) {
    const id = String(body.id ?? "chat")
    const url = `${streams}/chat/${encodeURIComponent(id)}/${Date.now()}-${turn++}`
    active.set(id, url)
    const result = streamText({ model: fakeModel(model), messages: toModelMessages(body.messages) })
    return toDurableStreamResponse({
      source: result.toUIMessageStream({
        originalMessages: body.messages,
        onFinish: () => active.delete(id),
      }),
      stream: { writeUrl: url, readUrl: url },
    })
  }

  function resume(id) {
    const url = active.get(id)
    if (!url) return new Response(null, { status: 204 })
    return Response.json({ streamUrl: url }, { status: 200, headers: { Location: url } })
  }

  async function tanstack(id, body) {
    const messages = Array.isArray(body.messages) ? body.messages : []
    const last = messages[messages.length - 1]
    return toDurableChatSessionResponse({
      stream: { writeUrl: `${streams}/tanstack/${encodeURIComponent(id)}` },
      newMessages: last ? [last] : [],
      responseStream: tanstackAnswer(model),
    })
  }

  const server = createServer(async (req, res) => {
    try {
      const u = new URL(req.url, "http://app")
      let answer
      if (req.method === "POST" && u.pathname === "/api/chat") {
        answer = await chat(await json(req))
      } else if (req.method === "GET" && /^\/api\/chat\/[^/]+\/stream$/.test(u.pathname)) {
        answer = resume(decodeURIComponent(u.pathname.split("/")[3]))
      } else if (req.method === "POST" && u.pathname === "/api/tanstack") {
        answer = await tanstack(u.searchParams.get("id") ?? "chat", await json(req))
      } else {
        answer = Response.json({ error: "not found" }, { status: 404 })
      }
      res.writeHead(answer.status, Object.fromEntries(answer.headers))
      res.end(Buffer.from(await answer.arrayBuffer()))
    } catch (e) {
      res.writeHead(500, { "content-type": "application/json" })
      res.end(JSON.stringify({ error: String(e?.message ?? e) }))
    }
  })
  await new Promise((r) => server.listen(port, "127.0.0.1", r))
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    close: () => new Promise((r) => server.close(r)),
  }
}

/** The AI SDK's UI messages as model messages (text parts only: this app sends text). */
function toModelMessages(messages = []) {
  return messages.map((m) => ({
    role: m.role,
    content: (m.parts ?? [])
      .filter((p) => p.type === "text")
      .map((p) => p.text)
      .join(""),
  }))
}

async function json(req) {
  let s = ""
  for await (const c of req) s += c
  return s ? JSON.parse(s) : {}
}

// `node app.mjs`: the app on :3000 against gapless on :8080 (`gapless serve --ds-prefix /ds`).
if (import.meta.url === `file://${process.argv[1]}`) {
  const streams = process.env.STREAMS_URL ?? "http://127.0.0.1:8080/ds"
  const app = await startApp({ streams, port: Number(process.env.PORT ?? 3000) })
  console.log(`chat app on ${app.url}, answers streamed to ${streams}`)
}
