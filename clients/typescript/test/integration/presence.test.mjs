// Presence through the SDK against the real gapless binary ($GAPLESS_BIN): `client.presence(channel)`
// (occupancy, members sorted by id), `clientId` and `presence: true` on SSE and WebSocket
// subscriptions, join and leave as `{kind: "presence"}` updates that move no cursor, and
// `presence_disabled` for a namespace without presence.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, test } from 'node:test';
import { WebSocket } from 'ws';
import { Client, GaplessError } from '../../dist/index.js';
import { Gapless, take, tempDir, waitFor } from '../harness.mjs';

const servers = [];
const dirs = [];
after(async () => {
  for (const s of servers) await s.stop();
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

async function presenceServer() {
  const dir = tempDir('gapless-presence-config-');
  dirs.push(dir);
  const file = path.join(dir, 'g.toml');
  fs.writeFileSync(file, '[namespaces.room]\npresence = true\npresence_linger_ms = 0\n');
  const srv = await Gapless.create({ memory: true, extraArgs: ['--config', file] });
  servers.push(srv);
  return srv;
}

for (const transport of ['sse', 'ws']) {
  test(`${transport}: presence updates and client.presence`, async () => {
    const srv = await presenceServer();
    const c = new Client(srv.base, { WebSocket, backoff: { initialMs: 100, maxMs: 1000 } });
    const ch = `room:${transport}`;
    const empty = await c.presence(ch);
    assert.deepEqual(empty, { channel: ch, occupancy: 0, members: [] });
    await c.publish(ch, 'e1');
    const watcher = c.subscribe(ch, { transport, since: 'earliest', presence: true, store: null });
    const it = watcher[Symbol.asyncIterator]();
    const [first] = await take(it, 1);
    assert.equal(first.data, 'e1');
    const cursor = watcher.cursor;
    const ana = c.subscribe(ch, { transport, clientId: 'ana', store: null });
    const anaIt = ana[Symbol.asyncIterator]();
    const pending = anaIt.next().catch(() => {});
    const [join] = await take(it, 1);
    assert.equal(join.kind, 'presence');
    assert.equal(join.action, 'join');
    assert.equal(join.id, 'ana');
    assert.equal(join.channel, ch);
    assert.deepEqual(JSON.parse(join.data), { action: 'join', channel: ch, id: 'ana' });
    assert.equal(watcher.cursor, cursor, 'a presence update moves no cursor');
    const p = await c.presence(ch);
    assert.equal(p.occupancy, 2);
    assert.deepEqual(p.members.map((m) => [m.id, m.connections]), [['ana', 1]]);
    assert.ok(p.members[0].since > 0);
    ana.close();
    await pending;
    const [leave] = await take(it, 1);
    assert.equal(leave.kind, 'presence');
    assert.equal(leave.action, 'leave');
    assert.equal(leave.id, 'ana');
    await waitFor('no member', async () => (await c.presence(ch)).members.length === 0);
    watcher.close();
  });
}

test('presence_disabled and a bad clientId are GaplessErrors', async () => {
  const srv = await presenceServer();
  const c = new Client(srv.base, { WebSocket, backoff: { initialMs: 100, maxMs: 1000 } });
  await assert.rejects(c.presence('news'), (e) => e instanceof GaplessError && e.code === 'presence_disabled' && e.status === 404);
  for (const transport of ['sse', 'ws']) {
    const sub = c.subscribe('news', { transport, presence: true, reconnect: false, store: null });
    await assert.rejects(take(sub[Symbol.asyncIterator](), 1), (e) => e instanceof GaplessError && e.code === 'presence_disabled');
    const bad = c.subscribe('room:x', { transport, clientId: 'a b', reconnect: false, store: null });
    await assert.rejects(take(bad[Symbol.asyncIterator](), 1), (e) => e instanceof GaplessError && e.code === 'invalid_request');
  }
});
