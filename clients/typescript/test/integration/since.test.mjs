// Start positions through the SDK against the real gapless binary ($GAPLESS_BIN): `since`
// `"last:N"` / `{ last }` and `"time:UNIX_MS"` / `{ time }` on subscriptions (SSE over fetch,
// WebSocket) and history pages; a time before the floor gives an `evicted` gap first (on a
// page: its `gap`); a value the server refuses ends the subscription with a terminal
// `invalid_request`.

import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { WebSocket } from 'ws';
import { Client, GaplessError } from '../../dist/index.js';
import { Gapless, sleep, take } from '../harness.mjs';

const servers = [];
after(async () => {
  for (const s of servers) await s.stop();
});

async function server() {
  const s = await Gapless.create({ memory: true, extraArgs: ['--retention-events', '4'] });
  servers.push(s);
  return s;
}

function client(srv) {
  return new Client(srv.base, { WebSocket, backoff: { initialMs: 100, maxMs: 1000 } });
}

/** Publishes `prefix1..prefixN` 15 ms apart (each its own time); returns their times. */
async function publishApart(c, channel, prefix, n) {
  for (let i = 1; i <= n; i++) {
    await c.publish(channel, `${prefix}${i}`);
    await sleep(15);
  }
  return (await c.history(channel, { limit: 1000 })).events.map((e) => e.time);
}

const datas = (us) => us.map((u) => (u.kind === 'event' ? u.data : u.kind));

for (const transport of ['sse', 'ws']) {
  test(`${transport}: since last:N, { last }, time and { time }, then live`, async () => {
    const srv = await server();
    const c = client(srv);
    const ch = `s-${transport}`;
    const t = await publishApart(c, ch, 'a', 3);
    for (const since of ['last:2', { last: 2 }, `time:${t[0] + 1}`, { time: new Date(t[0] + 1) }, { time: t[1] }]) {
      const sub = c.subscribe(ch, { transport, since, store: null });
      const it = sub[Symbol.asyncIterator]();
      assert.deepEqual(datas(await take(it, 2)), ['a2', 'a3'], JSON.stringify(since));
      sub.close();
    }
    // After the head: live only.
    const sub = c.subscribe(ch, { transport, since: { time: t[2] + 1 }, store: null });
    const it = sub[Symbol.asyncIterator]();
    const first = it.next();
    await sleep(300);
    await c.publish(ch, 'a4');
    assert.deepEqual(datas([(await first).value]), ['a4']);
    sub.close();
  });

  test(`${transport}: since a time before the floor: an evicted gap, then the floor`, async () => {
    const srv = await server();
    const c = client(srv);
    const ch = `f-${transport}`;
    for (let i = 1; i <= 6; i++) await c.publish(ch, `b${i}`);
    const sub = c.subscribe(ch, { transport, since: { time: 0 }, store: null });
    const it = sub[Symbol.asyncIterator]();
    const got = await take(it, 5);
    assert.equal(got[0].kind, 'gap');
    assert.equal(got[0].reason, 'evicted');
    assert.equal(got[0].channel, ch);
    assert.deepEqual(datas(got.slice(1)), ['b3', 'b4', 'b5', 'b6']);
    sub.close();
  });

  test(`${transport}: a since the server refuses ends the subscription with invalid_request`, async () => {
    const srv = await server();
    const c = client(srv);
    for (const since of ['last:0', 'last:1001', { last: 1.5 }, { time: -1 }, { time: new Date(Number.NaN) }]) {
      const it = c.subscribe('r', { transport, since, store: null })[Symbol.asyncIterator]();
      await assert.rejects(take(it, 1, 10_000), (e) => {
        assert.ok(e instanceof GaplessError, String(e));
        assert.equal(e.code, 'invalid_request', `${JSON.stringify(since)}: ${e.message}`);
        assert.equal(e.terminal, true);
        return true;
      });
    }
  });
}

test('history: since last:N, time, live, and the gap of a time before the floor', async () => {
  const srv = await server();
  const c = client(srv);
  const t = await publishApart(c, 'h', 'h', 3);
  const data = (p) => p.events.map((e) => e.data);
  assert.deepEqual(data(await c.history('h', { since: 'last:2' })), ['h2', 'h3']);
  assert.deepEqual(data(await c.history('h', { since: { time: new Date(t[1]) } })), ['h2', 'h3']);
  const live = await c.history('h', { since: 'live' });
  assert.deepEqual([data(live), live.done, live.gap], [[], true, undefined]);
  const pages = [];
  for await (const p of c.historyAll('h', { since: { last: 3 }, limit: 1 })) pages.push(...data(p));
  assert.deepEqual(pages, ['h1', 'h2', 'h3']);
  for (let i = 4; i <= 6; i++) await c.publish('h', `h${i}`);
  const p = await c.history('h', { since: `time:${t[0]}` });
  assert.deepEqual(data(p), ['h3', 'h4', 'h5', 'h6']);
  assert.equal(p.gap?.reason, 'evicted');
  assert.equal(p.gap?.channel, 'h');
  await assert.rejects(c.history('h', { since: 'last:0' }), (e) => e.code === 'invalid_request' && e.status === 400);
});
