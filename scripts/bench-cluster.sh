#!/usr/bin/env bash
# Cluster mode beside the embedded single node and beside Redis's own ceiling for the append
# script (docs/performance.md, "Cluster mode"). For 1, 2 and 3 nodes on one Redis:
#   - publish throughput, 64 publishers spread over the nodes, with Redis at
#     `appendfsync always` (what --durability sync needs) and at `everysec` (async);
#   - fan-out: SUBS subscribers spread over the nodes, 200 events/s published on the first
#     node: end-to-end latency p50/p99 (also per node) and deliveries/s;
#   - the hop alone: two nodes, 200 events/s published on the first, all SUBS subscribers
#     on the first ("local"), then all on the second ("remote"): the same processes and
#     work, only the subscribers' node differs;
# and the same two on one embedded node (sync; publish also async), and `redis-benchmark`
# running the append script itself (EVALSHA, 64 clients) at both fsync settings.
#
# Usage: scripts/bench-cluster.sh            (release binaries; builds them when missing)
#   SUBS (1000) EVENTS (2000, at 200/s) PUB_EVENTS (30000)  sizes
#   OUT   directory for the JSON-lines results (default bench/results/cluster-DATE)
#   ONLY=fanout | ONLY=publish  run only that part (the Redis ceiling goes with publish)
#   NODE_COUNTS ("1 2 3")  cluster sizes to run; EMBEDDED=0 skips the embedded single node;
#   HOP=0 skips the hop-alone pair (run with two nodes)
#   GAPLESS_BIN, GAPLESS_BENCH  other binaries (e.g. an older build, to compare)
#   SMOKE=1  tiny sizes with the debug binaries: checks counts, not speed
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/listening.sh
if [ "${SMOKE:-0}" = 1 ]; then
  profile=debug; SUBS=${SUBS:-6}; EVENTS=${EVENTS:-40}; PUB_EVENTS=${PUB_EVENTS:-200}
else
  profile=release
fi
BIN=${GAPLESS_BIN:-target/$profile/gapless}
BENCH=${GAPLESS_BENCH:-target/$profile/gapless-bench}
SUBS=${SUBS:-1000}
EVENTS=${EVENTS:-2000}
PUB_EVENTS=${PUB_EVENTS:-30000}
OUT=${OUT:-bench/results/cluster-$(date -u +%Y%m%d-%H%M%S)}
if [ ! -x "$BIN" ] || [ ! -x "$BENCH" ]; then
  if [ "$profile" = release ]; then cargo build --release -p gapless -p gapless-bench; else cargo build -p gapless -p gapless-bench; fi
fi
script_src="$(cargo run -q $([ "$profile" = release ] && echo --release) -p gapless-redis --example append_script)"
command -v redis-server >/dev/null || { echo "bench-cluster: redis-server missing (apt-get install redis-server)" >&2; exit 1; }
mkdir -p "$OUT"
WORK=$(mktemp -d)
PIDS=()
stop_all() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
trap 'stop_all; rm -rf "$WORK"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

REDIS_PORT=""
start_redis() { # $1 = appendfsync
  REDIS_PORT=$(free_port)
  rm -rf "$WORK/redis"; mkdir -p "$WORK/redis"
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$WORK/redis" --save '' \
    --appendonly yes --appendfsync "$1" --maxmemory-policy noeviction \
    --logfile "$WORK/redis.log" &
  PIDS+=($!)
  REDIS_PID=$!
  until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.05; done
}

ADDRS=()
NODE_PIDS=()
start_node() { # extra serve args…
  local log="$WORK/node-${#PIDS[@]}.log"
  "$BIN" serve --listen 127.0.0.1:0 --max-connections-per-ip 0 "$@" >"$log" 2>&1 &
  PIDS+=($!)
  NODE_PIDS+=($!)
  local addr
  addr=$(listening_addr "$log") || { echo "bench-cluster: a node did not start" >&2; exit 1; }
  ADDRS+=("$addr")
}

bench() { # label file scenario args…
  local label=$1 file=$2; shift 2
  local nodes; nodes=$(IFS=,; echo "${ADDRS[*]:1}")
  local pids=(); for p in "${NODE_PIDS[@]}"; do pids+=(--server-pid "$p"); done
  echo "== $label: $*"
  "$BENCH" --addr "${ADDRS[0]}" ${nodes:+--nodes "$nodes"} "${pids[@]}" --label "$label" \
    --timeout-secs 60 --json "$OUT/$file.jsonl" "$@" | tee "$WORK/out.txt" |
    grep -E 'counts|events/s|deliveries|latency|p50|p99' | sed 's/^/   /' || true
}

hop() { # label file: publish on ADDRS[0], every subscriber on $3
  local label=$1 file=$2 sub=$3
  local pids=(); for p in "${NODE_PIDS[@]}"; do pids+=(--server-pid "$p"); done
  echo "== $label: fanout, subscribers on $sub"
  "$BENCH" --addr "${ADDRS[0]}" --sub-url "http://$sub/v1/channels/{channel}/sse" "${pids[@]}" \
    --label "$label" --timeout-secs 60 --json "$OUT/$file.jsonl" \
    fanout --subs "$SUBS" --events "$EVENTS" --rate 200 | tee "$WORK/out.txt" |
    grep -E 'counts|events/s|deliveries|latency|p50|p99' | sed 's/^/   /' || true
}

redis_ceiling() { # $1 = appendfsync
  start_redis "$1"
  local sha; sha=$(redis-cli -p "$REDIS_PORT" SCRIPT LOAD "$script_src")
  local payload; payload="n$(head -c 100 /dev/zero | tr '\0' x)"
  echo "== redis-benchmark, append script, appendfsync $1"
  redis-benchmark -p "$REDIS_PORT" -c 64 -n "$PUB_EVENTS" -r 1000 -q \
    EVALSHA "$sha" 1 'gapless:{rb__rand_int__}' rb '' 100000 86400000 12345 gapless:bus 4096 '' 60000 0 "$payload" |
    tee -a "$OUT/redis-ceiling-$1.txt"
  stop_all
}

ONLY=${ONLY:-}
publish() { [ "$ONLY" != fanout ]; }
fanout() { [ "$ONLY" != publish ]; }

if publish; then
  for fsync in always everysec; do
    redis_ceiling "$fsync"
  done
fi

for n in ${NODE_COUNTS-1 2 3}; do
  for fsync in always everysec; do
    if ! publish && [ "$fsync" != always ]; then continue; fi
    start_redis "$fsync"
    ADDRS=(); NODE_PIDS=()
    for _ in $(seq "$n"); do start_node --redis "redis://127.0.0.1:$REDIS_PORT"; done
    if publish; then
      bench "cluster-$n-$fsync" "publish-cluster-$n-$fsync" publish --publishers 64 --events "$PUB_EVENTS"
    fi
    if fanout && [ "$fsync" = always ]; then
      bench "cluster-$n" "fanout-cluster-$n" fanout --subs "$SUBS" --events "$EVENTS" --rate 200
      if [ "$n" = 2 ] && [ "${HOP:-1}" = 1 ]; then
        hop "hop-local" "fanout-hop-local" "${ADDRS[0]}"
        hop "hop-remote" "fanout-hop-remote" "${ADDRS[1]}"
      fi
    fi
    stop_all
  done
done

for durability in sync async; do
  if [ "${EMBEDDED:-1}" = 0 ]; then break; fi
  if ! publish && [ "$durability" != sync ]; then continue; fi
  ADDRS=(); NODE_PIDS=()
  rm -rf "$WORK/data"
  start_node --data-dir "$WORK/data" --durability "$durability"
  if publish; then
    bench "embedded-$durability" "publish-embedded-$durability" publish --publishers 64 --events "$PUB_EVENTS"
  fi
  if fanout && [ "$durability" = sync ]; then
    bench "embedded" "fanout-embedded" fanout --subs "$SUBS" --events "$EVENTS" --rate 200
  fi
  stop_all
done
echo "bench-cluster: results in $OUT"
