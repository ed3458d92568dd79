// Purge through the SDK against the real gapless binary ($GAPLESS_BIN): `client.purge(channel)`
// answers once the channel's events are gone; a subscriber (SSE over fetch, WebSocket) gets one
// `epoch` gap, then the events published after the purge; history starts empty; a bad name is
// a GaplessError `invalid_channel`.

import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { WebSocket } from 'ws';
import { Client, GaplessError } from '../../dist/index.js';
import { Gapless, take } from '../harness.mjs';

const servers = [];
after(async () => {
  for (const s of servers) await s.stop();
});

for (const transport of ['sse', 'ws']) {
  test(`${transport}: purge gives one epoch gap, then the new events`, async () => {
    const srv = await Gapless.create({ memory: true });
    servers.push(srv);
    const c = new Client(srv.base, { WebSocket, backoff: { initialMs: 100, maxMs: 1000 } });
    const ch = `p-${transport}`;
    await c.publish(ch, 'a1');
    const sub = c.subscribe(ch, { transport, since: 'earliest', store: null });
    const it = sub[Symbol.asyncIterator]();
    const [first] = await take(it, 1);
    assert.equal(first.data, 'a1');
    await c.purge(ch);
    await c.purge(`${ch}-never-published`);
    await c.publish(ch, 'b1');
    const [gap, next] = await take(it, 2);
    assert.equal(gap.kind, 'gap');
    assert.equal(JSON.parse(gap.data).reason, 'epoch');
    assert.equal(next.data, 'b1');
    sub.close();
    assert.deepEqual((await c.history(ch)).events.map((e) => e.data), ['b1']);
    await assert.rejects(c.purge('bad name'), (e) => e instanceof GaplessError && e.code === 'invalid_channel');
  });
}
