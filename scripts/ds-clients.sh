#!/usr/bin/env bash
# Real Durable Streams clients against gapless across kill -9 (issue 19, "Real clients nobody
# here wrote"): the official TypeScript client @durable-streams/client (pinned in
# tests/durable-streams-clients/package-lock.json, run with node's test runner) and the Python
# client durable-streams (pinned in tests/durable-streams-clients/requirements.txt, run in a venv
# under the target dir). Each test starts its own gapless (a fresh --data-dir, a free port),
# creates a stream with the client, follows it live and appends while the server is killed with
# SIGKILL and restarted on the same port and data directory, and checks that the follower and
# a catch-up read see every message exactly once, in order: JSON and binary streams, SSE and
# long-poll. The integrations built on the protocol run beside them (issue 29): Yjs documents
# (yjs.test.mjs: the official Yjs server and providers), AI chat streams (ai.test.mjs: the AI SDK
# and TanStack AI transports) and StreamDB (state.test.mjs), all pinned in the same lockfile.
# docs/durable-streams.md, "Clients tested" and "Integrations", says what each test checks.
#
# Usage: scripts/ds-clients.sh
#   GAPLESS_BIN  the gapless binary to test (default: target/debug/gapless, built here with
#                `cargo build -p gapless` when GAPLESS_BIN is not set)
#
# Installs tests/durable-streams-clients/node_modules (npm ci) when missing or older than the
# lockfile, and the Python client into $CARGO_TARGET_DIR/ds-clients-venv-HASH (python3 with venv
# and pip) when missing. Prints each runner's report, then one line:
# `ds-clients: N passed, M failed`; exits non-zero when a test failed or a runner did not report.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
dir="$repo/tests/durable-streams-clients"
start=$SECONDS

log() { printf 'ds-clients: %s\n' "$*" >&2; }
. "$repo/scripts/lib/setup.sh"

ensure_node_modules "$dir" node_modules/@durable-streams/client/package.json
# ai.test.mjs drives the chat app of examples/ai-chat, which has its own pins.
ensure_node_modules "$repo/examples/ai-chat" node_modules/ai/package.json
ensure_gapless_bin

# The venv's name carries a hash of the pins, so changing them reinstalls.
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$repo/$target" ;; esac
mkdir -p "$target"
pins="$dir/requirements.txt"
venv="$target/ds-clients-venv-$(sha256sum "$pins" | cut -c1-12)"
if ! "$venv/bin/python" -c 'import durable_streams' >/dev/null 2>&1; then
  log "installing the Python client into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$pins"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$dir"

# The timeouts only guard CI against a hang: each runner takes well under a minute.
log "TypeScript: @durable-streams/client $(node -p 'require("./node_modules/@durable-streams/client/package.json").version')"
ts_status=0
# --test-force-exit: the Yjs provider (0.2.7) leaves a handle open after destroy(), which
# would keep yjs.test.mjs's process alive once its tests have passed.
timeout -k 10 300 node --test --test-force-exit --test-reporter=tap ./*.test.mjs </dev/null \
  2>&1 | tee "$work/ts.log" || ts_status=$?
ts_pass=$(awk '/^# pass / {print $3}' "$work/ts.log")
ts_fail=$(awk '/^# fail / {print $3}' "$work/ts.log")

log "Python: durable-streams $("$venv/bin/python" -c 'from importlib.metadata import version; print(version("durable-streams"))')"
py_status=0
timeout -k 10 300 "$venv/bin/python" clients_test.py </dev/null \
  2>&1 | tee "$work/py.log" || py_status=$?
read -r py_pass py_fail < <(awk '/^python: [0-9]+ passed, [0-9]+ failed$/ {print $2, $4}' "$work/py.log") || true

failed=0
if [ -z "$ts_pass" ] || [ -z "$ts_fail" ]; then
  log "the TypeScript tests did not report (exit $ts_status)"
  ts_pass=0 ts_fail=0 failed=1
fi
if [ -z "${py_pass:-}" ] || [ -z "${py_fail:-}" ]; then
  log "the Python tests did not report (exit $py_status)"
  py_pass=0 py_fail=0 failed=1
fi
passed=$((ts_pass + py_pass))
fails=$((ts_fail + py_fail))
log "finished in $((SECONDS - start)) s"
echo "ds-clients: $passed passed, $fails failed"
[ "$failed" -eq 0 ] && [ "$fails" -eq 0 ] && [ "$ts_status" -eq 0 ] && [ "$py_status" -eq 0 ]
