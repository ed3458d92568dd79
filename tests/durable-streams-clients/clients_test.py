"""The Durable Streams Python client (PyPI `durable-streams`, pinned in requirements.txt) against
gapless across kill -9 (issue 19, "Real clients nobody here wrote"; docs/durable-streams.md,
"Clients tested"). Run by scripts/ds-clients.sh with GAPLESS_BIN set, in the venv it makes:
`python clients_test.py`; prints `python: N passed, M failed` last.

Each test creates a stream with the client (`DurableStream.create`), follows it live with the
client's reader (`stream(..., live=...)`, `iter_events`) in a thread, and appends with
`DurableStream.append(..., seq=...)` (`Stream-Seq`: this client has no idempotent producer),
while the server is killed with SIGKILL and restarted on the same port and data directory: once
while the follower waits at the tail, twice with an append in flight (the append is retried with
the same `Stream-Seq` until answered), and once before appends acknowledged earlier are sent
again (each must be refused with 409, nothing stored). The follower must see every message
exactly once, in order, a catch-up read from the start must hold exactly the messages, and
HEAD must name the offset the follower reached. (This client has no close.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import httpx
from durable_streams import DurableStream, SeqConflictError, stream

N = 40


class Gapless:
    """A gapless server: GAPLESS_BIN serving Durable Streams under /ds, with a fresh data
    directory, on a free port; kill -9 and restart on the same port and data directory (the
    TypeScript tests' gapless.mjs does the same)."""

    def __init__(self, extra: list[str]):
        self.bin = os.environ["GAPLESS_BIN"]
        self.extra = extra
        self.dir = tempfile.mkdtemp(prefix="gapless-ds-clients-py-")
        self.starts = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.addr = self._spawn("127.0.0.1:0")

    def url(self, path: str) -> str:
        return f"http://{self.addr}/ds/{path}"

    def _log_path(self) -> str:
        return os.path.join(self.dir, f"server-{self.starts}.log")

    def log(self) -> str:
        try:
            with open(self._log_path(), encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def _spawn(self, listen: str) -> str:
        self.starts += 1
        with open(self._log_path(), "wb") as err:
            proc = subprocess.Popen(
                [self.bin, "serve", "--listen", listen, "--data-dir",
                 os.path.join(self.dir, "data"), "--ds-prefix", "/ds", *self.extra],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
            )
        first: list[bytes] = []
        got = threading.Event()

        def drain() -> None:
            # The first line names the address; keep reading so the server never writes
            # into a closed pipe.
            assert proc.stdout is not None
            with proc.stdout:
                for line in proc.stdout:
                    if not first:
                        first.append(line)
                        got.set()
            got.set()

        threading.Thread(target=drain, daemon=True).start()
        got.wait(15)
        line = first[0].decode() if first else ""
        prefix = "gapless listening on http://"
        if not line.startswith(prefix):
            proc.kill()
            proc.wait()
            raise RuntimeError(f"gapless did not print its listening line ({line!r}); log:\n{self.log()}")
        self.proc = proc
        return line[len(prefix):].split()[0]

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.kill()  # SIGKILL
            self.proc.wait()
            self.proc = None

    def restart(self) -> None:
        """kill -9 if running, then start again on the same address; retries for up to 20 s
        in case the port is briefly held."""
        self.kill9()
        t0 = time.monotonic()
        while True:
            try:
                addr = self._spawn(self.addr)
                assert addr == self.addr, f"restarted on {addr}, not {self.addr}"
                return
            except RuntimeError:
                if time.monotonic() - t0 > 20:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        self.kill9()
        shutil.rmtree(self.dir, ignore_errors=True)


def json_message(i: int) -> dict:
    """The i-th message of a JSON stream: quotes, a newline, a CR, a line separator and
    non-ASCII, so SSE framing and JSON escaping are exercised."""
    return {"n": i, "text": f'message {i}: "quoted"\nline\r\u2028 snow \u2603 {"x" * (i % 7)}'}


def binary_message(i: int) -> bytes:
    """The i-th message of a binary stream: 16 bytes, its index first, then bytes that are not
    UTF-8 (0xff, a lone continuation byte, an encoded surrogate, 0xf8) and CR, LF, NUL."""
    return bytes([(i >> 8) & 0xFF, i & 0xFF, 0xFF, 0xFE, 0x00, 0x0A, 0x0D, 0xC3, 0x28, 0x80,
                  0xED, 0xA0, 0x80, 0xF8, (i & 0xFF) ^ 0xAA, 0x5C])


def describe_binary(got: bytes, want: bytes) -> str:
    if got == want:
        return "identical"
    idx = [int.from_bytes(got[at:at + 2], "big") for at in range(0, len(got) - 15, 16)]
    first = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return (f"{len(got)} bytes (want {len(want)}), first difference at byte {first}; "
            f"message indexes: {idx}")


class Follower:
    """Follows a stream from the start in a thread with the client's reader in `live` mode
    ("sse" or "long-poll"). The client's `on_error` retries a request the network refused (the
    server is down); a response cut by the server's death ends the client's iterator with an
    error, and the client's SSE iterator also simply ends when a response ends (it does not
    reconnect): either way the follower reads again from the `next_offset` of the last event it
    received, as an application does."""

    def __init__(self, url: str, live: str, json_mode: bool):
        self.url, self.live, self.json_mode = url, live, json_mode
        self.items: list = []
        self.data = bytearray()
        self.resumes: list[str] = []
        self.offset = "-1"
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def count(self) -> int:
        return len(self.items) if self.json_mode else len(self.data) // 16

    def _on_error(self, e: Exception):
        if self.stopping.is_set() or not isinstance(e, httpx.TransportError):
            return None  # raise it
        time.sleep(0.05)
        return {}  # retry the same request

    def _run(self) -> None:
        mode = "json" if self.json_mode else "bytes"
        while not self.stopping.is_set():
            try:
                with stream(self.url, offset=self.offset, live=self.live, timeout=10,
                            on_error=self._on_error) as res:
                    for ev in res.iter_events(mode=mode):
                        if self.json_mode:
                            self.items.extend(ev.data)
                        else:
                            self.data.extend(ev.data)
                        self.offset = ev.next_offset
                        if self.stopping.is_set():
                            return
                self.resumes.append("the read ended")
            except Exception as e:  # noqa: BLE001 - any error: read again from the offset
                if self.stopping.is_set():
                    return
                self.resumes.append(type(e).__name__)
                time.sleep(0.05)

    def stop(self) -> None:
        self.stopping.set()


def wait_for(what: str, cond, secs: float = 20) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > secs:
            raise AssertionError(f"timed out after {secs} s waiting for {what}")
        time.sleep(0.02)


class ClientAcrossKill9(unittest.TestCase):
    def scenario(self, name: str, content_type: str, live: str) -> None:
        json_mode = content_type == "application/json"
        message = json_message if json_mode else binary_message
        g = Gapless(["--ds-long-poll-timeout-ms", "1000"])
        self.addCleanup(g.stop)
        url = g.url(f"clients/py/{name}")
        notes: list[str] = []

        def kill(why: str) -> None:
            g.kill9()
            time.sleep(0.15)
            g.restart()
            notes.append(why)

        DurableStream.create(url, content_type=content_type).close()
        f = Follower(url, live, json_mode)
        self.addCleanup(f.stop)
        w = DurableStream(url, content_type=content_type, batching=False, timeout=10)
        self.addCleanup(w.close)
        retries = [0]

        def send(i: int) -> None:
            """Appends message i with Stream-Seq i, retrying a request the network refused or
            cut with the same Stream-Seq until it is answered. A retry refused with 409 means
            the earlier attempt was stored and acknowledged (the answer was lost)."""
            attempt = 0
            while True:
                try:
                    w.append(message(i), seq=f"{i:06d}")
                    return
                except httpx.TransportError:
                    attempt += 1
                    retries[0] += 1
                    self.assertLess(attempt, 400, f"append {i}: the server did not come back")
                    time.sleep(0.05)
                except SeqConflictError:
                    if attempt == 0:
                        raise
                    return

        for i in range(10):
            send(i)
        wait_for("the follower to see 10 messages", lambda: f.count() >= 10)

        # 1. Killed while the follower waits at the tail.
        kill("the follower is live at the tail")
        for i in range(10, 20):
            send(i)

        # 2. Killed with an append in flight, twice, at two delays.
        for i, delay in ((20, 0.0), (21, 0.002)):
            t = threading.Thread(target=send, args=(i,))
            t.start()
            time.sleep(delay)
            kill(f"append {i} in flight")
            t.join(30)
            self.assertFalse(t.is_alive(), f"append {i} was never answered")
        for i in range(22, 30):
            send(i)

        # 3. Killed, then appends acknowledged before the kill are sent again with their
        # Stream-Seq: each refused (409), nothing stored; then new ones.
        kill("before acknowledged appends are sent again")
        for i in range(25, 30):
            with self.assertRaises(SeqConflictError, msg=f"append {i} sent again"):
                w.append(message(i), seq=f"{i:06d}")
        for i in range(30, N):
            send(i)

        wait_for(f"the follower to see {N} messages", lambda: f.count() >= N)
        time.sleep(0.3)  # a duplicate would arrive now
        f.stop()

        # HEAD through the client names the offset the follower reached.
        head = w.head()
        self.assertEqual(head.offset, f.offset, "HEAD's offset is the follower's")
        self.assertEqual(head.content_type, content_type)

        want = [message(i) for i in range(N)]
        if json_mode:
            self.assertEqual([m.get("n") for m in f.items], list(range(N)),
                             "the follower saw each message once, in order")
            self.assertEqual(f.items, want, "the follower saw the messages exactly")
        else:
            self.assertEqual(describe_binary(bytes(f.data), b"".join(want)), "identical",
                             "the follower's bytes")

        # A catch-up read from the start, with a fresh reader.
        with stream(url, offset="-1", live=False, timeout=10) as res:
            if json_mode:
                self.assertEqual(res.read_json(), want, "a catch-up read holds each message once")
            else:
                self.assertEqual(describe_binary(res.read_bytes(), b"".join(want)), "identical",
                                 "a catch-up read's bytes")
        print(f"\n  {name}: kill -9 and restart: {'; '.join(notes)}; follower resumed "
              f"{len(f.resumes)} times ({', '.join(sorted(set(f.resumes)))}); "
              f"append retries: {retries[0]}", file=sys.stderr)

    def test_json_stream_followed_by_sse(self) -> None:
        self.scenario("json-sse", "application/json", "sse")

    def test_json_stream_followed_by_long_poll(self) -> None:
        self.scenario("json-long-poll", "application/json", "long-poll")

    def test_binary_stream_followed_by_long_poll(self) -> None:
        # The client refuses SSE on a binary stream (SSENotSupportedError): long-poll only.
        self.scenario("binary-long-poll", "application/octet-stream", "long-poll")


class CatchUpLongerThanOneAnswer(unittest.TestCase):
    """gapless answers a catch-up read with at most 1000 messages and about 4 MiB (then without
    Stream-Up-To-Date; PROTOCOL.md allows such chunks). The client's `read_*` with `live="auto"`
    read on until up to date; with `live=False` the client stops after the first answer,
    whatever Stream-Up-To-Date said (docs/durable-streams.md, "Clients tested")."""

    def test_a_catch_up_read_longer_than_one_answer_is_whole(self) -> None:
        g = Gapless([])
        self.addCleanup(g.stop)
        url = g.url("clients/py/long-json")
        DurableStream.create(url, content_type="application/json").close()
        items = [{"i": i} for i in range(2500)]
        for k in range(0, len(items), 500):
            # Raw POSTs of 500 messages each (the client's append() makes one message of its
            # argument).
            r = httpx.post(url, content=json.dumps(items[k:k + 500]),
                           headers={"content-type": "application/json"})
            self.assertEqual(r.status_code, 204, r.text)
        with stream(url, offset="-1", live="auto", timeout=10) as res:
            self.assertEqual(res.read_json(), items)
        with stream(url, offset="-1", live=False, timeout=10) as res:
            n = len(res.read_json())
        print(f"\n  live=False read {n} of {len(items)} messages (one answer)", file=sys.stderr)

        burl = g.url("clients/py/long-binary")
        chunks = [bytes((i * 7919 + k * 31) & 0xFF for i in range(900 * 1024)) for k in range(6)]
        with DurableStream.create(burl, content_type="application/octet-stream",
                                  timeout=10) as h:
            for c in chunks:
                h.append(c)
        with stream(burl, offset="-1", live="auto", timeout=10) as res:
            got = res.read_bytes()
        self.assertEqual(describe_binary(got, b"".join(chunks)), "identical")


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    failed = len(result.failures) + len(result.errors)
    print(f"python: {result.testsRun - failed} passed, {failed} failed")
    sys.exit(1 if failed or not result.wasSuccessful() else 0)
