// The console page (GET /, served by gapless itself) in headless Chromium:
// follow a channel, publish from the page and from outside, see every event
// with its seq; kill -9 and restart the server: the page resumes with no
// missing and no repeated seq and shows the reconnect and its resume point;
// read a history page. Saves a screenshot to target/browser-artifacts/console.png.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { browserSuite, waitFor } from './harness.mjs';

const suite = browserSuite({ page: false, prefix: 'gapless-console-' });

test('the console follows a channel, publishes, survives a restart with no missing seq, reads history', async () => {
  const srv = await suite.newServer();

  const page = await suite.browser.context.newPage();
  const lines = [];
  page.on('console', (m) => lines.push(`[console.${m.type()}] ${m.text()}`));
  page.on('pageerror', (e) => lines.push(`[pageerror] ${e.message}`));
  await page.goto(`${srv.base}/`);
  assert.equal(await page.title(), 'gapless console');
  const seqs = () => page.$$eval('#timeline tr[data-kind="event"]', (trs) => trs.map((tr) => Number(tr.dataset.seq)));
  const describe = async () => [
    `seqs: ${JSON.stringify(await seqs().catch(() => []))}`,
    `status: ${await page.textContent('#status').catch(() => '?')}`,
    ...lines.slice(-10), ...srv.log.slice(-10),
  ].join('\n');

  await page.click('#follow');
  await waitFor('the stream to open', async () => (await page.textContent('#status')) === 'open', { describe });
  await waitFor('the server to count the subscriber', async () => (await srv.channel('demo')).subscribers === 1, { describe });

  // Published from the page, then from outside.
  for (const d of ['one', 'two', 'three']) {
    await page.fill('#pub-data', d);
    await page.click('#publish');
    await waitFor(`the publish of ${d} to be answered`, async () => /published: seq/.test(await page.textContent('#pub-result')), { describe });
    await page.evaluate(() => { document.getElementById('pub-result').textContent = ''; });
  }
  await srv.publish('demo', 'four');
  await srv.publish('demo', 'five');
  await waitFor('five events on the page', async () => (await seqs()).length >= 5, { describe });
  assert.deepEqual(await seqs(), [1, 2, 3, 4, 5], await describe());

  // kill -9, restart, publish while the page reconnects.
  await srv.kill9();
  await srv.start();
  for (const d of ['six', 'seven', 'eight']) await srv.publish('demo', d);
  await waitFor('eight events on the page', async () => (await seqs()).length >= 8, { describe, timeoutMs: 20_000 });
  assert.deepEqual(await seqs(), [1, 2, 3, 4, 5, 6, 7, 8], `every seq once, in order\n${await describe()}`);
  assert.ok(Number(await page.textContent('#reconnects')) >= 1, await describe());
  const resumed = await page.$$eval('#timeline tr[data-kind="conn"]', (trs) => trs.map((tr) => tr.textContent));
  assert.ok(resumed.some((t) => t.includes('resumed after cursor')), `the timeline shows the resume point: ${resumed}`);
  assert.equal(await page.textContent('#gaps'), '0');

  // A history page.
  await page.click('#history');
  await waitFor('a history page', async () => /8 event\(s\)/.test(await page.textContent('#hist-result')), { describe });
  const hist = await page.$$eval('#timeline tr[data-kind="history"]', (trs) => trs.length);
  assert.equal(hist, 8);

  const dir = path.resolve(import.meta.dirname, '..', '..', 'target', 'browser-artifacts');
  fs.mkdirSync(dir, { recursive: true });
  const shot = path.join(dir, 'console.png');
  await page.screenshot({ path: shot, fullPage: true });
  assert.ok(fs.statSync(shot).size > 10_000, 'a screenshot was saved');
  await page.close();
});

test('--console false serves no page', async () => {
  const srv = await suite.newServer({ memory: true, extraArgs: ['--console', 'false'] });
  const res = await fetch(`${srv.base}/`);
  assert.equal(res.status, 404);
  assert.equal((await res.json()).error, 'not_found');
});
