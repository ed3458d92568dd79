// Binary events through the SDK against the real gapless binary ($GAPLESS_BIN): an event
// published as bytes (`Content-Type: application/octet-stream`) reaches the user as a
// Uint8Array of exactly those bytes (the wire's `"encoding": "base64"` decoded) over SSE and
// WebSocket subscriptions, the join and history; a text event stays a string.

import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { WebSocket } from 'ws';
import { Client, GaplessError } from '../../dist/index.js';
import { payloadOf } from '../../dist/internal.js';
import { Gapless, take } from '../harness.mjs';

const servers = [];
after(async () => {
  for (const s of servers) await s.stop();
});

const BYTES = [0, 255, 1, 128, 10, 13];

async function publishBytes(srv, ch, bytes) {
  const r = await fetch(`${srv.base}/v1/channels/${ch}/events`, {
    method: 'POST',
    headers: { 'content-type': 'application/octet-stream' },
    body: new Uint8Array(bytes),
  });
  assert.ok(r.ok, `publish bytes: ${r.status} ${await r.text()}`);
}

function assertBytes(data, bytes) {
  assert.ok(data instanceof Uint8Array, `a binary event's data is a Uint8Array, got ${typeof data}: ${data}`);
  assert.deepEqual([...data], bytes);
}

for (const transport of ['sse', 'ws']) {
  test(`${transport}: a binary event's data is its bytes, a text event's a string`, async () => {
    const srv = await Gapless.create({ memory: true });
    servers.push(srv);
    const c = new Client(srv.base, { WebSocket, backoff: { initialMs: 100, maxMs: 1000 } });
    const ch = `bin-${transport}`;
    await publishBytes(srv, ch, BYTES);
    await c.publish(ch, 'text');
    const sub = c.subscribe(ch, { transport, since: 'earliest', store: null });
    const it = sub[Symbol.asyncIterator]();
    const [bin, text] = await take(it, 2);
    assertBytes(bin.data, BYTES);
    assert.equal(text.data, 'text');
    await publishBytes(srv, ch, [7]);
    const [live] = await take(it, 1);
    assertBytes(live.data, [7]);
    sub.close();
  });
}

test('history and join: binary events are bytes', async () => {
  const srv = await Gapless.create({ memory: true });
  servers.push(srv);
  const c = new Client(srv.base, { WebSocket, backoff: { initialMs: 100, maxMs: 1000 } });
  await publishBytes(srv, 'bin-h', BYTES);
  await c.publish('bin-h', 'text');
  const page = await c.history('bin-h');
  assertBytes(page.events[0].data, BYTES);
  assert.equal(page.events[1].data, 'text');
  assert.equal('encoding' in page.events[0], false, 'the wire field is consumed');
  const join = c.join('bin-h', { store: null });
  const it = join[Symbol.asyncIterator]();
  const [a, b] = await take(it, 2);
  assertBytes(a.data, BYTES);
  assert.equal(b.data, 'text');
  join.close();
});

test('payloadOf: base64 decodes, text passes, bad base64 is a protocol error', () => {
  assertBytes(payloadOf('AP8=', 'base64'), [0, 255]);
  assertBytes(payloadOf('', 'base64'), []);
  assert.equal(payloadOf('AP8=', undefined), 'AP8=');
  assert.throws(() => payloadOf('A-8=', 'base64'), (e) => e instanceof GaplessError && e.code === 'protocol');
  assert.throws(() => payloadOf('AP8', 'base64'), (e) => e instanceof GaplessError && e.code === 'protocol');
});
