#!/usr/bin/env bash
# The OpenAPI check: schemathesis (pinned with every dependency in
# scripts/schemathesis-requirements.txt) drives a running debug gapless over
# every operation of the server's own /v1/openapi.json, with every check it
# has, and fails on any finding: a 5xx, a response that breaks the document
# (undocumented status, content type or header, a body or an SSE event that
# breaks its schema), a schema-valid request refused or an invalid one
# accepted (but for the rules listed in scripts/schemathesis.toml), or a
# server that died or panicked. Server-Sent Events are read for a fraction
# of a second each and their events validated; the two WebSocket upgrades
# are left to crates/gapless/tests/it/openapi.rs (schemathesis speaks HTTP only).
#
# Two runs: an open server, then one with a JWT key, where every request
# carries a token and schemathesis also checks that the operations the
# document marks as secured refuse a request without one.
#
# Installs schemathesis into a venv under the target dir when missing
# (python3 with venv and pip). Builds nothing.
#
# Usage: scripts/schemathesis.sh
#   GAPLESS_BIN            gapless binary (default $target/debug/gapless)
#   SCHEMATHESIS_EXAMPLES  most test cases per operation and phase (default 15;
#                          the run with a key, which is there for the tokens,
#                          takes a third of it and skips the coverage phase)
#   SCHEMATHESIS_SEED      seed (default 1, so a run can be replayed; any
#                          number, or `random` for a fresh one)
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
bin="${GAPLESS_BIN:-$target/debug/gapless}"
examples="${SCHEMATHESIS_EXAMPLES:-15}"
seed="${SCHEMATHESIS_SEED:-1}"
[ -x "$bin" ] || { echo "schemathesis: $bin not built (cargo build -p gapless)" >&2; exit 1; }

# The venv's name carries a hash of the pins, so changing them reinstalls.
pins=scripts/schemathesis-requirements.txt
venv="$target/schemathesis-venv-$(sha256sum "$pins" | cut -c1-12)"
st="$venv/bin/schemathesis"
if ! "$st" --version >/dev/null 2>&1; then
  echo "installing schemathesis into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$pins"
fi
"$st" --version

work=$(mktemp -d)
pid=""
stop() {
  if [ -n "$pid" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
  fi
}
trap 'stop; rm -rf "$work"' EXIT

# Starts `gapless serve --memory` on a free port with extra flags; sets pid and addr.
start() {
  "$bin" serve --memory --listen 127.0.0.1:0 "$@" >"$work/server.log" 2>&1 &
  pid=$!
  addr=""
  for _ in $(seq 100); do
    addr=$(grep -oE '127\.0\.0\.1:[0-9]+' "$work/server.log" | grep -v ':0$' | head -n1 || true)
    [ -n "$addr" ] && curl -fs -o /dev/null "http://$addr/healthz" && return 0
    addr=""
    sleep 0.1
  done
  echo "schemathesis: gapless did not start" >&2
  cat "$work/server.log" >&2
  exit 1
}

# Runs schemathesis (NAME, EXAMPLES per operation) against the server started
# last; extra arguments go to `schemathesis run`. Fails on any finding, and on
# a server that died or panicked.
run() {
  local name=$1 examples=$2
  shift 2
  local log="$target/schemathesis-$name.log"
  local seed_args=(--seed "$seed")
  [ "$seed" = random ] && seed_args=()
  local status=0
  "$st" --config-file scripts/schemathesis.toml run "http://$addr/v1/openapi.json" \
    --checks all --max-examples "$examples" --request-timeout 5 \
    --no-color --output-truncate true "${seed_args[@]}" "$@" >"$log" 2>&1 || status=$?
  # The summary: what ran, what was found, and the seed to replay it.
  sed -n '/^=* SUMMARY =*$/,$p' "$log"
  if [ "$status" -ne 0 ]; then
    echo "schemathesis ($name): findings (exit $status); the whole report: $log" >&2
    sed -n '/^=* FAILURES =*$/,/^=* SUMMARY =*$/p' "$log" | head -n 200 >&2
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "schemathesis ($name): the server died" >&2
    tail -n 50 "$work/server.log" >&2
    status=1
  elif grep -q "panicked" "$work/server.log"; then
    echo "schemathesis ($name): the server panicked" >&2
    grep -A5 "panicked" "$work/server.log" >&2
    status=1
  fi
  stop
  return "$status"
}

failed=0
echo "every operation but the two WebSocket upgrades (ws_channels, ws_session: schemathesis speaks"
echo "HTTP only; crates/gapless/tests/it/openapi.rs checks their answers); each SSE stream is read"
echo "for 0.3 s and its events validated (scripts/schemathesis.toml)"

echo "-- an open server"
start
run open "$examples" || failed=$((failed + 1))

echo "-- a server with a JWT key (every request carries a token)"
secret=$(head -c 48 /dev/urandom | base64 | tr -d '\n')
token=$("$bin" token --secret "$secret" --subscribe '*' --publish '*' --ttl 3600)
start --jwt-secret "$secret"
# Its coverage phase (boundary values, the same as the open run's) is left out.
run jwt "$(( (examples + 2) / 3 ))" --phases examples,fuzzing,stateful \
  -H "Authorization: Bearer $token" || failed=$((failed + 1))

echo "openapi: $((2 - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]
