// A gapless server for the client tests: the binary in GAPLESS_BIN, serving Durable Streams
// under /ds (or the prefix given), with its own fresh data directory, on a free port; kill -9
// and restart on the same port and data directory. Used by clients.test.mjs (the Python tests have the same
// harness in clients_test.py).
import { spawn } from "node:child_process"
import { mkdtempSync, openSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { createInterface } from "node:readline"

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

export class Gapless {
  /** Starts a server; `extra` flags are added to `gapless serve`; `prefix` is its
   * `--ds-prefix`. */
  static async start(extra = [], prefix = "/ds") {
    const g = new Gapless(extra, prefix)
    g.addr = await g.#spawn("127.0.0.1:0")
    return g
  }

  constructor(extra, prefix = "/ds") {
    const bin = process.env.GAPLESS_BIN
    if (!bin) throw new Error("GAPLESS_BIN is not set")
    this.bin = bin
    this.extra = extra
    this.prefix = prefix
    this.dir = mkdtempSync(join(tmpdir(), "gapless-ds-clients-"))
    this.starts = 0
    this.child = null
    this.addr = null
  }

  /** `http://127.0.0.1:PORT`. */
  get base() {
    return `http://${this.addr}`
  }

  /** The URL of the Durable Streams stream at `path` (no leading slash). */
  url(path) {
    return `${this.base}${this.prefix}/${path}`
  }

  #logPath() {
    return join(this.dir, `server-${this.starts}.log`)
  }

  /** The server's log (stderr) of the current or last run. */
  log() {
    try {
      return readFileSync(this.#logPath(), "utf8")
    } catch {
      return ""
    }
  }

  async #spawn(listen) {
    this.starts += 1
    const err = openSync(this.#logPath(), "w")
    const child = spawn(
      this.bin,
      [
        "serve",
        "--listen",
        listen,
        "--data-dir",
        join(this.dir, "data"),
        "--ds-prefix",
        this.prefix,
        ...this.extra,
      ],
      { stdio: ["ignore", "pipe", err] },
    )
    const exited = new Promise((r) => child.once("exit", (code, sig) => r({ code, sig })))
    const lines = createInterface({ input: child.stdout })
    const first = new Promise((resolve) => {
      lines.once("line", resolve)
      lines.once("close", () => resolve(null))
    })
    let timer
    const timeout = new Promise((r) => {
      timer = setTimeout(() => r(null), 15000)
    })
    const line = await Promise.race([first, timeout])
    clearTimeout(timer)
    const m = line && /^gapless listening on http:\/\/(\S+)/.exec(line)
    if (!m) {
      child.kill("SIGKILL")
      await exited
      throw new Error(`gapless did not print its listening line (got ${line}); log:\n${this.log()}`)
    }
    // Keep draining stdout so the server never writes into a closed pipe.
    lines.on("line", () => {})
    this.child = child
    this.exited = exited
    return m[1]
  }

  /** kill -9, and waits for the process to be gone. */
  async kill9() {
    if (!this.child) return
    this.child.kill("SIGKILL")
    await this.exited
    this.child = null
  }

  /** Starts the server again on the same port and data directory (kills it first if it
   * runs); retries for up to 20 s in case the port is briefly held. */
  async restart() {
    await this.kill9()
    const t0 = Date.now()
    for (;;) {
      try {
        const addr = await this.#spawn(this.addr)
        if (addr !== this.addr) throw new Error(`restarted on ${addr}, not ${this.addr}`)
        return
      } catch (e) {
        if (Date.now() - t0 > 20000) throw e
        await sleep(100)
      }
    }
  }

  /** Stops the server and removes its data directory. */
  async stop() {
    await this.kill9()
    rmSync(this.dir, { recursive: true, force: true })
  }
}

