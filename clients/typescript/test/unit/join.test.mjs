// The join's tip filter with frames forced into every window of the join, as the Rust SDK's
// tests do it (crates/gapless/tests/it/client_join.rs): a phase hook publishes at every boundary
// (before the stream opens, after it registered, between history pages, after the tip, during
// the drain), against the real binary; and a scripted fake server that puts already-seen seqs
// into the stream's buffer, a gap notice on the stream, and a 410 in history.

import assert from 'node:assert/strict';
import http from 'node:http';
import { once } from 'node:events';
import { after, test } from 'node:test';
import { Client } from '../../dist/index.js';
import { Gapless, take } from '../harness.mjs';

const cleanups = [];
after(async () => {
  for (const fn of cleanups) await fn();
});

test('publishes in every window of the join are delivered once, in order', async () => {
  const srv = await Gapless.create({ memory: true });
  cleanups.push(() => srv.stop());
  const c = new Client(srv.base);
  for (let i = 1; i <= 5; i++) await c.publish('w', `pre${i}`);
  const phases = [];
  let budget = 60;
  const join = c.join('w', {
    pageSize: 2,
    phaseHook: async (p) => {
      phases.push(p);
      const n = { beforeLive: 2, liveOpen: 2, page: 1, drain: 1, following: 0 }[p.phase];
      for (let i = 0; i < n && budget > 0; i++) {
        budget--;
        await c.publish('w', `${p.phase}#${i}`);
      }
    },
  });
  const it = join[Symbol.asyncIterator]();
  const got = [];
  while (!phases.some((p) => p.phase === 'following')) got.push(...(await take(it, 1)));
  const published = 60 - budget;
  await c.publish('w', 'end');
  while (got.at(-1)?.data !== 'end') got.push(...(await take(it, 1)));
  const seqs = got.map((u) => u.seq);
  assert.deepEqual(seqs, Array.from({ length: 5 + published + 1 }, (_, i) => i + 1), 'each seq once, in order');
  const history = [];
  for await (const page of c.historyAll('w')) history.push(...page.events.map((e) => `${e.seq}:${e.data}`));
  assert.deepEqual(got.map((u) => `${u.seq}:${u.data}`), history, 'the same events as history');
  const saw = (f) => phases.some(f);
  assert.ok(saw((p) => p.phase === 'beforeLive'));
  assert.ok(saw((p) => p.phase === 'liveOpen'));
  assert.ok(saw((p) => p.phase === 'page' && !p.done), 'between pages');
  assert.ok(saw((p) => p.phase === 'page' && p.done), 'after the tip');
  assert.ok(saw((p) => p.phase === 'drain'), `during the drain: ${JSON.stringify(phases)}`);
  join.close();
});

const env = (seq, data, channel = 'c') => JSON.stringify({ channel, seq, type: null, data, time: 1 });
const frame = (id, seq, data) => `id: ${id}\ndata: ${env(seq, data)}\n\n`;

/** A scripted server: `routes(req, res, url)` answers; returns its base URL. */
async function fakeServer(routes) {
  const sockets = new Set();
  const srv = http.createServer((req, res) => routes(req, res, new URL(req.url, 'http://x')));
  srv.on('connection', (s) => { sockets.add(s); s.on('close', () => sockets.delete(s)); });
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  cleanups.push(async () => {
    for (const s of sockets) s.destroy();
    await new Promise((r) => srv.close(r));
  });
  return `http://127.0.0.1:${srv.address().port}`;
}

const json = (res, status, body) => {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
};
const page = (events, next, done, head) => ({
  channel: 'c', epoch: '0000000000000001', floor: 1, head, done, next,
  events: events.map(([seq, data]) => ({ seq, cursor: `H${seq}`, type: null, data, time: 1 })),
});

test('the tip filter drops buffered durable frames at or below the tip, never ephemerals', async () => {
  const base = await fakeServer((req, res, url) => {
    if (url.pathname === '/v1/channels/c/sse') {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      // Preamble, then frames the stream buffers while history is read: 3 and 4 are also in
      // history (below the tip), the ephemeral is not filterable, 5 is past the tip.
      res.write(`retry: 100\n\nid: L2\n\n${frame('L3', 3, 'three')}${frame('L4', 4, 'four')}`
        + `data: ${JSON.stringify({ channel: 'c', seq: null, type: null, data: 'typing', time: 1 })}\n\n${frame('L5', 5, 'five')}`);
      return; // held open
    }
    if (url.pathname === '/v1/channels/c/events') {
      const after = url.searchParams.get('after');
      if (after === null) return json(res, 200, page([[1, 'one'], [2, 'two']], 'H2', false, 4));
      if (after === 'H2') return json(res, 200, page([[3, 'three'], [4, 'four']], 'H4', true, 4));
    }
    json(res, 404, { error: 'not_found', message: url.pathname });
  });
  const join = new Client(base).join('c', { pageSize: 2 });
  const got = await take(join[Symbol.asyncIterator](), 6);
  assert.deepEqual(got.map((u) => `${u.kind}:${u.data}`), [
    'event:one', 'event:two', 'event:three', 'event:four', 'ephemeral:typing', 'event:five',
  ]);
  assert.equal(join.cursor, 'L5');
  join.close();
});

test('a gap notice on the stream makes the join ask history, and a 410 becomes a gap update', async () => {
  let sse = 0;
  const afters = [];
  const base = await fakeServer((req, res, url) => {
    if (url.pathname === '/v1/channels/c/sse') {
      sse++;
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('retry: 100\n\nid: L1\n\n');
      // After the first walk, the stream says the reader fell behind retention.
      setTimeout(() => res.write(`event: gap\ndata: ${JSON.stringify({ channel: 'c', after: 'L1', next: 'L50', reason: 'evicted' })}\n\nid: L50\n\n${frame('L51', 51, 'fifty-one')}`), 100);
      return;
    }
    if (url.pathname === '/v1/channels/c/events') {
      const after = url.searchParams.get('after');
      afters.push(after);
      if (after === null) return json(res, 200, page([[1, 'one']], 'H1', true, 1));
      if (after === 'H1') {
        return json(res, 410, { error: 'cursor_not_served', message: 'evicted', reason: 'evicted', floor: 40, floor_cursor: 'F39' });
      }
      if (after === 'F39') return json(res, 200, page([[40, 'forty'], [50, 'fifty']], 'H50', true, 50));
    }
    json(res, 404, { error: 'not_found', message: url.pathname });
  });
  const join = new Client(base).join('c');
  const got = await take(join[Symbol.asyncIterator](), 5);
  assert.deepEqual(got.map((u) => `${u.kind}:${u.seq ?? u.reason}`), ['event:1', 'gap:evicted', 'event:40', 'event:50', 'event:51']);
  const gap = got[1];
  assert.equal(gap.after, 'H1');
  assert.equal(gap.next, 'F39');
  assert.equal(gap.channel, 'c');
  assert.deepEqual(afters, [null, 'H1', 'F39']);
  assert.equal(sse, 1, 'the stream stayed open across the re-walk');
  join.close();
});
