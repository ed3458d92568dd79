// Full-jitter exponential backoff: ceilings double and cap, every delay lies in [0, ceiling],
// Retry-After is a floor, and quick clean closes back off only when they repeat.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Backoff } from '../../dist/index.js';
import { Retrier } from '../../dist/backoff.js';

test('the ceiling doubles from the base and caps at maxMs', () => {
  const b = new Backoff({ initialMs: 100, maxMs: 2000 });
  assert.equal(b.ceiling(250, 0), 250);
  assert.equal(b.ceiling(250, 1), 500);
  assert.equal(b.ceiling(250, 2), 1000);
  assert.equal(b.ceiling(250, 3), 2000);
  assert.equal(b.ceiling(250, 1000), 2000);
  assert.equal(b.ceiling(0, 5), 0);
  const d = new Backoff();
  assert.equal(d.initialMs, 1000);
  assert.equal(d.maxMs, 30000);
});

test('full jitter: delays span [0, ceiling] and never exceed it', () => {
  assert.equal(new Backoff({ random: () => 0 }).delay(1000, 2), 0);
  assert.equal(new Backoff({ random: () => 0.999999 }).delay(1000, 2), 4000);
  const b = new Backoff({ maxMs: 5000 });
  let min = Infinity;
  let max = 0;
  for (let i = 0; i < 2000; i++) {
    const d = b.delay(1000, 2);
    assert.ok(Number.isInteger(d) && d >= 0 && d <= 4000, `delay ${d}`);
    min = Math.min(min, d);
    max = Math.max(max, d);
  }
  // 2000 uniform draws over [0, 4000]: the extremes come within 10% of both ends.
  assert.ok(min < 400 && max > 3600, `min ${min} max ${max}`);
  assert.equal(b.delay(0, 7), 0);
});

test('the retrier counts failures, takes retry: as its base, and honours Retry-After', () => {
  const r = new Retrier(new Backoff({ initialMs: 100, maxMs: 10_000, random: () => 0.999999 }));
  assert.equal(r.failed(), 100);
  assert.equal(r.failed(), 200);
  r.baseMs = 1000; // a retry: field
  assert.equal(r.failed(), 4000);
  r.attempt = 0; // a connection proved itself
  assert.equal(r.failed(), 1000);
  const z = new Retrier(new Backoff({ random: () => 0 }));
  assert.equal(z.failed(2500), 2500, 'Retry-After is a floor');
});

test('a clean close reconnects at once unless two quick closes come in a row', () => {
  const r = new Retrier(new Backoff({ initialMs: 100, random: () => 0.999999 }));
  const t0 = 1_000_000;
  assert.equal(r.closed(t0 - 5000, t0), 0, 'a long-lived stream closed: reconnect at once');
  assert.equal(r.closed(t0 - 10, t0), 0, 'a first quick close: at once');
  assert.equal(r.closed(t0 - 10, t0), 100, 'a second quick close in a row: back off');
  assert.equal(r.closed(t0 - 10, t0), 200);
  assert.equal(r.closed(t0 - 5000, t0), 0);
});
