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

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi
}

# 1. Chromium (Debian's package; playwright's own browser downloads do not work here).
if [ ! -x /usr/bin/chromium ]; then
  log "installing chromium (apt)"
  apt_log="$(mktemp)"
  if ! { as_root apt-get update -qq &&
         as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
       >"$apt_log" 2>&1 </dev/null; then
    tail -n 30 "$apt_log" >&2
    log "chromium install failed"
    exit 1
  fi
  rm -f "$apt_log"
fi

# 2. node_modules, only when missing or installed from another lockfile.
stamp="$dir/node_modules/.gapless-lock.sha256"
want="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
if [ ! -x "$dir/node_modules/.bin/tsc" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "npm ci in clients/typescript"
  (cd "$dir" && npm ci --no-audit --no-fund --no-update-notifier --loglevel=error </dev/null)
  echo "$want" >"$stamp"
fi

# 3. The binary.
if [ -z "${GAPLESS_BIN:-}" ]; then
  log "cargo build -p gapless"
  cargo build -q -p gapless </dev/null
  GAPLESS_BIN="$repo/target/debug/gapless"
fi
case "$GAPLESS_BIN" in /*) ;; *) GAPLESS_BIN="$repo/$GAPLESS_BIN" ;; esac
if [ ! -x "$GAPLESS_BIN" ]; then
  log "GAPLESS_BIN=$GAPLESS_BIN is not an executable"
  exit 1
fi
export GAPLESS_BIN

# 4. Build (strict tsc: type errors fail the run), then the tests. The timeout only guards
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
