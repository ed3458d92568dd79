#!/usr/bin/env bash
# The Durable Streams server conformance suite (@durable-streams/server-conformance-tests,
# pinned in tests/durable-streams/package-lock.json) against a gapless it starts: `--memory`,
# a free port, the Durable Streams prefix `/ds` and `--ds-long-poll-timeout-ms 500` (the
# suite's longPollTimeoutMs), subscriptions on, and `--ds-webhook-allow-loopback` (the suite's
# webhook receivers listen on 127.0.0.1). docs/durable-streams.md describes the mapping.
#
# Usage: scripts/ds-conformance.sh
#   GAPLESS_BIN  the gapless binary to test (default: target/debug/gapless, built here with
#                `cargo build -p gapless` when GAPLESS_BIN is not set)
#   DS_URL       run against this server instead of starting a gapless (e.g. the protocol's
#                Node reference server, to check the harness); the floor is not applied then
#
# Installs tests/durable-streams/node_modules (npm ci) when missing or older than the lockfile.
# Prints vitest's report, then one line: `ds-conformance: N passed, M failed, K skipped`.
#
# The suite does not pass whole yet, so failing conformance tests do not fail this script.
# It exits non-zero when the suite could not run at all (no report), or when fewer tests pass
# than the floor in tests/durable-streams/passing (progress cannot regress; raise the number
# there when more pass).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
dir="$repo/tests/durable-streams"
start=$SECONDS

log() { printf 'ds-conformance: %s\n' "$*" >&2; }
. "$repo/scripts/lib/setup.sh"

ensure_node_modules "$dir" node_modules/.bin/vitest

work="$(mktemp -d)"
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

floor_applies=0
if [ -z "${DS_URL:-}" ]; then
  ensure_gapless_bin
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  log "starting $GAPLESS_BIN on 127.0.0.1:$port"
  "$GAPLESS_BIN" serve --memory --listen "127.0.0.1:$port" --ds-prefix /ds \
    --ds-long-poll-timeout-ms 500 --ds-webhook-allow-loopback >"$work/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    if curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$work/server.log" >&2
      log "gapless exited before it was ready"
      exit 1
    fi
    sleep 0.1
  done
  export DS_URL="http://127.0.0.1:$port/ds"
  floor_applies=1
fi

log "running the suite against $DS_URL"
cd "$dir"
status=0
# The timeout only guards CI against a hang: a run takes about a minute.
timeout -k 10 600 node_modules/.bin/vitest run --reporter=default --reporter=json \
  --outputFile="$work/report.json" </dev/null || status=$?
if [ ! -s "$work/report.json" ]; then
  log "the suite did not run (vitest exit $status, no report)"
  exit 1
fi
read -r passed failed skipped < <(node -e '
  const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  const skipped = (r.numPendingTests || 0) + (r.numTodoTests || 0);
  console.log(r.numPassedTests, r.numFailedTests, skipped);
' "$work/report.json")
log "finished in $((SECONDS - start)) s (vitest exit $status)"
echo "ds-conformance: $passed passed, $failed failed, $skipped skipped"
if [ "$floor_applies" = 1 ]; then
  floor="$(tr -dc '0-9' <"$dir/passing")"
  if [ "$passed" -lt "${floor:-0}" ]; then
    log "only $passed passed; tests/durable-streams/passing holds the floor $floor"
    exit 1
  fi
  if [ "$passed" -gt "${floor:-0}" ]; then
    log "$passed passed, more than the floor $floor: raise tests/durable-streams/passing"
  fi
fi
