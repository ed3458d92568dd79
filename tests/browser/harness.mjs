// Helpers of the real-browser tests: the shared harness (../harness/gapless.mjs: a gapless
// server that can be killed and restarted on the same port, tokens, waits, Chromium), plus a
// tiny page served from its own origin and the EventSource page's readers.

import { once } from 'node:events';
import http from 'node:http';
import { after, before } from 'node:test';
import { chromium } from 'playwright-core';
import { Gapless, launchChromium } from '../harness/gapless.mjs';

export * from '../harness/gapless.mjs';

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

/**
 * Serves `page` (by default the EventSource page above) over HTTP on its own port, so the
 * page's requests to gapless are real cross-origin requests.
 */
export async function startPageServer(page = PAGE) {
  const srv = http.createServer((req, res) => {
    if (req.url === '/favicon.ico') { res.writeHead(204); res.end(); return; }
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
    res.end(page);
  });
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  return { url: `http://127.0.0.1:${srv.address().port}/`, close: () => new Promise((r) => srv.close(r)) };
}

/**
 * Headless Chromium (Debian's) with a fresh profile: `{ context, close }`;
 * `ignoreHTTPSErrors` accepts self-signed certificates.
 */
export function launchBrowser({ ignoreHTTPSErrors = false } = {}) {
  return launchChromium(chromium, { ignoreHTTPSErrors });
}

/**
 * The set-up every browser test file shares: before the tests, Chromium and (unless `page` is
 * false) a page server serving `page` (default: the EventSource page); after them, every
 * server made with `newServer` is stopped (its data dir removed), then the browser and the
 * page server close. Read `browser` and `pageServer` inside tests, once `before` has run.
 */
export function browserSuite({ page, prefix = 'gapless-browser-' } = {}) {
  const suite = {
    browser: null,
    pageServer: null,
    cleanups: [],
    /** A started server (retry 200 ms unless given), stopped after the run. */
    async newServer(opts = {}) {
      const srv = await Gapless.create({ retryMs: 200, ...opts }, prefix);
      suite.cleanups.push(() => srv.stop());
      return srv;
    },
  };
  before(async () => {
    if (page !== false) suite.pageServer = await startPageServer(page);
    suite.browser = await launchBrowser();
  });
  after(async () => {
    for (const fn of suite.cleanups.reverse()) await fn().catch(() => {});
    await suite.browser?.close();
    await suite.pageServer?.close();
  });
  return suite;
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
