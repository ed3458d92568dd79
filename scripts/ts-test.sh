#!/usr/bin/env bash
# The TypeScript SDK (clients/typescript, @gapless/client): builds it with tsc and runs its
# tests with node's test runner: unit tests (SSE parser, backoff, the join's tip filter,
# authorization against scripted servers), integration tests against the real gapless binary
# in Node, and real-browser tests in headless Chromium (playwright-core) through the example
# page examples/browser/.
#
# Usage: scripts/ts-test.sh
#   GAPLESS_BIN  the gapless binary to test (default: target/debug/gapless, built here with
#                `cargo build -p gapless` when GAPLESS_BIN is not set)
#
# Installs what it needs, idempotently: Debian's chromium (apt) when /usr/bin/chromium is
# missing, and clients/typescript/node_modules (npm ci) when missing or older than the
# lockfile. Prints TAP; its last lines are "# pass N" and "# fail N". Exits non-zero when
# anything fails.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
dir="$repo/clients/typescript"
start=$SECONDS

log() { printf 'ts-test: %s\n' "$*" >&2; }
. "$repo/scripts/lib/setup.sh"

ensure_chromium
ensure_node_modules "$dir" node_modules/.bin/tsc
ensure_gapless_bin

# Build (strict tsc: type errors fail the run), then the tests. The timeout only guards
# CI against a hang: a normal run takes about a minute.
cd "$dir"
rm -rf dist
log "tsc"
node_modules/.bin/tsc -p tsconfig.json
log "tsc: the public types as the README uses them (test/types/usage.ts)"
node_modules/.bin/tsc -p test/types/tsconfig.json
log "running the SDK's tests against $GAPLESS_BIN"
status=0
timeout -k 10 300 node --test --test-force-exit --test-reporter=tap \
  test/unit/*.test.mjs test/integration/*.test.mjs test/browser/*.test.mjs </dev/null || status=$?
log "finished in $((SECONDS - start)) s (exit $status)"
exit "$status"
