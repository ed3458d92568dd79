// The one test harness of the JavaScript tests (tests/browser/ and the TypeScript SDK's
// clients/typescript/test/): run the real gapless binary ($GAPLESS_BIN) on a fixed port and
// data dir, kill it with -9 (or SIGTERM) and start it again on the same port; mint HS256
// tokens; wait for things; launch Debian's Chromium.
//
// It imports node's built-in modules only: each package resolves its own npm packages
// (playwright-core is passed in to launchChromium by the caller).

import { execFileSync, spawn } from 'node:child_process';
import crypto from 'node:crypto';
import { once } from 'node:events';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

export { sleep };

const here = path.dirname(new URL(import.meta.url).pathname);
/** The repository root. */
export const REPO = path.resolve(here, '..', '..');

/** Debian's Chromium ($CHROMIUM_BIN to use another). */
export const CHROMIUM = process.env.CHROMIUM_BIN || '/usr/bin/chromium';

/** Absolute path of the gapless binary: $GAPLESS_BIN (relative: to the repository root), else <repo>/target/debug/gapless. */
export function gaplessBin() {
  const bin = path.resolve(REPO, process.env.GAPLESS_BIN || 'target/debug/gapless');
  if (!fs.existsSync(bin)) {
    throw new Error(`gapless binary not found at ${bin} (set GAPLESS_BIN, or build it with cargo build -p gapless)`);
  }
  return bin;
}

/** Whether this binary's `serve` takes --jwt-secret (authorization support). */
export function supportsJwt() {
  try {
    const help = execFileSync(gaplessBin(), ['serve', '--help'], { encoding: 'utf8', env: cleanEnv() });
    return help.includes('--jwt-secret');
  } catch {
    return false;
  }
}

/** A TCP port on 127.0.0.1 that was free a moment ago. */
export async function freePort() {
  const srv = net.createServer();
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  const { port } = srv.address();
  srv.close();
  await once(srv, 'close');
  return port;
}

export function tempDir(prefix) {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

/** Polls `fn` until it returns a truthy value; throws with `describe()` after `timeoutMs`. */
export async function waitFor(what, fn, { timeoutMs = 10_000, intervalMs = 20, describe } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) {
      const detail = describe ? `\n${await describe()}` : '';
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${detail}`);
    }
    await sleep(intervalMs);
  }
}

/** The strings from..to, inclusive. */
export function range(from, to) {
  const out = [];
  for (let i = from; i <= to; i++) out.push(String(i));
  return out;
}

function cleanEnv() {
  // Only our own flags: clap reads GAPLESS_* variables as flag values.
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('GAPLESS_')));
  env.RUST_LOG ??= 'warn';
  return env;
}

const live = new Set();
function killAll() {
  for (const child of live) {
    try { child.kill('SIGKILL'); } catch { /* already gone */ }
  }
}
process.on('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => { killAll(); process.exit(130); });
}

/**
 * One gapless server "slot": a fixed port and data dir; start() runs a new process on them,
 * kill9() drops it (and every connection it holds) at once, term() stops it cleanly.
 */
export class Gapless {
  constructor({ port, dataDir, memory = false, retryMs = 200, extraArgs = [] }) {
    this.bin = gaplessBin();
    this.port = port;
    this.dataDir = dataDir;
    this.memory = memory;
    this.retryMs = retryMs;
    this.extraArgs = extraArgs;
    this.child = null;
    this.log = [];
    this.starts = 0;
    this.base = `http://127.0.0.1:${port}`;
  }

  /**
   * Starts a server on a free port with a temp data dir named `prefix…` (removed by stop()).
   * `retryMs` is 100 unless given (the SDK's tests reconnect often).
   */
  static async create(opts = {}, prefix = 'gapless-test-') {
    const dataDir = tempDir(prefix);
    const srv = new Gapless({ port: await freePort(), dataDir, retryMs: 100, ...opts });
    await srv.start();
    return srv;
  }

  args() {
    const a = ['serve', '--listen', `127.0.0.1:${this.port}`, '--data-dir', this.dataDir,
      '--retry-ms', String(this.retryMs), ...this.extraArgs];
    if (this.memory) a.push('--memory');
    return a;
  }

  async start() {
    // The port was in use a moment ago (by our previous incarnation): retry a bind failure briefly.
    let lastErr;
    for (let attempt = 0; attempt < 20; attempt++) {
      try {
        await this.#startOnce();
        return;
      } catch (err) {
        lastErr = err;
        await sleep(100);
      }
    }
    throw lastErr;
  }

  async #startOnce() {
    const n = ++this.starts;
    const child = spawn(this.bin, this.args(), { cwd: this.dataDir, env: cleanEnv(), stdio: ['ignore', 'pipe', 'pipe'] });
    live.add(child);
    child.once('exit', () => live.delete(child));
    let out = '';
    const tag = (s) => `[gapless#${n}] ${s}`;
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (d) => this.log.push(tag(d.trimEnd())));
    child.stdout.setEncoding('utf8');
    const ready = new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`gapless did not report listening within 15 s; stdout: ${out}`)), 15_000);
      child.stdout.on('data', (d) => {
        out += d;
        this.log.push(tag(d.trimEnd()));
        if (out.includes('gapless listening on')) { clearTimeout(timer); resolve(); }
      });
      child.once('exit', (code, sig) => {
        clearTimeout(timer);
        reject(new Error(`gapless exited before listening (code ${code}, signal ${sig}):\n${this.log.slice(-10).join('\n')}`));
      });
    });
    try {
      await ready;
    } catch (err) {
      child.kill('SIGKILL');
      throw err;
    }
    this.child = child;
  }

  /** kill -9: the kernel closes every connection the server held. */
  async kill9() {
    await this.#signal('SIGKILL');
  }

  /** SIGTERM: the server ends its streams cleanly (WebSocket 1001) and exits; its exit `{code, signal}`. */
  async term() {
    return this.#signal('SIGTERM');
  }

  async #signal(sig) {
    const child = this.child;
    this.child = null;
    if (!child || child.exitCode !== null || child.signalCode !== null) return undefined;
    const exited = once(child, 'exit');
    child.kill(sig);
    const [code, signal] = await exited;
    return { code, signal };
  }

  /** kill -9, then removes the data dir. */
  async stop() {
    await this.kill9();
    fs.rmSync(this.dataDir, { recursive: true, force: true });
  }

  async publish(channel, data) {
    const res = await fetch(`${this.base}/v1/channels/${encodeURIComponent(channel)}/events`, {
      method: 'POST',
      body: String(data),
    });
    const body = await res.text();
    if (res.status !== 201) throw new Error(`publish ${data} to ${channel}: ${res.status} ${body}`);
    return JSON.parse(body);
  }

  /** Appends `datas` atomically, in order, with one request (POST .../batch). */
  async publishBatch(channel, datas) {
    const res = await fetch(`${this.base}/v1/channels/${encodeURIComponent(channel)}/batch`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(datas.map((d) => ({ data: String(d) }))),
    });
    const body = await res.text();
    if (res.status !== 201) throw new Error(`batch publish to ${channel}: ${res.status} ${body}`);
    return JSON.parse(body);
  }

  async channel(channel) {
    const res = await fetch(`${this.base}/v1/channels/${encodeURIComponent(channel)}`);
    const body = await res.text();
    if (res.status !== 200) throw new Error(`GET channel ${channel}: ${res.status} ${body}`);
    return JSON.parse(body);
  }
}

const b64url = (b) => Buffer.from(b).toString('base64url');

/** An HS256 JWT signed with `secret` (the claims are given as they are). */
export function mintToken(secret, claims) {
  const head = b64url(JSON.stringify({ alg: 'HS256', typ: 'JWT' }));
  const body = b64url(JSON.stringify(claims));
  const sig = crypto.createHmac('sha256', secret).update(`${head}.${body}`).digest('base64url');
  return `${head}.${body}.${sig}`;
}

/** Collects `n` updates from an async iterator, failing after `timeoutMs`. */
export async function take(iter, n, timeoutMs = 15_000, describe) {
  const out = [];
  const deadline = Date.now() + timeoutMs;
  while (out.length < n) {
    const left = deadline - Date.now();
    let timer;
    const r = await Promise.race([
      iter.next(),
      new Promise((_, rej) => { timer = setTimeout(() => rej(new Error(`timed out after ${timeoutMs} ms with ${out.length} of ${n}: ${describe ? describe(out) : JSON.stringify(out.slice(-3))}`)), Math.max(0, left)); }),
    ]).finally(() => clearTimeout(timer));
    if (r.done) throw new Error(`the stream ended after ${out.length} of ${n}`);
    out.push(r.value);
  }
  return out;
}

/**
 * Headless Chromium with a fresh profile (a temp dir named `prefix…`), through
 * playwright-core's `chromium` (the caller's import); `ignoreHTTPSErrors` accepts
 * self-signed certificates. Returns `{ context, close }`; close() also removes the profile.
 */
export async function launchChromium(chromium, { prefix = 'gapless-chromium-', ignoreHTTPSErrors = false } = {}) {
  if (!fs.existsSync(CHROMIUM)) {
    throw new Error(`${CHROMIUM} not found: install Debian's chromium (scripts/browser-test.sh does)`);
  }
  const userDataDir = tempDir(prefix);
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
    ignoreHTTPSErrors,
    timeout: 30_000,
  });
  return {
    context,
    async close() {
      await context.close().catch(() => {});
      fs.rmSync(userDataDir, { recursive: true, force: true });
    },
  };
}
