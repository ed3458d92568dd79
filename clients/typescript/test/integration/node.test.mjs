// The SDK in Node 20 against the real gapless binary ($GAPLESS_BIN) on a free port with a temp
// data dir: subscriptions over SSE (fetch streaming) and WebSocket (the `ws` package) across
// kill -9 and restart, the --memory epoch gap, cursor persistence, the exact join under
// concurrent publishing, sessions resumed across kill -9 and their refusals, typed errors.

import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { WebSocket } from 'ws';
import { Client, GaplessError, fold, memoryStore } from '../../dist/index.js';
import { Gapless, range, sleep, take, waitFor } from '../harness.mjs';

const servers = [];
after(async () => {
  for (const s of servers) await s.stop();
});

async function server(opts) {
  const s = await Gapless.create(opts);
  servers.push(s);
  return s;
}

function client(srv, opts = {}) {
  return new Client(srv.base, { WebSocket, backoff: { initialMs: 100, maxMs: 1000 }, ...opts });
}

async function publishRange(c, channel, from, to) {
  for (let i = from; i <= to; i++) await c.publish(channel, String(i));
}

const datas = (us) => us.filter((u) => u.kind === 'event').map((u) => u.data);

/** Asserts events 1..n exactly once and in order (data i is seq i: one sequential publisher). */
function assertExactlyOnce(updates, n, what) {
  const ev = updates.filter((u) => u.kind === 'event');
  assert.deepEqual(ev.map((u) => u.data), range(1, n), `${what}: data`);
  assert.deepEqual(ev.map((u) => u.seq), range(1, n).map(Number), `${what}: seqs`);
}

for (const transport of ['sse', 'ws']) {
  test(`${transport}: kill -9 and restart mid-stream, publishes while away: every event once, in order`, async (t) => {
    const srv = await server();
    const c = client(srv);
    const channel = `drop-${transport}`;
    const sub = c.subscribe(channel, { transport });
    const it = sub[Symbol.asyncIterator]();
    const first = it.next(); // starts the subscription
    await waitFor('the subscription to register', async () => (await srv.channel(channel)).subscribers === 1);
    await publishRange(c, channel, 1, 10);
    const got = [(await first).value, ...(await take(it, 9))];

    // Drop 1: kill -9 while idle; stay down a while; restart and publish at once.
    await srv.kill9();
    await sleep(400);
    await srv.start();
    await publishRange(c, channel, 11, 30);
    const info = await srv.channel(channel);
    t.diagnostic(`drop 1: subscribers right after 20 publishes on the restarted server: ${info.subscribers}`);
    got.push(...(await take(it, 20)));

    // Drop 2: killed right after a 500-event batch is acknowledged.
    const batch = await c.publishBatch(channel, range(31, 530));
    assert.equal(batch.lastSeq, 530);
    await srv.kill9();
    await srv.start();
    await publishRange(c, channel, 531, 540);
    got.push(...(await take(it, 510)));

    // Drop 3: killed in the middle of a publish burst from another client.
    const pub = client(srv);
    let acked = 540;
    const publisher = (async () => {
      for (let i = 541; i <= 3000; i++) {
        try { await pub.publish(channel, String(i)); } catch { return; }
        acked = i;
      }
    })();
    got.push(...(await take(it, 40)));
    await srv.kill9();
    await publisher;
    assert.ok(acked < 3000, 'the kill lands mid-burst');
    await srv.start();
    const { head } = await srv.channel(channel);
    assert.ok(head === acked || head === acked + 1, `head ${head}, ${acked} acknowledged`);
    await publishRange(c, channel, head + 1, head + 5);
    got.push(...(await take(it, head + 5 - got.length)));
    assertExactlyOnce(got, head + 5, transport);
    assert.equal(got.filter((u) => u.kind === 'gap').length, 0, 'no gap notice on a durable store');

    // Nothing late: a further publish is the very next update.
    await c.publish(channel, 'last');
    const [next] = await take(it, 1);
    assert.equal(next.data, 'last');
    assert.equal(next.seq, head + 6);
    sub.close();
    assert.equal((await it.next()).done, true, 'a closed subscription ends');
  });

  test(`${transport}: a --memory restart shows exactly one epoch gap, then the new journal`, async () => {
    const srv = await server({ memory: true });
    const c = client(srv);
    const channel = `mem-${transport}`;
    const sub = c.subscribe(channel, { transport });
    const it = sub[Symbol.asyncIterator]();
    const first = it.next();
    await waitFor('the subscription to register', async () => (await srv.channel(channel)).subscribers === 1);
    await publishRange(c, channel, 1, 5);
    const before = [(await first).value, ...(await take(it, 4))];
    assertExactlyOnce(before, 5, 'before the restart');
    const cursorBefore = sub.cursor;
    await srv.kill9();
    await srv.start();
    // A subscription reads (and reconnects) while it is iterated: pull first, then publish.
    const pending = take(it, 4);
    await waitFor('the subscription to come back', async () => (await srv.channel(channel)).subscribers === 1);
    await publishRange(c, channel, 1, 3); // the new incarnation starts again at seq 1
    const afterRestart = await pending;
    assert.equal(afterRestart[0].kind, 'gap', JSON.stringify(afterRestart));
    assert.equal(afterRestart[0].reason, 'epoch');
    assert.equal(afterRestart[0].channel, channel);
    assert.equal(afterRestart[0].after, transport === 'ws' ? cursorBefore : afterRestart[0].after);
    assert.ok(afterRestart[0].next && afterRestart[0].cursor, 'a gap names where delivery continues');
    assertExactlyOnce(afterRestart.slice(1), 3, 'after the restart');
    await sleep(200);
    await c.publish(channel, '4');
    const [n4] = await take(it, 1);
    assert.equal(n4.kind, 'event', 'one gap only');
    assert.equal(n4.seq, 4);
    sub.close();
  });
}

test('a graceful restart (SIGTERM: streams end cleanly, WebSocket 1001) loses and repeats nothing', async () => {
  const srv = await server();
  const c = client(srv);
  const subs = [c.subscribe('term', { since: 'earliest' }), c.subscribe('term', { since: 'earliest', transport: 'ws' })];
  const its = subs.map((s) => s[Symbol.asyncIterator]());
  await publishRange(c, 'term', 1, 5);
  const got = await Promise.all(its.map((it) => take(it, 5)));
  const pending = its.map((it) => take(it, 10));
  await srv.term();
  await srv.start();
  await publishRange(c, 'term', 6, 15);
  const more = await Promise.all(pending);
  for (const i of [0, 1]) assertExactlyOnce([...got[i], ...more[i]], 15, i === 0 ? 'sse' : 'ws');
  subs.forEach((s) => s.close());
});

test('sse: cursors persist in a store; a new subscription resumes right after the last delivered update', async () => {
  const srv = await server();
  const c = client(srv);
  const store = memoryStore();
  const channel = 'persist';
  await publishRange(c, channel, 1, 10);
  const s1 = c.subscribe(channel, { since: 'earliest', store });
  const it1 = s1[Symbol.asyncIterator]();
  const got1 = await take(it1, 4);
  assert.deepEqual(datas(got1), range(1, 4));
  // Events 5..10 were received in the same read but not handed over: the store says 4.
  assert.equal(store.map.get('sse:persist'), got1[3].cursor);
  assert.equal(s1.cursor, got1[3].cursor);
  s1.close();
  await publishRange(c, channel, 11, 12);
  const s2 = c.subscribe(channel, { store }); // no cursor given: the store's is used
  const got2 = await take(s2[Symbol.asyncIterator](), 8);
  assert.deepEqual(datas(got2), range(5, 12));
  s2.close();
  // Multi-channel SSE: one cursor covers both channels.
  const s3 = c.subscribe(['mA', 'mB'], { since: 'earliest', store });
  const it3 = s3[Symbol.asyncIterator]();
  await c.publish('mA', 'a1');
  await c.publish('mB', 'b1');
  const got3 = await take(it3, 2);
  assert.deepEqual(got3.map((u) => `${u.channel}:${u.data}`).sort(), ['mA:a1', 'mB:b1']);
  s3.close();
  await c.publish('mA', 'a2');
  await c.publish('mB', 'b2');
  const s4 = c.subscribe(['mA', 'mB'], { store });
  const got4 = await take(s4[Symbol.asyncIterator](), 2);
  assert.deepEqual(got4.map((u) => `${u.channel}:${u.data}`).sort(), ['mA:a2', 'mB:b2']);
  s4.close();
});

test('ws: per-channel cursors persist; ephemeral events pass without moving them', async () => {
  const srv = await server();
  const c = client(srv);
  const store = memoryStore();
  const s1 = c.subscribe(['wa', 'wb'], { transport: 'ws', since: 'earliest', store });
  const it1 = s1[Symbol.asyncIterator]();
  const p = it1.next();
  await waitFor('both channels followed', async () => (await srv.channel('wa')).subscribers === 1 && (await srv.channel('wb')).subscribers === 1);
  await c.publish('wa', 'a1');
  await c.publish('wb', 'b1');
  await c.publish('wa', 'typing', { ephemeral: true });
  const got = [(await p).value, ...(await take(it1, 2))];
  assert.deepEqual(got.map((u) => `${u.kind}:${u.channel}:${u.data}`).sort(), ['ephemeral:wa:typing', 'event:wa:a1', 'event:wb:b1']);
  const eph = got.find((u) => u.kind === 'ephemeral');
  assert.equal(eph.seq, undefined);
  assert.equal(store.map.get('ws:wa'), got.find((u) => u.data === 'a1').cursor);
  s1.close();
  await c.publish('wa', 'a2');
  await c.publish('wb', 'b2');
  const s2 = c.subscribe(['wa', 'wb'], { transport: 'ws', store });
  const got2 = await take(s2[Symbol.asyncIterator](), 2);
  assert.deepEqual(got2.map((u) => `${u.channel}:${u.data}`).sort(), ['wa:a2', 'wb:b2']);
  assert.equal(s2.cursors.get('wb'), got2.find((u) => u.channel === 'wb').cursor);
  s2.close();
});

test('join under a concurrent publisher: every seq once, in order, the same as history', async () => {
  const srv = await server({ memory: true });
  const c = client(srv);
  const channel = 'join-race';
  await publishRange(c, channel, 1, 50);
  let published = 50;
  let stop = false;
  const publisher = (async () => {
    const p = client(srv);
    while (!stop && published < 2000) {
      await p.publish(channel, String(published + 1));
      published++;
    }
  })();
  const join = c.join(channel, { pageSize: 7 });
  const it = join[Symbol.asyncIterator]();
  const got = await take(it, 300);
  stop = true;
  await publisher;
  await c.publish(channel, String(published + 1));
  published++;
  got.push(...(await take(it, published - got.length)));
  assertExactlyOnce(got, published, 'join');
  const history = [];
  for await (const page of c.historyAll(channel, { limit: 1000 })) history.push(...page.events.map((e) => e.seq));
  assert.deepEqual(got.map((u) => u.seq), history);
  assert.equal(join.cursor, got.at(-1).cursor);
  join.close();
});

test('join: kill -9 and restart during the join resumes from the applied cursor; fold keeps a state view', async () => {
  const srv = await server();
  const c = client(srv);
  const channel = 'join-restart';
  await publishRange(c, channel, 1, 20);
  const join = c.join(channel);
  const steps = fold(join, (s, u) => (u.kind === 'event' ? { n: s.n + 1, sum: s.sum + Number(u.data) } : s), { n: 0, sum: 0 });
  const seen = await take(steps, 20);
  assert.deepEqual(seen.at(-1).state, { n: 20, sum: 210 });
  await srv.kill9();
  await srv.start();
  await publishRange(c, channel, 21, 25);
  const more = await take(steps, 5);
  assert.deepEqual(more.map((s) => s.update.seq), [21, 22, 23, 24, 25]);
  assert.deepEqual(more.at(-1).state, { n: 25, sum: 325 });
  assert.equal(more.at(-1).cursor, join.cursor);
  join.close();
});

test('join: the applied cursor persists in a store; a new join resumes right after it', async () => {
  const srv = await server();
  const store = memoryStore();
  const c = client(srv, { store });
  const channel = 'join-store';
  await publishRange(c, channel, 1, 10);
  const j1 = c.join(channel, { pageSize: 3 });
  const got1 = await take(j1[Symbol.asyncIterator](), 4);
  assert.deepEqual(datas(got1), range(1, 4));
  assert.equal(store.map.get('join:join-store'), got1[3].cursor, 'the last delivered, not the last read');
  j1.close();
  await publishRange(c, channel, 11, 12);
  const j2 = c.join(channel);
  const got2 = await take(j2[Symbol.asyncIterator](), 8);
  assert.deepEqual(datas(got2), range(5, 12));
  j2.close();
});

test('sessions: a consumer resumed with lastSeq across kill -9 gets every event once, then the end', async () => {
  const srv = await server();
  const c = client(srv);
  const s = await c.createSession();
  assert.equal(s.status, 'open');
  const consumer = c.attachSession(s.id, { lastSeq: 1 });
  const it = consumer[Symbol.asyncIterator]();
  const first = it.next();
  await waitFor('the consumer to attach', async () => (await c.sessionInfo(s.id)).attached);
  for (let i = 1; i <= 5; i++) await c.appendSession(s.id, `e${i}`);
  const got = [(await first).value, ...(await take(it, 5))];
  // With lastSeq 1 on a fresh session: an empty replay, then `resumed`, then live events.
  assert.deepEqual(got.map((u) => u.kind), ['resumed', 'event', 'event', 'event', 'event', 'event']);
  assert.equal(consumer.lastSeq, 6);
  await srv.kill9();
  await srv.start();
  for (let i = 6; i <= 10; i++) await c.appendSession(s.id, `e${i}`);
  const back = await take(it, 6);
  const evs = back.filter((u) => u.kind === 'event');
  assert.deepEqual(evs.map((u) => u.data), ['e6', 'e7', 'e8', 'e9', 'e10']);
  assert.deepEqual(evs.map((u) => u.seq), [7, 8, 9, 10, 11]);
  assert.ok(back.some((u) => u.kind === 'resumed'), JSON.stringify(back));
  await c.completeSession(s.id);
  const [end] = await take(it, 1);
  assert.deepEqual(end, { kind: 'completed', seq: 12 });
  assert.equal((await it.next()).done, true, 'the consumer ends after the session does');
});

test('sessions: refusals 4404 (not found, ended), 4409, 4410 are typed errors that do not reconnect', async () => {
  const srv = await server();
  const c = client(srv);
  const attempts = async (consumer) => {
    const t0 = Date.now();
    try {
      for await (const u of consumer) assert.fail(`unexpected ${JSON.stringify(u)}`);
      assert.fail('expected an error');
    } catch (e) {
      assert.ok(e instanceof GaplessError, String(e));
      assert.ok(Date.now() - t0 < 3000, 'refused at once, no reconnection loop');
      return e;
    }
  };
  const e404 = await attempts(c.attachSession('no-such-session', { lastSeq: 1 }));
  assert.equal(e404.code, 'session_not_found');
  assert.equal(e404.closeCode, 4404);
  assert.equal(e404.status, 404);
  assert.ok(e404.terminal);

  // An ended session, attached without lastSeq: nothing live to attach to. Close 4404 (the
  // design's "unknown, completed or cancelled session"), told apart by the error's code.
  const done = await c.createSession('done');
  await c.completeSession(done.id);
  const ended = await attempts(c.attachSession(done.id));
  assert.equal(ended.code, 'session_ended');
  assert.equal(ended.closeCode, 4404);
  assert.equal(ended.status, 409);
  assert.match(ended.message, /is completed/);
  assert.ok(ended.terminal);

  const s = await c.createSession('held');
  const holder = c.attachSession(s.id);
  const hit = holder[Symbol.asyncIterator]();
  // A live attach is answered at once, naming the head it continues after.
  const first = (await hit.next()).value;
  assert.equal(first.kind, 'resumed');
  assert.equal(first.replayedEvents, 0);
  assert.equal(first.head, 1);
  const pending = hit.next();
  await waitFor('the holder to attach', async () => (await c.sessionInfo(s.id)).attached);
  const e409 = await attempts(c.attachSession(s.id));
  assert.equal(e409.code, 'session_attached');
  assert.equal(e409.closeCode, 4409);

  const e410 = await attempts(c.attachSession(s.id, { lastSeq: 99, takeover: true }));
  assert.equal(e410.code, 'session_not_retained');
  assert.equal(e410.closeCode, 4410);

  // A takeover by a newer connection ends the holder with 4409.
  const taker = c.attachSession(s.id, { takeover: true });
  const tit = taker[Symbol.asyncIterator]();
  const tp = tit.next();
  await assert.rejects(pending, (e) => e.code === 'session_attached' && e.closeCode === 4409);
  assert.equal((await tp).value.kind, 'resumed');
  await c.appendSession(s.id, 'after takeover');
  assert.equal((await tit.next()).value.data, 'after takeover');
  taker.close();
});

test('errors are typed GaplessErrors with the server code, status and message', async () => {
  const srv = await server();
  const c = client(srv);
  await assert.rejects(c.publish('bad channel', 'x'), (e) =>
    e instanceof GaplessError && e.code === 'invalid_channel' && e.status === 400 && /position/.test(e.message) && e.terminal);
  await assert.rejects(c.history('ok', { after: 'garbage' }), (e) => e.code === 'invalid_cursor' && e.status === 400);
  await assert.rejects(c.publish('ok', 'x', { type: 'gap' }), (e) => e.code === 'invalid_type');
  const unreachable = new Client('http://127.0.0.1:9');
  await assert.rejects(unreachable.publish('ok', 'x'), (e) => e.code === 'network' && e.status === 0 && !e.terminal);
  assert.throws(() => new Client('ftp://x'), (e) => e.code === 'invalid_argument');
  // Idempotent publish: the retry appends nothing and says so.
  const a = await c.publish('idem', 'x', { idempotencyKey: 'k1' });
  const b = await c.publish('idem', 'x', { idempotencyKey: 'k1' });
  assert.equal(a.duplicate, false);
  assert.equal(b.duplicate, true);
  assert.equal(b.seq, a.seq);
  assert.equal((await c.channel('idem')).head, 1);
  // A subscription refused for good throws (no reconnection loop).
  const sub = c.subscribe('bad channel');
  await assert.rejects(sub[Symbol.asyncIterator]().next(), (e) => e.code === 'invalid_channel');
  const wsub = c.subscribe('ok', { transport: 'ws', cursor: 'AAAA' });
  await assert.rejects(wsub[Symbol.asyncIterator]().next(), (e) => e.code === 'invalid_cursor');
});

test('the on(...) form delivers the same updates to listeners, by kind', async () => {
  const srv = await server();
  const c = client(srv);
  const sub = c.subscribe('ui', { since: 'earliest' });
  const events = [];
  const all = [];
  const eph = [];
  sub.on('event', (u) => events.push(u.data));
  sub.on('ephemeral', (u) => eph.push(u.data));
  sub.on('update', (u) => all.push(u.kind));
  assert.throws(() => sub[Symbol.asyncIterator](), /either/);
  await c.publish('ui', 'one');
  await waitFor('the subscription to register', async () => (await srv.channel('ui')).subscribers === 1);
  await c.publish('ui', 'ping', { ephemeral: true });
  await c.publish('ui', 'two');
  await waitFor('two events', () => events.length === 2 && eph.length === 1);
  assert.deepEqual(events, ['one', 'two']);
  assert.deepEqual(all.filter((k) => k === 'event').length, 2);
  sub.close();
  const errs = [];
  const ended = [];
  const bad = c.subscribe('bad channel');
  bad.on('error', (e) => errs.push(e.code));
  bad.on('end', () => ended.push(true));
  await waitFor('the error', () => ended.length === 1);
  assert.deepEqual(errs, ['invalid_channel']);
});
