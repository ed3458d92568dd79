// Real-browser test: headless Chromium's own EventSource against gapless while
// the server is killed (kill -9, so the server side drops the connection) and
// restarted. The page must show every published event exactly once and in
// order, with no gap notice; with the --memory store a restart must instead
// show exactly one honest `gap` notice with reason `epoch`.
//
// Run: scripts/browser-test.sh (installs chromium and node_modules), or
//   cd tests/browser && npm ci && GAPLESS_BIN=../../target/debug/gapless node --test eventsource.test.mjs

import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  browserSuite, openSubscriber, range, sleep, waitFor,
} from './harness.mjs';

const suite = browserSuite({ prefix: 'gapless-browser-' });
const newServer = suite.newServer;

function describer(srv, sub) {
  return async () => {
    const shown = await sub.shown().catch((e) => `<${e.message}>`);
    const state = await sub.state().catch((e) => `<${e.message}>`);
    return [
      `page shows (${shown.length}): ${JSON.stringify(shown)}`,
      `page state: ${JSON.stringify(state)}`,
      ...sub.consoleLines.slice(-10),
      ...srv.log.slice(-10),
    ].join('\n');
  };
}

/** Opens the page on CH and waits until the browser's subscription is live on the server. */
async function subscribe(srv, channel) {
  const sub = await openSubscriber(suite.browser.context, suite.pageServer.url, `${srv.base}/v1/channels/${channel}/sse`);
  const describe = describer(srv, sub);
  await waitFor('the EventSource to open', async () => (await sub.state()).opens >= 1, { describe });
  await waitFor('the server to count the subscriber', async () => (await srv.channel(channel)).subscribers === 1, { describe });
  return { sub, describe };
}

/** Waits until the page shows at least `expected.length` events, then requires exactly `expected`. */
async function expectShown(sub, expected, describe) {
  await waitFor(`the page to show ${expected.length} events`, async () => (await sub.shown()).length >= expected.length, { describe });
  assert.deepEqual(await sub.shown(), expected, await describe());
}

async function publishRange(srv, channel, from, to) {
  for (let i = from; i <= to; i++) await srv.publish(channel, i);
}

async function waitForReconnect(srv, channel, sub, opensBefore, describe) {
  await waitFor('the EventSource to reconnect', async () => {
    const st = await sub.state();
    return st.opens > opensBefore && st.readyState === 1;
  }, { describe });
  await waitFor('the server to count the resubscribed browser', async () => (await srv.channel(channel)).subscribers === 1, { describe });
}

test('durable store: three server-side drops and restarts; every event exactly once, in order, no gap', async (t) => {
  const channel = 'browser-durable';
  const srv = await newServer({ retryMs: 200 });
  const { sub, describe } = await subscribe(srv, channel);

  // Live delivery.
  await publishRange(srv, channel, 1, 10);
  await expectShown(sub, range(1, 10), describe);

  // Drop 1: an idle stream. kill -9 and stay down for a while, so the browser's reconnect
  // attempts meet a refused connection (it must keep trying); then restart on the same port
  // and data dir and publish at once.
  let opens = (await sub.state()).opens;
  await srv.kill9();
  const errorsAtKill = (await sub.state()).errors;
  await sleep(700);
  const failedAttempts = (await sub.state()).errors - errorsAtKill;
  t.diagnostic(`drop 1: ${failedAttempts} error events while the server was down`);
  await srv.start();
  await publishRange(srv, channel, 11, 20);
  await waitForReconnect(srv, channel, sub, opens, describe);
  await expectShown(sub, range(1, 20), describe);

  // Drop 2: killed right after a publish burst (single publishes, then one 500-event batch),
  // as soon as the batch is acknowledged.
  opens = (await sub.state()).opens;
  await publishRange(srv, channel, 21, 40);
  const batch = await srv.publishBatch(channel, range(41, 540));
  assert.equal(batch.last_seq, 540);
  await srv.kill9();
  t.diagnostic(`drop 2: the page showed ${(await sub.shown()).length} of 540 events right after the server died`);
  await srv.start();
  await waitForReconnect(srv, channel, sub, opens, describe);
  await publishRange(srv, channel, 541, 550);
  await expectShown(sub, range(1, 550), describe);

  // Drop 3: killed in the middle of a publish burst. A publisher loop runs until its first
  // failure; the kill lands once the page has shown some of the burst. The publish in flight
  // at the kill may or may not have been committed, so the expected list is 1..head as the
  // restarted server reports it (data i is always seq i: one sequential publisher).
  opens = (await sub.state()).opens;
  let acked = 550;
  let publishError = null;
  const publisher = (async () => {
    for (let i = 551; i <= 5000; i++) {
      try { await srv.publish(channel, i); } catch (err) { publishError = err; return; }
      acked = i;
    }
  })();
  await waitFor('the page to show part of the burst', async () => (await sub.shown()).length >= 600, {
    describe: async () => `publisher: ${acked} acknowledged, error ${publishError?.message}\n${await describe()}`,
  });
  await srv.kill9();
  await publisher;
  t.diagnostic(`drop 3: killed after ${acked} acknowledged publishes; the page showed ${(await sub.shown()).length}`);
  assert.ok(acked < 5000, 'the kill should land mid-burst');
  await srv.start();
  const { head } = await srv.channel(channel);
  assert.ok(head === acked || head === acked + 1, `head ${head} after the restart; ${acked} acknowledged`);
  await waitForReconnect(srv, channel, sub, opens, describe);
  await publishRange(srv, channel, head + 1, head + 10);
  const total = head + 10;
  await expectShown(sub, range(1, total), describe);

  // Nothing late: no duplicate trickles in, and no gap notice ever arrived.
  await sleep(400);
  assert.deepEqual(await sub.shown(), range(1, total), await describe());
  const st = await sub.state();
  assert.deepEqual(st.gaps, [], `unexpected gap notices: ${JSON.stringify(st.gaps)}`);
  assert.ok(st.opens >= 4, `expected at least 4 opens (1 + 3 reconnects), got ${st.opens}`);
  await sub.page.close();
});

test('durable store: events published while the browser is disconnected arrive exactly once', async (t) => {
  const channel = 'browser-offline';
  // A 1.5 s retry delay gives a wide, deterministic window in which the server is back up but
  // the browser has not reconnected yet.
  const srv = await newServer({ retryMs: 1500 });
  const { sub, describe } = await subscribe(srv, channel);

  await publishRange(srv, channel, 1, 5);
  await expectShown(sub, range(1, 5), describe);

  const opens = (await sub.state()).opens;
  await srv.kill9();
  const killedAt = Date.now();
  await waitFor('the browser to notice the drop', async () => (await sub.state()).readyState === 0, { describe });
  await srv.start();
  await publishRange(srv, channel, 6, 25);
  // Proof that all of 6..25 were published while the browser had no connection.
  const info = await srv.channel(channel);
  t.diagnostic(`restart and 20 publishes took ${Date.now() - killedAt} ms of the ${srv.retryMs} ms retry delay`);
  assert.equal(info.subscribers, 0, `the browser reconnected too early to test offline publishes; ${await describe()}`);
  assert.equal(info.head, 25);
  assert.deepEqual(await sub.shown(), range(1, 5), 'nothing can arrive while disconnected');

  await waitForReconnect(srv, channel, sub, opens, describe);
  await expectShown(sub, range(1, 25), describe);
  await publishRange(srv, channel, 26, 30);
  await expectShown(sub, range(1, 30), describe);

  await sleep(400);
  assert.deepEqual(await sub.shown(), range(1, 30), await describe());
  assert.deepEqual((await sub.state()).gaps, []);
  await sub.page.close();
});

test('memory store restarted: the browser gets exactly one gap notice with reason epoch', async () => {
  const channel = 'browser-memory';
  const srv = await newServer({ memory: true, retryMs: 200 });
  const { sub, describe } = await subscribe(srv, channel);

  await publishRange(srv, channel, 1, 5);
  await expectShown(sub, range(1, 5), describe);

  const opens = (await sub.state()).opens;
  await srv.kill9();
  await srv.start(); // a new in-memory journal: a new epoch, history gone
  await waitForReconnect(srv, channel, sub, opens, describe);
  await waitFor('a gap notice', async () => (await sub.state()).gaps.length >= 1, { describe });

  // After the gap the stream is live at the new head: new events arrive as usual.
  await publishRange(srv, channel, 6, 10);
  await expectShown(sub, range(1, 10), describe);

  await sleep(400);
  const st = await sub.state();
  assert.equal(st.gaps.length, 1, `expected exactly one gap notice: ${JSON.stringify(st.gaps)}`);
  const [gap] = st.gaps;
  assert.equal(gap.reason, 'epoch', JSON.stringify(gap));
  assert.equal(gap.channel, channel);
  assert.equal(typeof gap.after, 'string', 'an epoch gap names the cursor it could not serve');
  assert.equal(typeof gap.next, 'string');
  assert.deepEqual(await sub.shown(), range(1, 10), await describe());
  await sub.page.close();
});
