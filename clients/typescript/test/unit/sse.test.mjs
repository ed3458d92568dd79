// The SSE parser against the WHATWG event-stream rules, one table row per rule (the same
// table as the Rust SDK's crates/client/tests/it/sse.rs), plus properties: any chunking of a
// stream yields the same items.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DEFAULT_MAX_EVENT_BYTES, GaplessError, SseParser, parseAll } from '../../dist/index.js';

const enc = (s) => (typeof s === 'string' ? new TextEncoder().encode(s) : Uint8Array.from(s));
const bytes = (...parts) => {
  const arrs = parts.map(enc);
  const out = new Uint8Array(arrs.reduce((n, a) => n + a.length, 0));
  let o = 0;
  for (const a of arrs) { out.set(a, o); o += a.length; }
  return out;
};
const ev = (type, data, lastEventId) => ({ kind: 'event', type, data, lastEventId });
const msg = (data) => ev('message', data, '');
const id = (s) => ({ kind: 'id', lastEventId: s });
const retry = (ms) => ({ kind: 'retry', ms });
const BOM = [0xef, 0xbb, 0xbf];

function run(chunks) {
  const p = new SseParser();
  const out = [];
  for (const c of chunks) p.feed(c, (i) => out.push(i));
  p.finish();
  return { items: out, last: p.lastEventId, retry: p.retry };
}

const table = [
  ['LF line ends', 'data: a\n\n', [msg('a')]],
  ['CR line ends', 'data: a\r\r', [msg('a')]],
  ['CRLF line ends', 'data: a\r\n\r\n', [msg('a')]],
  ['mixed line ends in one event', 'data: a\rdata: b\ndata: c\r\n\n', [msg('a\nb\nc')]],
  ['leading BOM stripped', bytes(BOM, 'data: a\n\n'), [msg('a')]],
  ['only one BOM stripped: the second is part of the field name', bytes(BOM, BOM, 'data: a\n\ndata: b\n\n'), [msg('b')]],
  ['comment line: no dispatch', ': hello\n\n', []],
  ['comment-only heartbeat', ':\n\n', []],
  ['comment between data lines', 'data: a\n: note\ndata: b\n\n', [msg('a\nb')]],
  ['data lines joined with LF', 'data: a\ndata:\ndata: b\n\n', [msg('a\n\nb')]],
  ['field name with no colon: empty data fires', 'data\n\n', [msg('')]],
  ['two empty data lines', 'data\ndata\n\n', [msg('\n')]],
  ['one optional space removed', 'data:  a\n\n', [msg(' a')]],
  ['no space after the colon', 'data:a\n\n', [msg('a')]],
  ['colon inside the value', 'data: a: b\n\n', [msg('a: b')]],
  ['space before the colon belongs to the name', 'data : x\n\n', []],
  ['leading space: not a field', ' data: x\n\n', []],
  ['field names are case-sensitive', 'Data: x\n\n', []],
  ['unknown field ignored', 'foo: bar\ndata: x\n\n', [msg('x')]],
  ['event type', 'event: add\ndata: x\n\n', [ev('add', 'x', '')]],
  ['empty event type is message', 'event\ndata: x\n\n', [msg('x')]],
  ['event type resets after dispatch', 'event: a\ndata: 1\n\ndata: 2\n\n', [ev('a', '1', ''), msg('2')]],
  ['event type without data fires nothing', 'event: a\n\ndata: 2\n\n', [msg('2')]],
  ['id sets the last event ID', 'id: 7\ndata: x\n\n', [ev('message', 'x', '7')]],
  ['the last event ID persists across events', 'id: 7\ndata: x\n\ndata: y\n\n', [ev('message', 'x', '7'), ev('message', 'y', '7')]],
  ['id containing NUL is ignored', 'id: 1\n\nid: a\u0000b\ndata: x\n\n', [id('1'), ev('message', 'x', '1')]],
  ['id-only frame sets the last event ID, fires nothing', 'id: c1\n\n', [id('c1')]],
  ['an unchanged id-only frame reports nothing', 'id: c1\n\nid: c1\n\n', [id('c1')]],
  ['an empty id clears it', 'id: 1\n\nid\n\n', [id('1'), id('')]],
  ['retry with digits', 'retry: 250\n\n', [retry(250)]],
  ['retry applies without a blank line', 'retry: 9\n', [retry(9)]],
  ['retry other than digits is ignored', 'retry: 25x\nretry: -1\nretry:  5\nretry:\nretry: 1.5\n\n', []],
  ['unterminated event at EOF is dropped', 'id: 9\ndata: x', []],
  ['unterminated event after a complete one', 'data: a\n\nid: 9\ndata: b\n', [msg('a')]],
  ['invalid UTF-8 becomes U+FFFD', bytes('data: a', [0xff], 'b\n\n'), [msg('a\uFFFDb')]],
  ['blank lines alone fire nothing', '\n\r\n\r\n', []],
  ['gapless preamble: retry, gap, id frame, event',
    'retry: 1000\n\nevent: gap\ndata: {}\n\nid: C0\n\nid: C1\ndata: {"seq":1}\n\n',
    [retry(1000), ev('gap', '{}', ''), id('C0'), ev('message', '{"seq":1}', 'C1')]],
];

test('table of rules, whole and byte by byte', () => {
  for (const [name, input, want] of table) {
    const b = enc(input);
    assert.deepEqual(run([b]).items, want, `rule: ${name}`);
    const single = [...b].map((x) => Uint8Array.of(x));
    assert.deepEqual(run(single).items, want, `rule, byte by byte: ${name}`);
  }
});

test('an unterminated event id does not become the last event id', () => {
  const r = run([enc('id: 1\n\nid: 2\ndata: x')]);
  assert.deepEqual(r.items, [id('1')]);
  assert.equal(r.last, '1');
});

test('a CRLF split across reads is one line end', () => {
  assert.deepEqual(run(['data: a\r', '\ndata: b\r', '\n\r', '\n'].map(enc)).items, [msg('a\nb')]);
  assert.deepEqual(run(['data: a\r', '\rdata: b\n\n'].map(enc)).items, [msg('a'), msg('b')]);
  assert.deepEqual(run(['data: a\r', '', '\n\n'].map(enc)).items, [msg('a')]);
});

test('a BOM split across reads', () => {
  assert.deepEqual(run([Uint8Array.of(0xef), Uint8Array.of(0xbb), bytes([0xbf], 'data: a\n\n')]).items, [msg('a')]);
  assert.deepEqual(run([Uint8Array.of(0xef, 0xbb), enc('\n'), enc('data: a\n\n')]).items, [msg('a')]);
  assert.deepEqual(run([Uint8Array.from(BOM)]).items, []);
});

test('UTF-8 split across reads at every position', () => {
  const text = enc('data: é€😀 ok\n\n');
  for (let cut = 0; cut <= text.length; cut++) {
    assert.deepEqual(run([text.slice(0, cut), text.slice(cut)]).items, [msg('é€😀 ok')], `cut at ${cut}`);
  }
});

test('the event size limit fails explicitly and sticks until reset', () => {
  const p = new SseParser(16);
  const out = [];
  p.feed(enc('data: 0123456789\n\n'), (i) => out.push(i));
  assert.deepEqual(out, [msg('0123456789')]);
  assert.throws(() => p.feed(enc('data: 0123456789AB'), (i) => out.push(i)),
    (e) => e instanceof GaplessError && e.code === 'event_too_large' && /16 bytes/.test(e.message));
  assert.throws(() => p.feed(enc('\n\n'), () => {}), GaplessError);
  p.reset();
  p.feed(enc('data: ok\n\n'), (i) => out.push(i));
  assert.deepEqual(out.at(-1), msg('ok'));
  assert.throws(() => parseAll('data: 0123456\ndata: 0123456\n\n', 20), (e) => e.code === 'event_too_large');
  const q = new SseParser(8);
  const seen = [];
  assert.throws(() => q.feed(enc('data: a\n\ndata: 0123456789\n\n'), (i) => seen.push(i)));
  assert.deepEqual(seen, [msg('a')]);
  assert.equal(new SseParser().maxEventBytes, DEFAULT_MAX_EVENT_BYTES);
});

test('retry is kept and huge values saturate', () => {
  const p = new SseParser();
  p.feed(enc('retry: 99999999999999999999999\n'), () => {});
  assert.equal(p.retry, Number.MAX_SAFE_INTEGER);
  p.feed(enc('retry: 1500\n\n'), () => {});
  assert.equal(p.retry, 1500);
});

test('reset starts a new stream (BOM again, empty id buffer)', () => {
  const p = new SseParser();
  const out = [];
  p.feed(enc('id: 5\ndata: a\n\nid: 6\ndata: cut'), (i) => out.push(i));
  p.reset();
  p.feed(bytes(BOM, 'data: b\n\n'), (i) => out.push(i));
  assert.deepEqual(out, [ev('message', 'a', '5'), msg('b')]);
});

// A small seeded PRNG, so a failure can be replayed (the seed is in the message).
function rng(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function randomStream(r) {
  const pick = (xs) => xs[Math.floor(r() * xs.length)];
  const parts = [];
  if (r() < 0.3) parts.push(Uint8Array.from(BOM));
  const n = Math.floor(r() * 40);
  for (let i = 0; i < n; i++) {
    const name = pick(['data', 'id', 'event', 'retry', '', 'x']);
    const sep = pick([': ', ':', '', ':  ']);
    const value = pick(['abc', '12', 'a:b c', '', 'a\u0000b', 'é😀', String(Math.floor(r() * 9999))]);
    if (name !== '' || sep !== '') parts.push(enc(`${name}${sep}${value}`));
    parts.push(enc(pick(['\n', '\r', '\r\n'])));
  }
  const tail = Math.floor(r() * 4);
  for (let i = 0; i < tail; i++) parts.push(Uint8Array.of(Math.floor(r() * 256)));
  return bytes(...parts);
}

function chunked(b, cuts) {
  const sorted = cuts.map((c) => c % (b.length + 1)).sort((x, y) => x - y);
  const chunks = [];
  let at = 0;
  for (const c of [...sorted, b.length]) { chunks.push(b.slice(at, c)); at = c; }
  return run(chunks);
}

test('any chunking of a stream (structured or arbitrary bytes) yields the same items', () => {
  for (let seed = 1; seed <= 300; seed++) {
    const r = rng(seed);
    const b = seed % 3 === 0 ? Uint8Array.from({ length: Math.floor(r() * 300) }, () => Math.floor(r() * 256)) : randomStream(r);
    const whole = chunked(b, []);
    const cuts = Array.from({ length: Math.floor(r() * 12) }, () => Math.floor(r() * 1e6));
    assert.deepEqual(chunked(b, cuts), whole, `seed ${seed}`);
    assert.deepEqual(chunked(b, [...b.keys()]), whole, `byte by byte, seed ${seed}`);
  }
});
