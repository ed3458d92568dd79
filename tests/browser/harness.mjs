// Helpers for the real-browser tests: run a gapless server that can be killed
// and restarted on the same port, serve a tiny page from its own origin, and
// drive Debian's Chromium with playwright-core.

import { spawn } from 'node:child_process';
import { once } from 'node:events';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { chromium } from 'playwright-core';

export { sleep };

export const CHROMIUM = process.env.CHROMIUM_BIN || '/usr/bin/chromium';

/** Absolute path of the gapless binary: $GAPLESS_BIN, else <repo>/target/debug/gapless. */
export function gaplessBin() {
  const repo = path.resolve(import.meta.dirname ?? path.dirname(new URL(import.meta.url).pathname), '..', '..');
  const bin = path.resolve(repo, process.env.GAPLESS_BIN || 'target/debug/gapless');
  if (!fs.existsSync(bin)) {
    throw new Error(`gapless binary not found at ${bin} (build it with: cargo build -p gapless, or set GAPLESS_BIN)`);
  }
  return bin;
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
export async function waitFor(what, fn, { timeoutMs = 10_000, intervalMs = 25, describe } = {}) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    last = await fn();
    if (last) return last;
    if (Date.now() > deadline) {
      const detail = describe ? `\n${await describe()}` : '';
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${detail}`);
    }
    await sleep(intervalMs);
  }
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
 * One gapless server "slot": a fixed port and data dir; start() runs a new
 * process on them, kill9() drops it (and every connection it holds) at once.
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
    // Only our own flags: drop any GAPLESS_* from the environment (clap reads them as flag values).
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('GAPLESS_')));
    env.RUST_LOG ??= 'warn';
    const child = spawn(this.bin, this.args(), { cwd: this.dataDir, env, stdio: ['ignore', 'pipe', 'pipe'] });
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

  /** kill -9: the server's side of every connection is closed by the kernel. */
  async kill9() {
    const child = this.child;
    this.child = null;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = once(child, 'exit');
    child.kill('SIGKILL');
    await exited;
  }

  async stop() {
    await this.kill9();
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

// The page: a plain EventSource that renders each event's data as a list item
// and records gap notices, opens and errors. Nothing in it retries or dedups:
// all of that is the browser's own EventSource and the server.
const PAGE = `<!doctype html>
<html><head><meta charset="utf-8"><title>gapless EventSource</title></head>
<body>
<p>state: <span id="state">new</span>, opens: <span id="opens">0</span>, errors: <span id="errors">0</span></p>
<h2>events</h2><ol id="events"></ol>
<h2>gaps</h2><ol id="gaps"></ol>
<script>
  window.log = { opens: 0, errors: 0, gaps: [], ids: [] };
  const $ = (id) => document.getElementById(id);
  const states = ['connecting', 'open', 'closed'];
  window.subscribe = (url) => {
    const es = new EventSource(url);
    window.es = es;
    const show = () => { $('state').textContent = states[es.readyState]; };
    es.onopen = () => { log.opens++; $('opens').textContent = log.opens; show(); };
    es.onerror = () => { log.errors++; $('errors').textContent = log.errors; show(); };
    es.onmessage = (e) => {
      const li = document.createElement('li');
      li.textContent = e.data;
      $('events').appendChild(li);
      log.ids.push(e.lastEventId);
    };
    es.addEventListener('gap', (e) => {
      log.gaps.push(JSON.parse(e.data));
      const li = document.createElement('li');
      li.textContent = e.data;
      $('gaps').appendChild(li);
    });
  };
</script>
</body></html>`;

/** Serves PAGE over HTTP on its own port, so the EventSource is a real cross-origin request. */
export async function startPageServer() {
  const srv = http.createServer((req, res) => {
    if (req.url === '/favicon.ico') { res.writeHead(204); res.end(); return; }
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
    res.end(PAGE);
  });
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  return { url: `http://127.0.0.1:${srv.address().port}/`, close: () => new Promise((r) => srv.close(r)) };
}

/** Headless Chromium in a fresh profile; `ignoreHTTPSErrors` accepts self-signed certificates. */
export async function launchBrowser({ ignoreHTTPSErrors = false } = {}) {
  if (!fs.existsSync(CHROMIUM)) {
    throw new Error(`${CHROMIUM} not found: install Debian's chromium (scripts/browser-test.sh does)`);
  }
  const userDataDir = tempDir('gapless-chromium-');
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

/** Opens the page and subscribes it to `sseUrl`; returns helpers to read what it shows. */
export async function openSubscriber(context, pageUrl, sseUrl) {
  const page = await context.newPage();
  const consoleLines = [];
  page.on('console', (m) => consoleLines.push(`[console.${m.type()}] ${m.text()}`));
  page.on('pageerror', (e) => consoleLines.push(`[pageerror] ${e.message}`));
  await page.goto(pageUrl);
  await page.evaluate((u) => window.subscribe(u), sseUrl);
  return {
    page,
    consoleLines,
    /** The event data the page shows, in the order shown. */
    shown: () => page.$$eval('#events li', (lis) => lis.map((li) => li.textContent)),
    state: () => page.evaluate(() => ({
      readyState: window.es.readyState,
      opens: window.log.opens,
      errors: window.log.errors,
      gaps: window.log.gaps,
      lastIds: window.log.ids.slice(-3),
    })),
  };
}

export function range(from, to) {
  const out = [];
  for (let i = from; i <= to; i++) out.push(String(i));
  return out;
}
