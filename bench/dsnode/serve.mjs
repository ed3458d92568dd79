// Starts the Durable Streams Node reference server (@durable-streams/server, pinned in
// package-lock.json) for bench/compare: `node serve.mjs PORT [DATA_DIR]`. With DATA_DIR it
// uses the package's file-backed store (log files, LMDB metadata), without it memory.
// Prints `listening on http://127.0.0.1:PORT` once ready; SIGTERM/SIGINT stop it.
import { DurableStreamTestServer } from "@durable-streams/server"

const port = Number(process.argv[2] || 4437)
const dataDir = process.argv[3] || undefined
const server = new DurableStreamTestServer({ port, host: "127.0.0.1", dataDir })
await server.start()
console.log(`listening on http://127.0.0.1:${port} (${dataDir ? `file-backed: ${dataDir}` : "memory"})`)
const stop = async () => {
  await server.stop()
  process.exit(0)
}
process.on("SIGTERM", stop)
process.on("SIGINT", stop)
