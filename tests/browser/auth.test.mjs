// Real-browser tests of authorization and limits (docs/security.md), in
// headless Chromium on a page served from another origin than gapless:
// - a credentialed cross-origin EventSource carries the gapless_token cookie
//   (allowed by --cors-origin), while one without credentials is refused;
// - an EventSource refused at the per-IP connection limit is told to retry
//   (200 + retry:), and once a slot frees it connects and gets the events;
// - a same-origin EventSource on a connection that carried a request before
//   (Chromium reuses it) gets `gapless.expired` when its cookie's token
//   expires, refreshes the cookie, and resumes with every event once.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { browserSuite, mintToken, waitFor } from './harness.mjs';

const SECRET = 'a-browser-test-secret-long-enough-32';

/** An HS256 JWT with gapless rights, valid for `ttlS` seconds. */
function token(subscribe, publish, ttlS = 3600) {
  return mintToken(SECRET, { exp: Math.floor(Date.now() / 1000) + ttlS, gapless: { subscribe, publish } });
}

const suite = browserSuite({ prefix: 'gapless-browser-auth-' });
const newServer = (extraArgs) => suite.newServer({ memory: true, extraArgs });

async function publishAs(srv, t, channel, data) {
  const res = await fetch(`${srv.base}/v1/channels/${channel}/events`, {
    method: 'POST', body: String(data), headers: { authorization: `Bearer ${t}` },
  });
  assert.equal(res.status, 201, await res.text());
}

/** Opens the page and an EventSource on it; returns a reader of what it saw. */
async function follow(url, withCredentials, setCookie) {
  const page = await suite.browser.context.newPage();
  await page.goto(suite.pageServer.url);
  await page.evaluate(([u, creds, cookie]) => {
    if (cookie) document.cookie = cookie;
    window.seen = { data: [], opens: 0, errors: 0 };
    const es = new EventSource(u, { withCredentials: creds });
    window.es2 = es;
    es.onopen = () => { window.seen.opens++; };
    es.onerror = () => { window.seen.errors++; };
    es.onmessage = (e) => window.seen.data.push(e.data);
  }, [url, withCredentials, setCookie]);
  return {
    page,
    seen: () => page.evaluate(() => ({ ...window.seen, readyState: window.es2.readyState })),
  };
}

test('a credentialed cross-origin EventSource carries the token cookie', async () => {
  const pageOrigin = new URL(suite.pageServer.url).origin;
  const srv = await newServer(['--jwt-secret', SECRET, '--cors-origin', pageOrigin]);
  const reader = token(['news'], []);
  const writer = token([], ['news']);
  // The cookie is set by the page (same host, another port: cookies are per host).
  const withCookie = await follow(`${srv.base}/v1/channels/news/sse`, true, `gapless_token=${reader}; path=/`);
  const describe = async () => `${JSON.stringify(await withCookie.seen())}\n${srv.log.slice(-10).join('\n')}`;
  await waitFor('the credentialed EventSource to open', async () => (await withCookie.seen()).opens >= 1, { describe });
  await waitFor('the server to count the subscriber', async () => (await (await fetch(`${srv.base}/v1/channels/news`, { headers: { authorization: `Bearer ${reader}` } })).json()).subscribers === 1, { describe });
  for (const d of ['one', 'two', 'three']) await publishAs(srv, writer, 'news', d);
  await waitFor('three events on the page', async () => (await withCookie.seen()).data.length >= 3, { describe });
  assert.deepEqual((await withCookie.seen()).data, ['one', 'two', 'three']);

  // Without credentials the cookie is not sent: 401, and the EventSource gives up (closed).
  const without = await follow(`${srv.base}/v1/channels/news/sse`, false, null);
  await waitFor('the uncredentialed EventSource to fail', async () => (await without.seen()).readyState === 2, {
    describe: async () => JSON.stringify(await without.seen()),
  });
  assert.equal((await without.seen()).opens, 0);
  await withCookie.page.close();
  await without.page.close();
});

test('an EventSource refused at the per-IP limit retries and then follows', async () => {
  const srv = await newServer(['--max-connections-per-ip', '2']);
  // Node holds both slots with streams of its own.
  const holder = new AbortController();
  for (let i = 0; i < 2; i++) {
    const held = await fetch(`${srv.base}/v1/channels/busy/sse`, { signal: holder.signal });
    assert.equal(held.status, 200);
    await held.body.getReader().read();
  }

  const sub = await follow(`${srv.base}/v1/channels/busy/sse`, false, null);
  const describe = async () => `${JSON.stringify(await sub.seen())}\n${srv.log.slice(-10).join('\n')}`;
  // The busy answer is a 200 event stream that ends: EventSource reconnects, never gives up.
  await waitFor('the refused EventSource to be answered and retry', async () => (await sub.seen()).errors >= 1, { describe });
  const st = await sub.seen();
  assert.notEqual(st.readyState, 2, `still trying: ${JSON.stringify(st)}`);
  holder.abort();
  // One slot for the browser, one for this process's requests.
  await waitFor('the browser to hold a slot', async () => {
    const r = await fetch(`${srv.base}/v1/channels/busy`).catch(() => null);
    return r && r.status === 200 && (await r.json()).subscribers === 1;
  }, { timeoutMs: 20_000, describe });
  // This process may need a new connection for the publish: retry it (same
  // Idempotency-Key, so it lands once) while the address is at its limit.
  await waitFor('the publish to be accepted', async () => {
    const r = await fetch(`${srv.base}/v1/channels/busy/events`, {
      method: 'POST', body: 'through', headers: { 'idempotency-key': 'through-1' },
    }).catch(() => null);
    return r && (r.status === 201 || r.status === 200);
  }, { timeoutMs: 20_000, intervalMs: 200, describe });
  await waitFor('the event on the page', async () => (await sub.seen()).data.includes('through'), { describe });
  await sub.page.close();
});

test('a same-origin EventSource on a reused connection is told its token expired and resumes', async () => {
  const srv = await newServer(['--jwt-secret', SECRET, '--jwt-leeway-ms', '0']);
  const writer = token([], ['news']);
  await publishAs(srv, writer, 'news', 'before');
  const page = await suite.browser.context.newPage();
  // A page of gapless's own origin: the EventSource is same-origin and sends the cookie.
  await page.goto(`${srv.base}/healthz`);
  // Expires in 2 to 3 s (whole seconds).
  const short = token(['news'], [], 3);
  const fresh = token(['news'], []);
  await page.evaluate(async ([shortT, freshT]) => {
    document.cookie = `gapless_token=${shortT}; path=/`;
    // A request first, so the connection is idle in Chromium's pool when the
    // EventSource opens, and carries it as its second request (served by hyper).
    await (await fetch('/healthz')).text();
    window.seen = { data: [], expired: 0, opens: 0, errors: 0 };
    const es = new EventSource('/v1/channels/news/sse?since=earliest');
    window.es2 = es;
    es.onopen = () => { window.seen.opens++; };
    es.onerror = () => { window.seen.errors++; };
    es.onmessage = (e) => window.seen.data.push(e.data);
    es.addEventListener('gapless.expired', () => {
      window.seen.expired++;
      // The EventSource reconnects by itself with the same URL and its
      // Last-Event-ID: a fresh cookie is all it needs.
      document.cookie = `gapless_token=${freshT}; path=/`;
    });
  }, [short, fresh]);
  const seen = () => page.evaluate(() => ({ ...window.seen, readyState: window.es2.readyState }));
  const describe = async () => `${JSON.stringify(await seen())}\n${srv.log.slice(-10).join('\n')}`;
  await waitFor('the EventSource to open', async () => (await seen()).opens >= 1, { describe });
  await publishAs(srv, writer, 'news', 'one');
  await waitFor('gapless.expired on the page', async () => (await seen()).expired >= 1, { timeoutMs: 15_000, describe });
  await waitFor('the EventSource to reopen', async () => (await seen()).opens >= 2, { describe });
  await publishAs(srv, writer, 'news', 'two');
  await waitFor('the event after the refresh', async () => (await seen()).data.includes('two'), { describe });
  const st = await seen();
  assert.deepEqual(st.data, ['before', 'one', 'two'], 'every event once, in order');
  assert.equal(st.expired, 1);
  assert.notEqual(st.readyState, 2, 'still following');
  await page.close();
});
