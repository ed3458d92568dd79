// The SDK in a real headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core),
// through the example page examples/browser/ (served with the built SDK from its own origin,
// so every request to gapless is a real cross-origin one): kill -9 and restart mid-stream
// with publishes while away over fetch streaming, the native EventSource and WebSocket; a
// page reload that resumes from localStorage with no loss and no repeat; a --memory restart
// that shows exactly one epoch gap.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { chromium } from 'playwright-core';
import { startExampleServer } from '../../../../examples/browser/serve.mjs';
import { Client } from '../../dist/index.js';
import { Gapless, launchChromium, mintToken, range, sleep, supportsJwt, waitFor } from '../harness.mjs';

let browser;
let context;
let example;
const servers = [];

before(async () => {
  example = await startExampleServer();
  browser = await launchChromium(chromium, { prefix: 'gapless-ts-chromium-' });
  context = browser.context;
});

after(async () => {
  await browser?.close();
  await example?.close();
  for (const s of servers) await s.stop();
});

async function server(opts) {
  const s = await Gapless.create(opts);
  servers.push(s);
  return s;
}

/** Opens the example page on `channel`; returns helpers to read what it shows. */
async function openExample(srv, channel, params = {}) {
  const page = await context.newPage();
  const logs = [];
  page.on('console', (m) => logs.push(`[console.${m.type()}] ${m.text()}`));
  page.on('pageerror', (e) => logs.push(`[pageerror] ${e.message}`));
  const q = new URLSearchParams({ server: srv.base, channel, ...params });
  const url = `${example.url}?${q}`;
  await page.goto(url);
  const view = {
    page,
    url,
    shown: () => page.evaluate(() => window.example.events.map((e) => e.data)),
    seqs: () => page.evaluate(() => window.example.events.map((e) => e.seq)),
    gaps: () => page.evaluate(() => window.example.gaps),
    errors: () => page.evaluate(() => window.example.errors),
    describe: async () => [
      `page shows: ${JSON.stringify(await view.shown().catch((e) => e.message))}`,
      `gaps: ${JSON.stringify(await view.gaps().catch((e) => e.message))}`,
      `errors: ${JSON.stringify(await view.errors().catch((e) => e.message))}`,
      ...logs.slice(-10),
      ...srv.log.slice(-10),
    ].join('\n'),
  };
  await waitFor('the page to subscribe', async () => (await srv.channel(channel)).subscribers === 1, { describe: view.describe });
  return view;
}

async function expectShown(view, expected) {
  await waitFor(`the page to show ${expected.length} events`, async () => (await view.shown()).length >= expected.length, {
    describe: view.describe, timeoutMs: 15_000,
  });
  assert.deepEqual(await view.shown(), expected, await view.describe());
}

async function publishRange(c, channel, from, to) {
  for (let i = from; i <= to; i++) await c.publish(channel, String(i));
}

for (const [name, params] of [
  ['fetch streaming', { transport: 'sse', sse: 'fetch' }],
  ['native EventSource', { transport: 'sse', sse: 'eventsource' }],
  ['WebSocket', { transport: 'ws' }],
]) {
  test(`chromium, ${name}: kill -9 and restart mid-stream, publishes while away: every event once, in order`, async () => {
    const srv = await server({ retryMs: 200 });
    const c = new Client(srv.base);
    const channel = `br-${params.transport}-${params.sse ?? 'ws'}`;
    const view = await openExample(srv, channel, params);
    await publishRange(c, channel, 1, 10);
    await expectShown(view, range(1, 10));

    // Down for a while (reconnect attempts fail), then back, with publishes right away.
    await srv.kill9();
    await sleep(500);
    await srv.start();
    await publishRange(c, channel, 11, 30);
    await expectShown(view, range(1, 30));

    // Killed right after a 300-event batch is acknowledged.
    await c.publishBatch(channel, range(31, 330));
    await srv.kill9();
    await srv.start();
    await publishRange(c, channel, 331, 340);
    await expectShown(view, range(1, 340));
    await sleep(300);
    assert.deepEqual(await view.shown(), range(1, 340), 'nothing late, no duplicate');
    assert.deepEqual(await view.gaps(), []);
    assert.deepEqual(await view.seqs(), range(1, 340).map(Number));
    await view.page.close();
  });
}

test('chromium: a page reload resumes from the localStorage cursor with no loss and no repeat', async () => {
  const srv = await server({ retryMs: 200 });
  const c = new Client(srv.base);
  const channel = 'br-reload';
  const view = await openExample(srv, channel);
  await publishRange(c, channel, 1, 10);
  await expectShown(view, range(1, 10));
  // The page goes away; events are published while no page is there; the page comes back.
  await view.page.goto('about:blank');
  await waitFor('the server to drop the old stream', async () => (await srv.channel(channel)).subscribers === 0);
  await publishRange(c, channel, 11, 20);
  await view.page.goto(view.url);
  await waitFor('the reloaded page to subscribe', async () => (await srv.channel(channel)).subscribers === 1, { describe: view.describe });
  await publishRange(c, channel, 21, 25);
  await expectShown(view, range(11, 25));
  // A plain reload while the server is down: the new page starts from the stored cursor
  // (after 25) as soon as the server is back, whatever was published before it reconnected.
  await srv.kill9();
  await view.page.reload();
  await srv.start();
  await publishRange(c, channel, 26, 30);
  await expectShown(view, range(26, 30));
  await sleep(300);
  assert.deepEqual(await view.shown(), range(26, 30), 'no repeat of 11..25, no loss of 26..30');
  assert.deepEqual(await view.gaps(), []);
  await view.page.close();
});

test('chromium: a --memory restart shows exactly one epoch gap, then the new journal', async () => {
  const srv = await server({ memory: true, retryMs: 200 });
  const c = new Client(srv.base);
  const channel = 'br-memory';
  const view = await openExample(srv, channel);
  await publishRange(c, channel, 1, 5);
  await expectShown(view, range(1, 5));
  await srv.kill9();
  await srv.start();
  await waitFor('the page to come back', async () => (await srv.channel(channel)).subscribers === 1, { describe: view.describe });
  await publishRange(c, channel, 1, 3);
  await expectShown(view, [...range(1, 5), ...range(1, 3)]);
  const gaps = await view.gaps();
  assert.equal(gaps.length, 1, await view.describe());
  assert.equal(gaps[0].reason, 'epoch');
  assert.ok(gaps[0].next);
  // The page refetched the channel's state on the gap: the new incarnation.
  await waitFor('the refetched state', async () => (await view.page.evaluate(() => window.example.channelState)) !== null);
  const state = await view.page.evaluate(() => window.example.channelState);
  assert.ok(state.head >= 0 && typeof state.epoch === 'string', JSON.stringify(state));
  assert.match(await view.page.textContent('#gaps'), /epoch/);
  await view.page.close();
});

const SECRET = 'gapless-ts-browser-secret-of-32-bytes!';
const jwtSkip = supportsJwt() ? false : 'server without --jwt-secret';
if (jwtSkip) console.log('skipped: server without --jwt-secret (chromium token tests)');

for (const [name, opts] of [
  ['fetch streaming (Authorization header, CORS preflight)', { transport: 'sse', sse: 'fetch' }],
  ['native EventSource (access_token query)', { transport: 'sse', sse: 'eventsource' }],
  ['WebSocket (access_token query)', { transport: 'ws' }],
]) {
  test(`chromium, ${name}: tokens that expire mid-stream are renewed by getToken; every event once`, { skip: jwtSkip }, async () => {
    const origin = example.url.replace(/\/$/, '');
    const srv = await server({ retryMs: 200, extraArgs: ['--jwt-secret', SECRET, '--jwt-leeway-ms', '0', '--cors-origin', origin] });
    const channel = `br-auth-${opts.transport}-${opts.sse ?? 'ws'}`;
    const mint = (grants, ttl) => mintToken(SECRET, { exp: Math.floor(Date.now() / 1000) + ttl, sub: 'browser', gapless: grants });
    const admin = new Client(srv.base, { token: mint({ publish: ['*'], subscribe: ['*'] }, 600) });
    const page = await context.newPage();
    let minted = 0;
    await page.exposeFunction('mintToken', () => {
      minted++;
      return mint({ subscribe: [channel] }, 2);
    });
    // A document of the example server's origin (a route-fulfilled page would have no
    // address, and Chromium's local network access checks would then refuse loopback calls).
    await page.goto(`${example.url}sdk/index.js`);
    await page.evaluate(async ({ base, channel, opts }) => {
      const { Client } = await import('/sdk/index.js');
      const c = new Client(base, { getToken: () => window.mintToken(), backoff: { initialMs: 100 } });
      window.got = [];
      window.errs = [];
      const sub = c.subscribe(channel, opts);
      sub.on('event', (e) => window.got.push(e.data));
      sub.on('error', (e) => window.errs.push(`${e.code}: ${e.message}`));
    }, { base: srv.base, channel, opts });
    const describe = async () => `got ${JSON.stringify(await page.evaluate(() => window.got))}, errors ${JSON.stringify(await page.evaluate(() => window.errs))}, minted ${minted}\n${srv.log.slice(-5).join('\n')}`;
    await waitFor('the page to subscribe', async () => (await admin.channel(channel)).subscribers === 1, { describe });
    for (let i = 1; i <= 40; i++) {
      await admin.publish(channel, String(i));
      await sleep(100); // 4 s: every 2 s token expires at least once
    }
    await waitFor('40 events', async () => (await page.evaluate(() => window.got.length)) >= 40, { describe, timeoutMs: 15_000 });
    await sleep(200);
    assert.deepEqual(await page.evaluate(() => window.got), range(1, 40), await describe());
    assert.deepEqual(await page.evaluate(() => window.errs), []);
    assert.ok(minted >= 2, `getToken called ${minted} times`);
    await page.close();
  });
}

/** A page of the example server's origin with the SDK loaded as `window.sdk`. */
async function sdkPage() {
  const page = await context.newPage();
  const logs = [];
  page.on('pageerror', (e) => logs.push(`[pageerror] ${e.message}`));
  await page.goto(`${example.url}sdk/index.js`);
  await page.evaluate(async () => { window.sdk = await import('/sdk/index.js'); });
  return { page, logs };
}

test('chromium: join under a concurrent publisher, every seq once, in order', async () => {
  const srv = await server({ memory: true });
  const c = new Client(srv.base);
  const channel = 'br-join';
  for (let i = 1; i <= 30; i++) await c.publish(channel, String(i));
  const { page } = await sdkPage();
  let published = 30;
  let stop = false;
  const publisher = (async () => {
    while (!stop && published < 1500) {
      await c.publish(channel, String(published + 1));
      published++;
    }
  })();
  await page.evaluate(({ base, channel }) => {
    const client = new window.sdk.Client(base);
    window.got = [];
    window.errs = [];
    const join = client.join(channel, { pageSize: 10 });
    join.on('update', (u) => window.got.push(u.kind === 'event' ? u.seq : u.kind));
    join.on('error', (e) => window.errs.push(e.code));
  }, { base: srv.base, channel });
  await waitFor('the join to deliver 200', async () => (await page.evaluate(() => window.got.length)) >= 200);
  stop = true;
  await publisher;
  await c.publish(channel, 'end');
  published++;
  await waitFor(`${published} updates`, async () => (await page.evaluate(() => window.got.length)) >= published, { timeoutMs: 15_000 });
  await sleep(200);
  const got = await page.evaluate(() => window.got);
  assert.deepEqual(got, Array.from({ length: published }, (_, i) => i + 1));
  assert.deepEqual(await page.evaluate(() => window.errs), []);
  await page.close();
});

test('chromium: a session consumer resumed with lastSeq across kill -9 gets every event once, then the end', async () => {
  const srv = await server({ retryMs: 200 });
  const c = new Client(srv.base);
  const { id } = await c.createSession();
  const { page } = await sdkPage();
  await page.evaluate(({ base, id }) => {
    const client = new window.sdk.Client(base, { backoff: { initialMs: 100, maxMs: 1000 } });
    window.got = [];
    window.errs = [];
    const consumer = client.attachSession(id, { lastSeq: 1 });
    consumer.on('update', (u) => window.got.push(u.kind === 'event' ? `${u.seq}:${u.data}` : u.kind));
    consumer.on('error', (e) => window.errs.push(e.code));
  }, { base: srv.base, id });
  await waitFor('the consumer to attach', async () => (await c.sessionInfo(id)).attached);
  for (let i = 1; i <= 5; i++) await c.appendSession(id, `e${i}`);
  await waitFor('5 events', async () => (await page.evaluate(() => window.got.length)) >= 6);
  await srv.kill9();
  await srv.start();
  for (let i = 6; i <= 10; i++) await c.appendSession(id, `e${i}`);
  await waitFor('the consumer to re-attach', async () => (await c.sessionInfo(id)).attached, { timeoutMs: 15_000 });
  await c.completeSession(id);
  await waitFor('the end', async () => (await page.evaluate(() => window.got)).includes('completed'), { timeoutMs: 15_000 });
  const got = await page.evaluate(() => window.got);
  const events = got.filter((x) => x.includes(':'));
  assert.deepEqual(events, Array.from({ length: 10 }, (_, i) => `${i + 2}:e${i + 1}`), JSON.stringify(got));
  assert.equal(got.filter((x) => x === 'resumed').length, 2, 'the first attach and the re-attach each resume');
  assert.equal(got.at(-1), 'completed');
  assert.deepEqual(await page.evaluate(() => window.errs), []);
  await page.close();
});
