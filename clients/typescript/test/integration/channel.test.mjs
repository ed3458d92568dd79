// Channel info through the SDK against the real gapless binary ($GAPLESS_BIN):
// `client.channel(name)` gives the channel's `namespace` (its name up to the first `:`,
// `default` without one) and the `retention` that applies to it, as the server's
// `GET /v1/channels/{channel}` answers them.

import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Client } from '../../dist/index.js';
import { Gapless } from '../harness.mjs';

const servers = [];
after(async () => {
  for (const s of servers) await s.stop();
});

test('channel info has the namespace and its retention', async () => {
  const srv = await Gapless.create({ memory: true, extraArgs: ['--retention-events', '7'] });
  servers.push(srv);
  const c = new Client(srv.base);
  await c.publish('chat:room-1', 'x');
  const info = await c.channel('chat:room-1');
  assert.equal(info.namespace, 'chat');
  assert.equal(info.retention.events, 7);
  assert.equal(typeof info.retention.ms, 'number');
  assert.equal(typeof info.retention.bytes, 'number');
  const raw = await (await fetch(`${srv.base}/v1/channels/chat:room-1`)).json();
  assert.deepEqual(info.retention, raw.retention, 'as the server gives it');
  assert.equal(info.head, 1);
  assert.equal((await c.channel('plain')).namespace, 'default');
});
