#!/usr/bin/env bash
# The heartbeat burst (docs/performance.md, "The heartbeat burst"): how much a
# server's heartbeats delay a live event. IDLE subscribers of one channel are
# opened in BATCHES batches STAGGER_MS apart (as connections arrive over time in
# a real deployment), all heartbeating every HEARTBEAT_MS; then a fan-out of
# SUBS subscribers on another channel runs at RATE events/s for SECS seconds,
# and its latency percentiles show what the heartbeat writes on the same
# fan-out threads cost it. gapless only; run it with each binary to compare.
#
# Usage: GAPLESS_BIN=... bench/herd.sh      (prints the fan-out's table; exits non-zero when a
#        count is not exact: gapless-bench exits 2 then)
# Environment (defaults): IDLE 10000, BATCHES 4, STAGGER_MS 500, HEARTBEAT_MS 2000,
#   SUBS 200, RATE 20, SECS 30, GAPLESS_BIN target/release/gapless,
#   GAPLESS_BENCH target/release/gapless-bench, OUT (default a temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
GAPLESS_BIN=${GAPLESS_BIN:-$ROOT/target/release/gapless}
GAPLESS_BENCH=${GAPLESS_BENCH:-$ROOT/target/release/gapless-bench}
IDLE=${IDLE:-10000}; BATCHES=${BATCHES:-4}; STAGGER_MS=${STAGGER_MS:-500}
HEARTBEAT_MS=${HEARTBEAT_MS:-2000}; SUBS=${SUBS:-200}; RATE=${RATE:-20}; SECS=${SECS:-30}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
# shellcheck source=../scripts/lib/listening.sh
. "$ROOT/scripts/lib/listening.sh"
"$GAPLESS_BIN" serve --listen 127.0.0.1:0 --data-dir "$OUT/data" --heartbeat-ms "$HEARTBEAT_MS" \
  --max-connections 19000 --max-connections-per-ip 0 >"$OUT/server.log" 2>&1 &
server=$!
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; kill "$server" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT
addr=$(listening_addr "$OUT/server.log") || { echo "herd: gapless did not start" >&2; exit 1; }
hold=$(( (SECS + 15) * 1000 + BATCHES * STAGGER_MS ))
for g in $(seq "$BATCHES"); do
  "$GAPLESS_BENCH" --addr "$addr" --prefix herd-idle --server-pid "$server" idle --subs $((IDLE / BATCHES)) --one-channel \
    --hold-ms "$hold" >"$OUT/idle-$g.log" 2>&1 &
  pids+=($!)
  sleep "$(awk -v ms="$STAGGER_MS" 'BEGIN { print ms / 1000 }')"
done
sleep 2
"$GAPLESS_BENCH" --addr "$addr" --server-pid "$server" --json "$OUT/fanout.jsonl" fanout --subs "$SUBS" \
  --events $((RATE * SECS)) --bytes 100 --rate "$RATE" --max-secs $((SECS * 2)) >"$OUT/fanout.log" 2>&1
"$GAPLESS_BENCH" compare "$OUT/fanout.jsonl"
echo "results: $OUT"
