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
. "$repo/scripts/lib/setup.sh"

ensure_chromium
ensure_node_modules "$dir" node_modules/playwright-core
ensure_gapless_bin

# nginx (Debian's package) for the proxy test (tests/browser/proxy.test.mjs).
if ! command -v nginx >/dev/null 2>&1; then
  log "installing nginx (apt)"
  apt_install nginx
fi

# The test (node's built-in runner; non-zero exit on any failure). The timeout only
# guards CI against a hang: a normal run takes well under a minute.
log "running tests/browser/*.test.mjs against $GAPLESS_BIN"
cd "$dir"
status=0
timeout -k 10 240 node --test eventsource.test.mjs ws.test.mjs auth.test.mjs console.test.mjs proxy.test.mjs </dev/null || status=$?
log "finished in $((SECONDS - start)) s (exit $status)"
exit "$status"
