#!/usr/bin/env bash
# Three gapless nodes on one Redis, on this machine (docs/cluster.md).
#
# Usage: scripts/cluster-demo.sh
#   REDIS_PORT   Redis port (default 6390)
#   BASE_PORT    first node's port; the nodes listen on BASE_PORT, +1, +2 (default 8081)
#   GAPLESS_BIN  the gapless binary (default: $CARGO_TARGET_DIR/release/gapless, with
#                CARGO_TARGET_DIR defaulting to target; built here if missing)
#
# Redis runs with the settings --durability sync needs (appendonly yes, appendfsync always,
# maxmemory-policy noeviction), its data in a temporary directory. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
redis_port="${REDIS_PORT:-6390}"
base="${BASE_PORT:-8081}"
bin="${GAPLESS_BIN:-${CARGO_TARGET_DIR:-target}/release/gapless}"
if [ ! -x "$bin" ]; then cargo build --release -p gapless; fi
command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install redis-server" >&2; exit 1; }

dir="$(mktemp -d)"
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM

redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$dir" --save '' \
  --appendonly yes --appendfsync always --maxmemory-policy noeviction \
  --logfile "$dir/redis.log" &
pids+=($!)
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.1; done

for i in 0 1 2; do
  port=$((base + i))
  "$bin" serve --listen "127.0.0.1:$port" --redis "redis://127.0.0.1:$redis_port" \
    2>"$dir/node-$port.log" &
  pids+=($!)
done
for i in 0 1 2; do
  until curl -fs "http://127.0.0.1:$((base + i))/readyz" >/dev/null; do sleep 0.1; done
done
cat <<MSG
Redis on 127.0.0.1:$redis_port; nodes on http://127.0.0.1:$base, :$((base + 1)), :$((base + 2)).
Try:  curl -N http://127.0.0.1:$((base + 1))/v1/channels/news/sse
      curl -d hello http://127.0.0.1:$base/v1/channels/news/events
Logs in $dir. Ctrl-C stops everything.
MSG
wait
