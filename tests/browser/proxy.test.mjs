// Real-browser test of the proxy advice in docs/deploy.md ("Behind nginx"): nginx in
// front of gapless, TLS with a throwaway self-signed certificate, the proxy settings the
// guide gives (no buffering, HTTP/1.1 upstream, long reads, gzip kept off streams).
//
// Over HTTP/1.1 a browser opens at most 6 connections per origin, so a seventh
// EventSource (a seventh tab) waits and never gets its events; over HTTP/2 all of them
// share one connection. One page opens 8 EventSources through each listener and one
// event is published: through the HTTP/1.1 listener exactly 6 receive it, through the
// HTTP/2 one all 8 do. A third listener compresses text/event-stream (a common nginx
// setting the guide advises against): gapless's `X-Accel-Buffering: no` makes nginx flush
// its compressor after each write, so the event still arrives at once.
//
// Needs nginx and openssl (scripts/browser-test.sh installs nginx when missing).

import assert from 'node:assert/strict';
import { spawn, spawnSync, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { Gapless, freePort, launchBrowser, sleep, tempDir, waitFor } from './harness.mjs';

const STREAMS = 8;
let browser;
let gapless;
let nginx;
let work;
const ports = {};

before(async () => {
  work = tempDir('gapless-proxy-');
  gapless = new Gapless({ port: await freePort(), dataDir: work, memory: true });
  await gapless.start();
  execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1',
    '-subj', '/CN=127.0.0.1', '-keyout', path.join(work, 'key.pem'), '-out', path.join(work, 'cert.pem')],
  { stdio: 'ignore' });
  ports.h1 = await freePort();
  ports.h2 = await freePort();
  ports.gzip = await freePort();
  // The location block is the one docs/deploy.md gives; nginx 1.22 (Debian 12) spells
  // HTTP/2 as a `listen` parameter (`http2 on;` is nginx 1.25.1 and later).
  const location = `
      location / {
        proxy_pass http://127.0.0.1:${gapless.port};
        proxy_http_version 1.1;
        proxy_set_header Host $host;
        proxy_set_header Connection "";
        proxy_buffering off;
        proxy_cache off;
        proxy_read_timeout 1h;
        proxy_send_timeout 1h;
      }`;
  const tls = `ssl_certificate ${work}/cert.pem; ssl_certificate_key ${work}/key.pem;`;
  fs.writeFileSync(path.join(work, 'nginx.conf'), `
daemon off; worker_processes 1; pid ${work}/nginx.pid; error_log ${work}/nginx.err;
events {}
http {
  access_log off;
  client_body_temp_path ${work}; proxy_temp_path ${work};
  fastcgi_temp_path ${work}; uwsgi_temp_path ${work}; scgi_temp_path ${work};
  gzip on; gzip_types text/plain application/json;
  server { listen 127.0.0.1:${ports.h1} ssl; ${tls} ${location} }
  server { listen 127.0.0.1:${ports.h2} ssl http2; ${tls} ${location} }
  server { listen 127.0.0.1:${ports.gzip} ssl http2; ${tls}
    gzip_types text/plain application/json text/event-stream; gzip_min_length 1; ${location} }
}`);
  nginx = spawn('nginx', ['-c', path.join(work, 'nginx.conf')], { stdio: 'ignore' });
  await waitFor('nginx listening', async () => {
    try {
      execFileSync('curl', ['-skf', '-o', '/dev/null', `https://127.0.0.1:${ports.h2}/healthz`]);
      return true;
    } catch { return false; }
  });
  browser = await launchBrowser({ ignoreHTTPSErrors: true });
});

after(async () => {
  await browser?.close();
  nginx?.kill('SIGTERM');
  await gapless?.stop();
  if (work) fs.rmSync(work, { recursive: true, force: true });
});

/** Opens STREAMS EventSources on one page through `origin`, publishes one event, and
 *  returns how many streams got it, and the protocol the page's requests used. */
async function streamsServed(origin, channel) {
  const page = await browser.context.newPage();
  try {
    await page.goto(`${origin}/healthz`);
    await page.evaluate(({ n, channel }) => {
      window.got = new Array(n).fill(null);
      window.sources = [];
      for (let i = 0; i < n; i++) {
        const es = new EventSource(`/v1/channels/${channel}/sse`);
        es.onmessage = (e) => { window.got[i] = e.data; };
        window.sources.push(es);
      }
    }, { n: STREAMS, channel });
    // Every stream that has a connection is open before the publish.
    await waitFor('the streams that can connect to open', () => page.evaluate(
      () => window.sources.filter((es) => es.readyState === 1).length >= 6,
    ));
    await sleep(500);
    const r = await fetch(`${gapless.base}/v1/channels/${channel}/events`, { method: 'POST', body: 'hello' });
    assert.equal(r.status, 201);
    await sleep(2000);
    const got = await page.evaluate(() => window.got.filter((d) => d === 'hello').length);
    const protocol = await page.evaluate(
      () => performance.getEntriesByType('navigation')[0]?.nextHopProtocol ?? '',
    );
    await page.evaluate(() => window.sources.forEach((es) => es.close()));
    return { got, protocol };
  } finally {
    await page.close();
  }
}

test('behind nginx over HTTP/1.1 only 6 of 8 EventSources get an event: the 7th waits for a connection', async () => {
  const { got, protocol } = await streamsServed(`https://127.0.0.1:${ports.h1}`, 'proxy-h1');
  assert.equal(protocol, 'http/1.1');
  assert.equal(got, 6, `expected exactly 6 of ${STREAMS} streams to be served over HTTP/1.1, got ${got}`);
});

test('behind nginx over HTTP/2 all 8 EventSources get the event', async () => {
  const { got, protocol } = await streamsServed(`https://127.0.0.1:${ports.h2}`, 'proxy-h2');
  assert.equal(protocol, 'h2');
  assert.equal(got, STREAMS, `expected all ${STREAMS} streams to get the event over HTTP/2, got ${got}`);
});

test('behind nginx with gzip on for text/event-stream the event still arrives at once', async () => {
  const { got } = await streamsServed(`https://127.0.0.1:${ports.gzip}`, 'proxy-gzip');
  assert.equal(got, STREAMS, `expected all ${STREAMS} streams to get the event through gzip, got ${got}`);
  // curl gives up after 1 s (a stream does not end): its exit status is not the point.
  const head = spawnSync('curl', ['-sk', '--compressed', '--http2', '-D', '-', '-o', '/dev/null', '--max-time', '1',
    `https://127.0.0.1:${ports.gzip}/v1/channels/proxy-gzip/sse`]).stdout.toString();
  assert.match(head, /content-encoding: gzip/i, `this listener does compress streams:\n${head}`);
});
