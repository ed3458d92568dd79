#!/usr/bin/env bash
# Real-browser test: headless Debian Chromium, driven by playwright-core, follows a gapless
# SSE stream while the server is killed (-9) and restarted; see tests/browser/.
#
# Usage: scripts/browser-test.sh
#   GAPLESS_BIN  the gapless binary to test (default: target/debug/gapless, built here with
#                `cargo build -p gapless` when GAPLESS_BIN is not set)
#
# Installs what it needs, idempotently: Debian's chromium (apt) when /usr/bin/chromium is
# missing, nginx (apt) when missing, and tests/browser/node_modules (npm ci) when missing or
# older than the lockfile.
# Works non-interactively as root (CI); exits non-zero when anything fails.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
dir="$repo/tests/browser"
start=$SECONDS

log() { printf 'browser-test: %s\n' "$*" >&2; }

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

# 1b. nginx (Debian's package) for the proxy test (tests/browser/proxy.test.mjs).
if ! command -v nginx >/dev/null 2>&1; then
  log "installing nginx (apt)"
  apt_log="$(mktemp)"
  if ! { as_root apt-get update -qq &&
         as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx; } \
       >"$apt_log" 2>&1 </dev/null; then
    tail -n 30 "$apt_log" >&2
    log "nginx install failed"
    exit 1
  fi
  rm -f "$apt_log"
fi

# 2. node_modules, only when missing or installed from another lockfile.
stamp="$dir/node_modules/.gapless-lock.sha256"
want="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
if [ ! -d "$dir/node_modules/playwright-core" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "npm ci in tests/browser"
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

# 4. The test (node's built-in runner; non-zero exit on any failure). The timeout only
# guards CI against a hang: a normal run takes well under a minute.
log "running tests/browser/*.test.mjs against $GAPLESS_BIN"
cd "$dir"
status=0
timeout -k 10 240 node --test eventsource.test.mjs ws.test.mjs auth.test.mjs console.test.mjs proxy.test.mjs </dev/null || status=$?
log "finished in $((SECONDS - start)) s (exit $status)"
exit "$status"
