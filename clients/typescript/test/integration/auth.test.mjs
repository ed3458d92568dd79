// Authorization against the real binary, when it has --jwt-secret (HS256 tokens with claims
// {"exp", "sub"?, "gapless": {"subscribe": [patterns], "publish": [patterns]}}). Against a
// binary without it, every test here is skipped with a visible line.

import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { WebSocket } from 'ws';
import { Client, GaplessError } from '../../dist/index.js';
import { Gapless, mintToken, range, sleep, supportsJwt, take, waitFor } from '../harness.mjs';

const SECRET = 'gapless-ts-test-secret-of-32-bytes!!';
const jwt = supportsJwt();
const skip = jwt ? false : 'server without --jwt-secret';
if (!jwt) console.log('skipped: server without --jwt-secret');

let srv;
after(async () => srv?.stop());
async function server() {
  // No leeway on `exp` (the server's default honours a token 5 s past it), so that tokens
  // minted to live 2 s expire while the test runs.
  srv ??= await Gapless.create({ extraArgs: ['--jwt-secret', SECRET, '--jwt-leeway-ms', '0'] });
  return srv;
}

const token = (grants, ttlSeconds = 600) =>
  mintToken(SECRET, { exp: Math.floor(Date.now() / 1000) + ttlSeconds, sub: 'ts-test', gapless: grants });

test('jwt: publish needs a token that grants it; refusals are typed 401 and 403', { skip }, async () => {
  const s = await server();
  const ok = new Client(s.base, { token: token({ publish: ['auth-*'], subscribe: ['*'] }) });
  const p = await ok.publish('auth-a', 'x');
  assert.equal(p.seq, 1);
  await assert.rejects(new Client(s.base).publish('auth-a', 'x'), (e) => e instanceof GaplessError && e.code === 'unauthorized' && e.status === 401);
  await assert.rejects(new Client(s.base, { token: 'not.a.token' }).publish('auth-a', 'x'), (e) => e.code === 'unauthorized');
  await assert.rejects(
    new Client(s.base, { token: token({ publish: ['other'], subscribe: [] }) }).publish('auth-a', 'x'),
    (e) => e.code === 'forbidden' && e.status === 403,
  );
  await assert.rejects(
    new Client(s.base, { token: token({ subscribe: ['auth-a'] }) }).subscribe('auth-b')[Symbol.asyncIterator]().next(),
    (e) => e.code === 'forbidden' && e.status === 403,
  );
});

for (const transport of ['sse', 'ws']) {
  test(`jwt ${transport}: tokens that expire mid-stream are renewed by getToken; every event once, in order`, { skip }, async (t) => {
    const s = await server();
    const channel = `auth-expiry-${transport}`;
    const pub = new Client(s.base, { token: token({ publish: ['*'] }) });
    let calls = 0;
    const c = new Client(s.base, {
      WebSocket,
      backoff: { initialMs: 50 },
      getToken: () => {
        calls++;
        return token({ subscribe: [channel] }, 2); // expires within 1-2 s (exp is in whole seconds)
      },
    });
    const sub = c.subscribe(channel, { transport });
    t.after(() => sub.close());
    const it = sub[Symbol.asyncIterator]();
    const pending = take(it, 40, 20_000);
    const admin = new Client(s.base, { token: token({ subscribe: ['*'], publish: ['*'] }) });
    await waitFor('the subscription to register', async () => (await admin.channel(channel)).subscribers === 1);
    for (let i = 1; i <= 40; i++) {
      await pub.publish(channel, String(i));
      await sleep(100); // 4 s in all: at least one expiry
    }
    const got = await pending;
    assert.deepEqual(got.map((u) => u.data), range(1, 40));
    assert.ok(calls >= 2, `getToken called ${calls} times`);
    sub.close();
  });
}

test('jwt: a refused WebSocket token and a forbidden session consumer end with typed errors', { skip }, async () => {
  const s = await server();
  const producer = new Client(s.base, { token: token({ publish: ['*'], subscribe: ['*'] }) });
  const { id } = await producer.createSession();
  let calls = 0;
  const bad = new Client(s.base, { WebSocket, getToken: () => { calls++; return 'not.a.token'; }, backoff: { initialMs: 1 } });
  await assert.rejects(bad.subscribe('auth-ws', { transport: 'ws' })[Symbol.asyncIterator]().next(),
    (e) => e.code === 'unauthorized' && e.closeCode === 4401 && e.status === 401);
  assert.equal(calls, 2, 'getToken once more after the refusal, then the error');
  const other = new Client(s.base, { WebSocket, token: token({ subscribe: ['session/someone-else'] }) });
  await assert.rejects(async () => {
    for await (const u of other.attachSession(id)) assert.fail(JSON.stringify(u));
  }, (e) => e.code === 'forbidden' && e.closeCode === 4403 && e.status === 403 && e.terminal);
  const mine = new Client(s.base, { WebSocket, token: token({ subscribe: [`session/${id}`] }) });
  const consumer = mine.attachSession(id, { lastSeq: 1 });
  const it = consumer[Symbol.asyncIterator]();
  await producer.appendSession(id, 'hello');
  const got = await take(it, 2);
  // Replayed before `resumed` or live after it, depending on when the attach lands.
  assert.deepEqual(got.map((u) => u.kind).sort(), ['event', 'resumed']);
  assert.equal(got.find((u) => u.kind === 'event').data, 'hello');
  consumer.close();
});
