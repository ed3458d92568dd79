// Authorization, against scripted servers (node:http for SSE and HTTP, the `ws` package's
// server for WebSocket) that speak the refusals and expiry frames the real server is getting:
// 401/403/429 bodies, `event: gapless.expired`, WebSocket close 4401 "token expired", a
// forbidden subscribe, session 4401/4403. Also: the cursor a subscription resumes from is the
// last one delivered, never one received but still queued.

import assert from 'node:assert/strict';
import http from 'node:http';
import { once } from 'node:events';
import { after, test } from 'node:test';
import { WebSocket, WebSocketServer } from 'ws';
import { Client, GaplessError, memoryStore } from '../../dist/index.js';
import { take } from '../harness.mjs';

const cleanups = [];
after(async () => {
  for (const fn of cleanups) await fn();
});

/** An HTTP server with `routes`, and optionally a WebSocket server `onWs(ws, req, url)` on it. */
async function fakeServer(routes, onWs) {
  const sockets = new Set();
  const srv = http.createServer((req, res) => routes(req, res, new URL(req.url, 'http://x')));
  srv.on('connection', (s) => { sockets.add(s); s.on('close', () => sockets.delete(s)); });
  let wss;
  if (onWs) {
    wss = new WebSocketServer({ server: srv, handleProtocols: (ps) => (ps.has('gapless.v1') ? 'gapless.v1' : false) });
    wss.on('connection', (ws, req) => onWs(ws, req, new URL(req.url, 'http://x')));
  }
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  cleanups.push(async () => {
    wss?.clients.forEach((c) => c.terminate());
    wss?.close();
    for (const s of sockets) s.destroy();
    await new Promise((r) => srv.close(r));
  });
  return `http://127.0.0.1:${srv.address().port}`;
}

const json = (res, status, body, headers = {}) => {
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  res.end(JSON.stringify(body));
};
const env = (seq, data) => JSON.stringify({ channel: 'c', seq, type: null, data, time: 1 });
const frame = (id, seq, data) => `id: ${id}\ndata: ${env(seq, data)}\n\n`;
const EXPIRED = `event: gapless.expired\ndata: ${JSON.stringify({ error: 'token_expired', message: 'the token expired' })}\n\n`;
const unauthorized = (res) => json(res, 401, { error: 'unauthorized', message: 'bad token' }, { 'www-authenticate': 'Bearer' });
const bearer = (req) => (req.headers.authorization ?? '').replace(/^Bearer /, '');

test('sse: gapless.expired makes the subscription ask getToken and resume from the last delivered cursor', async () => {
  const seen = [];
  const base = await fakeServer((req, res, url) => {
    if (url.pathname !== '/v1/channels/c/sse') return json(res, 404, { error: 'not_found', message: '' });
    seen.push({ token: bearer(req), lastEventId: req.headers['last-event-id'] ?? null });
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    if (bearer(req) === 't1') res.end(`retry: 50\n\nid: C0\n\n${frame('C1', 1, 'one')}${frame('C2', 2, 'two')}${EXPIRED}`);
    else if (bearer(req) === 't2') res.write(`retry: 50\n\nid: C2\n\n${frame('C3', 3, 'three')}`);
    else unauthorized(res);
  });
  let calls = 0;
  const tokens = ['t1', 't2'];
  const c = new Client(base, { token: 'unused', getToken: async () => tokens[calls++] });
  const sub = c.subscribe('c', { cursor: 'C0' });
  const got = await take(sub[Symbol.asyncIterator](), 3);
  assert.deepEqual(got.map((u) => u.data), ['one', 'two', 'three'], 'no loss, no repeat');
  assert.equal(calls, 2, 'getToken before the first connect and after the expiry');
  assert.deepEqual(seen, [{ token: 't1', lastEventId: 'C0' }, { token: 't2', lastEventId: 'C2' }]);
  sub.close();
});

test('sse: without getToken an expiry ends the subscription with a typed token_expired error', async () => {
  const base = await fakeServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.end(`id: C0\n\n${frame('C1', 1, 'one')}${EXPIRED}`);
  });
  const sub = new Client(base, { token: 'fixed' }).subscribe('c');
  const it = sub[Symbol.asyncIterator]();
  assert.equal((await it.next()).value.data, 'one', 'events before the expiry are delivered');
  await assert.rejects(it.next(), (e) => e instanceof GaplessError && e.code === 'token_expired' && e.status === 401 && e.message === 'the token expired');
});

test('sse: a 401 on reconnect asks getToken once more, then surfaces the error', async () => {
  let connects = 0;
  const base = await fakeServer((req, res) => {
    connects++;
    if (connects === 1) {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      return res.end(`id: C0\n\n${frame('C1', 1, 'one')}${EXPIRED}`);
    }
    unauthorized(res);
  });
  let calls = 0;
  const sub = new Client(base, { getToken: () => `t${++calls}`, backoff: { initialMs: 10 } }).subscribe('c');
  const it = sub[Symbol.asyncIterator]();
  assert.equal((await it.next()).value.data, 'one');
  await assert.rejects(it.next(), (e) => e.code === 'unauthorized' && e.status === 401 && e.message === 'bad token');
  assert.equal(calls, 3, 'first connect, after the expiry, and once more after the 401');
  assert.equal(connects, 3);
});

test('http: a 401 refreshes the token once; 403 and 429 are typed, with Retry-After', async () => {
  const base = await fakeServer((req, res, url) => {
    if (url.pathname === '/v1/channels/ok/events') {
      if (bearer(req) !== 'fresh') return unauthorized(res);
      return json(res, 201, { channel: 'ok', seq: 1, cursor: 'K1' });
    }
    if (url.pathname === '/v1/channels/secret/events') return json(res, 403, { error: 'forbidden', message: 'not yours' });
    if (url.pathname === '/v1/channels/busy/events') return json(res, 429, { error: 'rate_limited', message: 'slow down' }, { 'retry-after': '2' });
    if (url.pathname === '/v1/channels/full/events') return json(res, 503, { error: 'limit_reached', message: 'full' }, { 'retry-after': '1' });
    json(res, 404, { error: 'not_found', message: '' });
  });
  const tokens = ['stale', 'fresh'];
  let calls = 0;
  const c = new Client(base, { getToken: () => tokens[calls++] });
  assert.deepEqual(await c.publish('ok', 'x'), { channel: 'ok', seq: 1, cursor: 'K1', duplicate: false });
  assert.equal(calls, 2);
  assert.deepEqual(await c.publish('ok', 'y').then((p) => p.seq), 1, 'the fresh token is reused');
  assert.equal(calls, 2);
  await assert.rejects(c.publish('secret', 'x'), (e) => e.code === 'forbidden' && e.status === 403 && e.terminal && e.message === 'not yours');
  await assert.rejects(c.publish('busy', 'x'), (e) => e.code === 'rate_limited' && e.status === 429 && e.retryAfterMs === 2000 && !e.terminal);
  await assert.rejects(c.publish('full', 'x'), (e) => e.code === 'limit_reached' && e.status === 503 && e.retryAfterMs === 1000);
  const fixed = new Client(base, { token: 'nope' });
  await assert.rejects(fixed.publish('ok', 'x'), (e) => e.code === 'unauthorized' && e.status === 401);
});

test('sse: 429 on connect waits at least Retry-After, then resumes', async () => {
  const times = [];
  const base = await fakeServer((req, res) => {
    times.push(Date.now());
    if (times.length === 1) return json(res, 429, { error: 'rate_limited', message: 'later' }, { 'retry-after': '1' });
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(`id: C0\n\n${frame('C1', 1, 'one')}`);
  });
  const sub = new Client(base, { backoff: { initialMs: 1 } }).subscribe('c');
  const [u] = await take(sub[Symbol.asyncIterator](), 1);
  assert.equal(u.data, 'one');
  assert.ok(times[1] - times[0] >= 950, `waited ${times[1] - times[0]} ms`);
  sub.close();
});

test('ws: the token goes in access_token; close 4401 "token expired" resumes each channel from its delivered cursor', async () => {
  const seen = [];
  const base = await fakeServer(() => {}, (ws, req, url) => {
    const token = url.searchParams.get('access_token');
    ws.on('message', (m) => {
      const msg = JSON.parse(String(m));
      seen.push({ token, cursor: msg.cursor ?? null, since: msg.since ?? null });
      const ev = (seq) => JSON.stringify({ op: 'event', channel: 'c', seq, cursor: `W${seq}`, type: null, data: `e${seq}`, time: 1 });
      if (token === 't1') {
        ws.send(JSON.stringify({ op: 'subscribed', id: msg.id, channel: 'c', replayed: 0, recovered: false, cursor: 'W0' }));
        ws.send(ev(1));
        ws.send(ev(2));
        ws.close(4401, 'token expired');
      } else {
        ws.send(ev(3));
      }
    });
  });
  const tokens = ['t1', 't2'];
  let calls = 0;
  const c = new Client(base, { WebSocket, getToken: () => tokens[calls++] });
  const sub = c.subscribe('c', { transport: 'ws' });
  const got = await take(sub[Symbol.asyncIterator](), 3);
  assert.deepEqual(got.map((u) => u.data), ['e1', 'e2', 'e3']);
  assert.deepEqual(seen, [{ token: 't1', cursor: null, since: 'live' }, { token: 't2', cursor: 'W2', since: null }]);
  sub.close();
});

test('ws: a forbidden subscribe and a 4401 without getToken are typed terminal errors', async () => {
  const base = await fakeServer(() => {}, (ws, req, url) => {
    if (url.searchParams.get('access_token') === 'expired') return ws.close(4401, 'token expired');
    if (url.searchParams.get('access_token')?.startsWith('bad')) {
      // As the server refuses a token: one error message, then close 4401.
      ws.send(JSON.stringify({ op: 'error', code: 'unauthorized', message: 'invalid token: bad signature' }));
      return ws.close(4401, 'unauthorized');
    }
    ws.on('message', (m) => {
      const msg = JSON.parse(String(m));
      ws.send(JSON.stringify({ op: 'error', id: msg.id, code: 'forbidden', message: 'not allowed to subscribe to c' }));
    });
  });
  const sub = new Client(base, { WebSocket, token: 'x' }).subscribe('c', { transport: 'ws' });
  await assert.rejects(sub[Symbol.asyncIterator]().next(), (e) => e.code === 'forbidden' && e.status === 403 && e.terminal && /not allowed/.test(e.message));
  const sub2 = new Client(base, { WebSocket, token: 'expired' }).subscribe('c', { transport: 'ws' });
  await assert.rejects(sub2[Symbol.asyncIterator]().next(), (e) => e.code === 'token_expired' && e.closeCode === 4401 && e.status === 401);
  let calls = 0;
  const sub3 = new Client(base, { WebSocket, getToken: () => `bad${++calls}`, backoff: { initialMs: 1 } }).subscribe('c', { transport: 'ws' });
  await assert.rejects(sub3[Symbol.asyncIterator]().next(),
    (e) => e.code === 'unauthorized' && e.closeCode === 4401 && e.message === 'invalid token: bad signature');
  assert.equal(calls, 2, 'a refused token: getToken once more, then the error');
});

test('sessions: 4401 re-attaches with a fresh token from the last delivered seq; 4403 is terminal', async () => {
  const attaches = [];
  const base = await fakeServer((req, res, url) => {
    if (url.pathname === '/v1/sessions/s1') return json(res, 200, { id: 's1', status: 'open', head: 1, attached: false });
    json(res, 404, { error: 'session_not_found', message: '' });
  }, (ws, req, url) => {
    const token = url.searchParams.get('access_token');
    attaches.push({ token, lastSeq: url.searchParams.get('last_seq'), takeover: url.searchParams.get('takeover') });
    const ev = (seq) => JSON.stringify({ op: 'event', session: 's1', seq, type: null, data: `s${seq}`, time: 1 });
    if (url.pathname === '/v1/sessions/s2/ws') {
      ws.send(JSON.stringify({ op: 'error', code: 'forbidden', message: 'not your session' }));
      return ws.close(4403, 'forbidden');
    }
    if (attaches.length === 1) {
      ws.send(ev(2));
      ws.send(ev(3));
      ws.close(4401, 'token expired');
    } else {
      ws.send(JSON.stringify({ op: 'session.resumed', session: 's1', replayed_events: 0 }));
      ws.send(ev(4));
      ws.send(JSON.stringify({ op: 'session.completed', session: 's1', seq: 5 }));
      ws.close(1000);
    }
  });
  let calls = 0;
  const c = new Client(base, { WebSocket, getToken: () => `t${++calls}` });
  const got = [];
  for await (const u of c.attachSession('s1')) got.push(u);
  assert.deepEqual(got.map((u) => u.kind + (u.seq ?? '')), ['event2', 'event3', 'resumed', 'event4', 'completed5']);
  assert.equal(attaches.length, 2);
  // The first attach is live (the session's head, 1, is read first as the re-attach anchor);
  // the re-attach resumes after the last delivered seq, takes over, with a fresh token.
  assert.deepEqual(attaches.map((a) => [a.lastSeq, a.takeover]), [[null, null], ['3', 'true']]);
  assert.notEqual(attaches[1].token, attaches[0].token);
  assert.equal(attaches[1].token, `t${calls}`, 'the newest token');
  await assert.rejects(async () => {
    for await (const u of c.attachSession('s2', { lastSeq: 1 })) assert.fail(JSON.stringify(u));
  }, (e) => e.code === 'forbidden' && e.closeCode === 4403 && e.status === 403 && e.message === 'not your session');
});

test('a subscription resumes from the last delivered cursor, never one received but not yet delivered', async () => {
  const seen = [];
  const base = await fakeServer((req, res) => {
    seen.push(req.headers['last-event-id'] ?? null);
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    if (seen.length === 1) res.write(`id: C0\n\n${frame('C1', 1, 'one')}${frame('C2', 2, 'two')}${frame('C3', 3, 'three')}`);
    else res.write(`id: ${seen.at(-1)}\n\n`);
  });
  const store = memoryStore();
  const c = new Client(base, { store });
  const s1 = c.subscribe('c');
  const [one] = await take(s1[Symbol.asyncIterator](), 1);
  assert.equal(one.data, 'one');
  assert.equal(s1.cursor, 'C1');
  assert.equal(store.map.get('sse:c'), 'C1', 'two and three were received, not delivered');
  s1.close();
  const s2 = c.subscribe('c');
  const it = s2[Symbol.asyncIterator]();
  const pending = it.next();
  await new Promise((r) => setTimeout(r, 200));
  assert.deepEqual(seen, [null, 'C1']);
  s2.close();
  assert.equal((await pending).done, true);
});

test('sse: the native EventSource mode puts the token in access_token and the cursor in last_event_id', async () => {
  const urls = [];
  class FakeEventSource extends EventTarget {
    constructor(url, init) {
      super();
      urls.push({ url, withCredentials: init?.withCredentials });
      this.readyState = 0;
      setTimeout(() => {
        const e = new Event('message');
        e.data = env(1, 'one');
        e.lastEventId = 'C1';
        this.dispatchEvent(e);
      }, 5);
    }
    close() { this.readyState = 2; }
  }
  const c = new Client('http://127.0.0.1:9', { EventSource: FakeEventSource, token: 'tok', withCredentials: true });
  const sub = c.subscribe(['a', 'b c'], { sse: 'eventsource', cursor: 'C0' });
  const [u] = await take(sub[Symbol.asyncIterator](), 1);
  assert.equal(u.data, 'one');
  assert.equal(u.cursor, 'C1');
  sub.close();
  const url = new URL(urls[0].url);
  assert.equal(url.pathname, '/v1/sse');
  assert.deepEqual(url.searchParams.getAll('channel'), ['a', 'b c']);
  assert.equal(url.searchParams.get('format'), 'envelope');
  assert.equal(url.searchParams.get('last_event_id'), 'C0');
  assert.equal(url.searchParams.get('access_token'), 'tok');
  assert.equal(urls[0].withCredentials, true);
});

test('join: an expired stream is reopened with a fresh token and the join goes on from its applied cursor', async () => {
  const sse = [];
  const afters = [];
  const base = await fakeServer((req, res, url) => {
    if (url.pathname === '/v1/channels/c/sse') {
      sse.push(bearer(req));
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      if (sse.length === 1) {
        res.write('id: L0\n\n');
        setTimeout(() => res.end(`${frame('L1', 1, 'one')}${EXPIRED}`), 150);
      } else {
        res.write(`id: L1\n\n`);
        setTimeout(() => res.write(frame('L2', 2, 'two')), 150);
      }
      return;
    }
    if (url.pathname === '/v1/channels/c/events') {
      const after = url.searchParams.get('after');
      afters.push(after);
      if (after === null) return json(res, 200, { channel: 'c', epoch: 'e', floor: 1, head: 0, events: [], next: 'H0', done: true });
      return json(res, 200, { channel: 'c', epoch: 'e', floor: 1, head: 1, events: [], next: 'H1', done: true });
    }
    json(res, 404, { error: 'not_found', message: '' });
  });
  let calls = 0;
  const join = new Client(base, { getToken: () => `t${++calls}` }).join('c');
  const got = await take(join[Symbol.asyncIterator](), 2);
  assert.deepEqual(got.map((u) => `${u.seq}:${u.data}`), ['1:one', '2:two']);
  assert.deepEqual(afters, [null, 'L1'], 'the second walk starts at the applied cursor');
  assert.equal(sse.length, 2);
  assert.notEqual(sse[1], sse[0], 'a fresh token for the new stream');
  join.close();
});
