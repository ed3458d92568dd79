#!/usr/bin/env bash
# Runs every gapless-bench scenario at tiny sizes against gapless only (its own
# API over SSE and over WebSocket, its Durable Streams paths under /ds, and a
# two-node cluster), and the sweep driver bench/sweep.sh at two points, so the
# harness cannot rot. Checks counts (nothing lost, nothing duplicated), never
# speed: gapless-bench exits 2 when a count is not exact. Builds nothing.
#
# Usage: scripts/bench-smoke.sh
#   GAPLESS_BIN    gapless binary        (default target/debug/gapless)
#   GAPLESS_BENCH  gapless-bench binary  (default target/debug/gapless-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/listening.sh
GAPLESS_BIN=${GAPLESS_BIN:-target/debug/gapless}
GAPLESS_BENCH=${GAPLESS_BENCH:-target/debug/gapless-bench}
for b in "$GAPLESS_BIN" "$GAPLESS_BENCH"; do
  [ -x "$b" ] || { echo "bench-smoke: $b not built (cargo build -p gapless -p gapless-bench)" >&2; exit 1; }
done

WORK=$(mktemp -d)
PID=""
cleanup() {
  if [ -n "$PID" ]; then
    kill -TERM "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# Port 0: gapless picks a free port and prints the address it bound.
# The namespace `presence` has presence, for the `presence` scenario.
printf '[namespaces.presence]\npresence = true\npresence_linger_ms = 0\n' >"$WORK/g.toml"
"$GAPLESS_BIN" serve --listen 127.0.0.1:0 --data-dir "$WORK/data" --config "$WORK/g.toml" >"$WORK/server.log" 2>&1 &
PID=$!
ADDR=""
for _ in $(seq 100); do
  ADDR=$(grep -oE '127\.0\.0\.1:[0-9]+' "$WORK/server.log" | grep -v ':0$' | head -n1 || true)
  [ -n "$ADDR" ] && curl -fs -o /dev/null "http://$ADDR/healthz" && break
  ADDR=""
  sleep 0.1
done
[ -n "$ADDR" ] || { echo "bench-smoke: gapless did not start" >&2; cat "$WORK/server.log" >&2; exit 1; }

run() {
  echo "== gapless-bench $*"
  timeout 60 "$GAPLESS_BENCH" --addr "$ADDR" --server-pid "$PID" --timeout-secs 20 \
    --json "$WORK/results.jsonl" "$@" >"$WORK/out.txt" 2>&1 || {
    cat "$WORK/out.txt"
    echo "bench-smoke: FAILED: $*" >&2
    exit 1
  }
  grep -E 'counts|deliveries |events_acked|events_read|joins_delivered|leaves_delivered|streams_created|appends_acked' "$WORK/out.txt" | sed 's/^ */   /'
}

run idle --subs 4 --hold-ms 50
run idle --subs 4 --one-channel --hold-ms 50
run fanout --subs 4 --events 25 --bytes 100
run fanout --subs 3 --events 20 --rate 200 --publishers 2
run channels --channels 3 --subs-per-channel 2 --events 30 --publishers 2
run storm --subs 4 --behind 10 --linger-ms 100
run publish --publishers 4 --events 40
run publish --publishers 3 --events 30 --one-channel
run history --events 120 --page 25 --publishers 4
run presence --members 20 --duration-ms 500 --hold-ms 100 --watchers 2
# Scale and growth: several channels per connection (every event of every channel once, in
# order per channel), the same split one connection per channel, and events published one at
# a time to many subscribers.
run multi --subs 3 --channels-per-sub 4 --events 40 --hold-ms 50
run multi --subs 3 --channels-per-sub 3 --channels 5 --events 30 --hold-ms 50 --split
run burst --subs 5 --events 3 --pause-ms 20

# WebSocket subscribers (--transport ws: /v1/ws, one subscribe each, event messages counted
# exactly; storm resumes from each subscriber's last event cursor).
run --transport ws idle --subs 4 --hold-ms 50
run --transport ws idle --subs 4 --one-channel --hold-ms 50
run --transport ws fanout --subs 4 --events 25 --bytes 100
run --transport ws fanout --subs 3 --events 20 --rate 200 --publishers 2
run --transport ws channels --channels 3 --subs-per-channel 2 --events 30 --publishers 2
run --transport ws storm --subs 4 --behind 10 --linger-ms 100
run --transport ws burst --subs 4 --events 3 --pause-ms 20

# The Durable Streams scenarios (--kind gapless-ds; electric and dsnode speak the same protocol):
# streams created with PUT, SSE data/control events counted exactly, catch-up read paging on
# Stream-Next-Offset.
run --kind gapless-ds idle --subs 4 --one-channel --hold-ms 50
run --kind gapless-ds fanout --subs 4 --events 25 --bytes 100
run --kind gapless-ds fanout --subs 3 --events 20 --rate 200
run --kind gapless-ds --ds-type text channels --channels 2 --subs-per-channel 2 --events 20 --publishers 2
run --kind gapless-ds storm --subs 3 --behind 10 --linger-ms 100
run --kind gapless-ds publish --publishers 4 --events 40
run --kind gapless-ds history --events 120 --publishers 4
# Many streams: created, two appends each with idempotent-producer headers (every answer 200)
# and two plain ones, a sample read back exactly and in order.
run --kind gapless-ds streams --streams 50 --appends-per-stream 2 --connections 4 --check-sample 20 --settle-ms 0

# The sweep driver (bench/sweep.sh, via bench/compare: a fresh server per point) at two points
# per sweep, on gapless's own API and its Durable Streams paths: every point's counts exact, and
# each plot a well-formed SVG with one line per target.
echo "== bench/sweep.sh subs rates (2 points each; gapless, gapless-ds)"
env GAPLESS_BIN="$GAPLESS_BIN" GAPLESS_BENCH="$GAPLESS_BENCH" TARGETS="gapless gapless-ds" SUBS="3 6" \
  RATES="50 0" RATE_SUBS=3 SECS=1 MAX_EVENTS=50 DELIVERIES=60 HOLD_MS=50 OUTDIR="$WORK/sweep" \
  timeout 120 bench/sweep.sh subs rates >"$WORK/sweep.txt" 2>&1 || {
  cat "$WORK/sweep.txt" "$WORK/sweep/sweep.log"
  echo "bench-smoke: FAILED: bench/sweep.sh" >&2
  exit 1
}
python3 - "$WORK/sweep" <<'PY'
import glob, json, os, sys
import xml.etree.ElementTree as ET
d = sys.argv[1]
ns = "{http://www.w3.org/2000/svg}"
runs = 0
for f in glob.glob(os.path.join(d, "*", "*.jsonl")):
    for line in open(f):
        r = json.loads(line)
        assert r["exact"], (f, r["problems"])
        runs += 1
assert runs == 12, f"{runs} runs, expected 12 (6 points x 2 targets)"
svgs = sorted(glob.glob(os.path.join(d, "*.svg")))
assert len(svgs) == 5, svgs
for f in svgs:
    root = ET.parse(f).getroot()
    # Series lines are drawn 2 wide, axes, mesh and legend marks 1 wide.
    lines = [p for p in root.iter(ns + "polyline") if p.get("stroke-width") == "2"]
    strokes = {p.get("stroke") for p in lines}
    texts = {(t.text or "").strip() for t in root.iter(ns + "text")}
    assert len(lines) == 2 and len(strokes) == 2, (f, len(lines), strokes)
    assert {"gapless", "gapless-ds"} <= texts, (f, texts)
print(f"   sweep: {runs} runs exact, {len(svgs)} SVG plots with one line per target")
PY

# Cluster mode (--nodes): two nodes on one Redis, subscribers and publishers spread over both.
REDIS_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$WORK/redis"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$WORK/redis" --save '' \
  --appendonly yes --appendfsync always --logfile "$WORK/redis.log" &
RPID=$!
trap 'kill -TERM "$RPID" ${N2:-} 2>/dev/null || true; cleanup' EXIT
until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.05; done
kill -TERM "$PID"; wait "$PID" 2>/dev/null || true
start_node() {
  "$GAPLESS_BIN" serve --listen 127.0.0.1:0 --redis "redis://127.0.0.1:$REDIS_PORT" >"$WORK/$1.log" 2>&1 &
  eval "$2=\$!"
  local a
  a=$(listening_addr "$WORK/$1.log") || { echo "bench-smoke: cluster node did not start" >&2; exit 1; }
  eval "$3=$a"
}
start_node n1 PID ADDR
start_node n2 N2 ADDR2
run fanout --subs 4 --events 25 --rate 200 --nodes "$ADDR2"
run publish --publishers 4 --events 40 --nodes "$ADDR2"
run --transport ws fanout --subs 4 --events 25 --rate 200 --nodes "$ADDR2"
# The heartbeat burst (bench/herd.sh): idle streams in batches beside a fan-out, tiny.
IDLE=8 BATCHES=2 STAGGER_MS=100 HEARTBEAT_MS=400 SUBS=3 RATE=20 SECS=1 OUT="$WORK/herd" \
  GAPLESS_BIN="$GAPLESS_BIN" GAPLESS_BENCH="$GAPLESS_BENCH" bench/herd.sh >"$WORK/herd.txt" 2>&1 || {
  echo "bench-smoke: bench/herd.sh failed" >&2; cat "$WORK/herd.txt" >&2; exit 1; }
grep -q '| counts | exact |' "$WORK/herd.txt" || {
  echo "bench-smoke: bench/herd.sh's fan-out was not exact" >&2; cat "$WORK/herd.txt" >&2; exit 1; }
echo "   herd: exact"
echo "bench-smoke: 30 scenario runs, a 12-run sweep and the heartbeat-burst run exact"
