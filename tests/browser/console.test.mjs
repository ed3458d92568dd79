// The console page (GET /, served by gapless itself) in headless Chromium:
// follow a channel, publish typed and untyped events from the page and from
// outside, see every event with its seq and type; kill -9 and restart the
// server: the page resumes with no missing and no repeated seq and shows the
// reconnect and its resume point; page through history, told apart from live
// rows; a token that expires: the page stops, and with a fresh token follows
// again from its last cursor, every seq once and in order.
// Saves a screenshot to target/browser-artifacts/console.png.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { browserSuite, mintToken, waitFor } from './harness.mjs';

const suite = browserSuite({ page: false, prefix: 'gapless-console-' });
const SECRET = 'a-browser-test-secret-long-enough-32';

/** Publishes `data` to `channel` with an optional type and token; returns the answer. */
async function publish(srv, channel, data, { type, token } = {}) {
  const q = type ? `?type=${encodeURIComponent(type)}` : '';
  const res = await fetch(`${srv.base}/v1/channels/${channel}/events${q}`, {
    method: 'POST', body: data, headers: token ? { authorization: `Bearer ${token}` } : {},
  });
  const body = await res.text();
  assert.equal(res.status, 201, body);
  return JSON.parse(body);
}

/** Readers of the page's timeline: the seqs and types of live event rows, of history rows. */
function timeline(page) {
  const rows = (kind) => page.$$eval(`#timeline tr[data-kind="${kind}"]`, (trs) => trs.map((tr) => ({
    seq: Number(tr.dataset.seq),
    via: tr.querySelector('td.via')?.textContent ?? '',
    type: tr.cells[tr.cells.length - 2].textContent,
    data: tr.cells[tr.cells.length - 1].textContent,
  })));
  return {
    seqs: async () => (await rows('event')).map((r) => r.seq),
    live: () => rows('event'),
    history: () => rows('history'),
  };
}

test('the console follows a channel, publishes, survives a restart with no missing seq, reads history', async () => {
  const srv = await suite.newServer();

  const page = await suite.browser.context.newPage();
  const lines = [];
  page.on('console', (m) => lines.push(`[console.${m.type()}] ${m.text()}`));
  page.on('pageerror', (e) => lines.push(`[pageerror] ${e.message}`));
  await page.goto(`${srv.base}/`);
  assert.equal(await page.title(), 'gapless console');
  const { seqs, live, history } = timeline(page);
  const describe = async () => [
    `seqs: ${JSON.stringify(await seqs().catch(() => []))}`,
    `status: ${await page.textContent('#status').catch(() => '?')}`,
    ...lines.slice(-10), ...srv.log.slice(-10),
  ].join('\n');

  await page.click('#follow');
  await waitFor('the stream to open', async () => (await page.textContent('#status')) === 'open', { describe });
  await waitFor('the server to count the subscriber', async () => (await srv.channel('demo')).subscribers === 1, { describe });

  // Published from the page, then from outside; typed and untyped.
  for (const [d, type] of [['one', ''], ['two', 'quote'], ['three', '']]) {
    await page.fill('#pub-data', d);
    await page.fill('#pub-type', type);
    await page.click('#publish');
    await waitFor(`the publish of ${d} to be answered`, async () => /published: seq/.test(await page.textContent('#pub-result')), { describe });
    await page.evaluate(() => { document.getElementById('pub-result').textContent = ''; });
  }
  await publish(srv, 'demo', 'four', { type: 'quote' });
  await srv.publish('demo', 'five');
  await waitFor('five events on the page', async () => (await seqs()).length >= 5, { describe });
  assert.deepEqual(await seqs(), [1, 2, 3, 4, 5], await describe());
  assert.deepEqual((await live()).map((r) => [r.via, r.type, r.data]), [
    ['live', '', 'one'], ['live', 'quote', 'two'], ['live', '', 'three'], ['live', 'quote', 'four'], ['live', '', 'five'],
  ]);
  assert.equal(await page.textContent('#count'), '5');

  // kill -9, restart, publish while the page reconnects.
  await srv.kill9();
  await srv.start();
  await publish(srv, 'demo', 'six', { type: 'quote' });
  for (const d of ['seven', 'eight']) await srv.publish('demo', d);
  await waitFor('eight events on the page', async () => (await seqs()).length >= 8, { describe, timeoutMs: 20_000 });
  assert.deepEqual(await seqs(), [1, 2, 3, 4, 5, 6, 7, 8], `every seq once, in order\n${await describe()}`);
  assert.ok(Number(await page.textContent('#reconnects')) >= 1, await describe());
  const resumed = await page.$$eval('#timeline tr[data-kind="conn"]', (trs) => trs.map((tr) => tr.textContent));
  assert.ok(resumed.some((t) => t.includes('resumed after cursor')), `the timeline shows the resume point: ${resumed}`);
  assert.equal(await page.textContent('#gaps'), '0');

  assert.equal(await page.textContent('#count'), '8');

  // History, three events a page: 3, 3, then the last 2; rows marked history, not live.
  await page.fill('#hist-limit', '3');
  await page.click('#history');
  await waitFor('history page 1', async () => /^page 1: 3 event\(s\), seq 1 to 3/.test(await page.textContent('#hist-result')), { describe });
  await page.click('#history-next');
  await waitFor('history page 2', async () => /^page 2: 3 event\(s\), seq 4 to 6/.test(await page.textContent('#hist-result')), { describe });
  await page.click('#history-next');
  await waitFor('history page 3', async () => /^page 3: 2 event\(s\), seq 7 to 8.*the last page/.test(await page.textContent('#hist-result')), { describe });
  const hist = await history();
  assert.deepEqual(hist.map((r) => r.seq), [1, 2, 3, 4, 5, 6, 7, 8]);
  assert.ok(hist.every((r) => r.via === 'history'), JSON.stringify(hist));
  assert.deepEqual(hist.filter((r) => r.type === 'quote').map((r) => r.seq), [2, 4, 6]);
  // The live rows are still the stream's, each once.
  assert.deepEqual(await seqs(), [1, 2, 3, 4, 5, 6, 7, 8]);

  const dir = path.resolve(import.meta.dirname, '..', '..', 'target', 'browser-artifacts');
  fs.mkdirSync(dir, { recursive: true });
  const shot = path.join(dir, 'console.png');
  await page.screenshot({ path: shot, fullPage: true });
  assert.ok(fs.statSync(shot).size > 10_000, 'a screenshot was saved');
  await page.close();
});

test('after a token expires the console follows again from its last cursor with a fresh token', async () => {
  const srv = await suite.newServer({ memory: true, extraArgs: ['--jwt-secret', SECRET, '--jwt-leeway-ms', '0'] });
  const tokenFor = (ttlS) => mintToken(SECRET, {
    exp: Math.floor(Date.now() / 1000) + ttlS, gapless: { subscribe: ['demo'], publish: ['demo'] },
  });
  const writer = tokenFor(3600);
  const page = await suite.browser.context.newPage();
  const lines = [];
  page.on('pageerror', (e) => lines.push(`[pageerror] ${e.message}`));
  await page.goto(`${srv.base}/`);
  const { seqs, live } = timeline(page);
  const describe = async () => [
    `seqs: ${JSON.stringify(await seqs().catch(() => []))}`,
    `status: ${await page.textContent('#status').catch(() => '?')}`,
    ...lines.slice(-10), ...srv.log.slice(-10),
  ].join('\n');

  // Expires in 3 to 4 s (whole seconds).
  await page.fill('#token', tokenFor(4));
  await page.click('#follow');
  await waitFor('the stream to open', async () => (await page.textContent('#status')) === 'open', { describe });
  await publish(srv, 'demo', 'a', { token: writer });
  await publish(srv, 'demo', 'b', { token: writer, type: 'quote' });
  await waitFor('the page to say the token expired', async () => (await page.textContent('#status')) === 'expired', { describe, timeoutMs: 15_000 });

  // Published while the page is stopped: it reads them when it follows again.
  await publish(srv, 'demo', 'c', { token: writer, type: 'quote' });
  await publish(srv, 'demo', 'd', { token: writer });
  await page.fill('#token', tokenFor(3600));
  await page.click('#follow');
  await waitFor('the stream to open again', async () => (await page.textContent('#status')) === 'open', { describe });
  await publish(srv, 'demo', 'e', { token: writer, type: 'quote' });
  await waitFor('five events on the page', async () => (await seqs()).length >= 5, { describe });
  assert.deepEqual(await seqs(), [1, 2, 3, 4, 5], `every seq once, in order\n${await describe()}`);
  assert.deepEqual((await live()).map((r) => r.data), ['a', 'b', 'c', 'd', 'e']);
  assert.equal(await page.textContent('#gaps'), '0');
  const conn = await page.$$eval('#timeline tr[data-kind="conn"]', (trs) => trs.map((tr) => tr.textContent));
  assert.ok(conn.some((t) => t.includes('the token expired')), conn.join('\n'));
  assert.ok(conn.some((t) => t.includes('again after cursor')), conn.join('\n'));
  await page.close();
});

test('the console starts with the last 10 retained events when asked (since=last:10)', async () => {
  const srv = await suite.newServer({ memory: true });
  for (let i = 1; i <= 12; i++) await srv.publish('recent', `r${i}`);
  const page = await suite.browser.context.newPage();
  await page.goto(`${srv.base}/`);
  const { seqs } = timeline(page);
  await page.fill('#channels', 'recent');
  await page.selectOption('#since', 'last:10');
  await page.click('#follow');
  await waitFor('ten events on the page', async () => (await seqs()).length >= 10);
  await srv.publish('recent', 'r13');
  await waitFor('the live one after them', async () => (await seqs()).length >= 11);
  assert.deepEqual(await seqs(), [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]);
  await page.close();
});

test('a refused Follow shows the server\'s own message, and the page has its icon', async () => {
  const srv = await suite.newServer({ memory: true, extraArgs: ['--jwt-secret', SECRET] });
  const page = await suite.browser.context.newPage();
  const icons = [];
  page.on('response', (r) => { if (r.url().endsWith('/favicon.ico')) icons.push(r.status()); });
  await page.goto(`${srv.base}/`);
  await page.fill('#channels', 'demo');
  await page.click('#follow');
  const conn = () => page.$$eval('#timeline tr[data-kind="conn"]', (trs) => trs.map((tr) => tr.textContent));
  await waitFor('the refusal on the page', async () => (await conn()).some((t) => t.includes('refused the stream')), {
    describe: async () => (await conn()).join('\n'),
  });
  const refusal = (await conn()).find((t) => t.includes('refused the stream'));
  assert.ok(refusal.includes('401 unauthorized') && refusal.includes('requires a token'), refusal);
  const res = await fetch(`${srv.base}/favicon.ico`);
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('content-type'), 'image/svg+xml');
  assert.match(await res.text(), /^<svg /);
  assert.ok(!icons.includes(404), `icon requests: ${icons}`);
  await page.close();
});

test('--console false serves no page', async () => {
  const srv = await suite.newServer({ memory: true, extraArgs: ['--console', 'false'] });
  const res = await fetch(`${srv.base}/`);
  assert.equal(res.status, 404);
  assert.equal((await res.json()).error, 'not_found');
});
