// Reconnection against scripted SSE servers: a silent stream is dropped after idleTimeoutMs
// and resumed with Last-Event-ID; a clean close reconnects at once, but streams that keep
// closing right after they open wait the server's retry: (jittered); a garbage frame is a
// typed protocol error.

import assert from 'node:assert/strict';
import http from 'node:http';
import { once } from 'node:events';
import { after, test } from 'node:test';
import { Client, GaplessError } from '../../dist/index.js';
import { take } from '../harness.mjs';

const cleanups = [];
after(async () => {
  for (const fn of cleanups) await fn();
});

async function fakeServer(handler) {
  const sockets = new Set();
  const srv = http.createServer(handler);
  srv.on('connection', (s) => { sockets.add(s); s.on('close', () => sockets.delete(s)); });
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  cleanups.push(async () => {
    for (const s of sockets) s.destroy();
    await new Promise((r) => srv.close(r));
  });
  return `http://127.0.0.1:${srv.address().port}`;
}

const frame = (id, seq, data) => `id: ${id}\ndata: ${JSON.stringify({ channel: 'c', seq, type: null, data, time: 1 })}\n\n`;

test('a stream silent past idleTimeoutMs is dropped and resumed from the last delivered cursor', async () => {
  const seen = [];
  const base = await fakeServer((req, res) => {
    seen.push({ at: Date.now(), lastEventId: req.headers['last-event-id'] ?? null });
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    if (seen.length === 1) res.write(`retry: 10\n\nid: C0\n\n${frame('C1', 1, 'one')}`); // then silence
    else res.write(`id: C1\n\n${frame('C2', 2, 'two')}`);
  });
  const sub = new Client(base, { idleTimeoutMs: 300 }).subscribe('c');
  const got = await take(sub[Symbol.asyncIterator](), 2);
  assert.deepEqual(got.map((u) => u.data), ['one', 'two']);
  assert.equal(seen[1].lastEventId, 'C1');
  const silent = seen[1].at - seen[0].at;
  assert.ok(silent >= 280 && silent < 2000, `reconnected after ${silent} ms`);
  sub.close();
});

test('a clean close reconnects at once; streams that close right after opening wait retry:', async () => {
  const at = [];
  const base = await fakeServer((req, res) => {
    at.push(Date.now());
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    // Every stream: retry 200 ms, a position, and an event (the first time), then a clean end.
    res.end(at.length === 1 ? `retry: 200\n\nid: C0\n\n${frame('C1', 1, 'one')}` : `retry: 200\n\nid: C1\n\n`);
  });
  const sub = new Client(base, { backoff: { random: () => 0.999999, maxMs: 5000 } }).subscribe('c');
  const it = sub[Symbol.asyncIterator]();
  const pending = it.next();
  assert.equal((await pending).value.data, 'one');
  const more = it.next(); // keeps the subscription reading (and reconnecting)
  await new Promise((r) => setTimeout(r, 1300));
  sub.close();
  await more;
  const gaps = at.slice(1).map((t, i) => t - at[i]);
  // 1st close: at once. Later ones come right after a quick one: each waits up to retry:
  // (200 ms; the jitter source here draws the ceiling). Every stream sent its position, so
  // the failure count starts over each time, as in the Rust SDK: the wait does not grow.
  assert.ok(gaps[0] < 150, `first reconnect after ${gaps[0]} ms`);
  for (const g of gaps.slice(1)) assert.ok(g >= 180 && g < 600, `a later reconnect after ${g} ms: ${gaps}`);
  assert.ok(at.length >= 4 && at.length <= 8, `${at.length} connections in 1.3 s: no spinning`);
});

test('a frame that is not a gapless envelope ends the subscription with a typed protocol error', async () => {
  const base = await fakeServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write('id: C0\n\nid: C1\ndata: not json\n\n');
  });
  const sub = new Client(base).subscribe('c');
  await assert.rejects(sub[Symbol.asyncIterator]().next(), (e) => e instanceof GaplessError && e.code === 'protocol' && e.terminal);
  const base2 = await fakeServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.end('hello');
  });
  await assert.rejects(new Client(base2).subscribe('c')[Symbol.asyncIterator]().next(), (e) => e.code === 'protocol' && /event stream/.test(e.message));
});
