#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and integration tests against the
# real binary, the benchmark harness at tiny sizes, and the real-browser tests
# (installs Chromium and the npm packages they need), and each fuzz target for a
# few seconds (scripts/fuzz.sh; installs cargo-fuzz). Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target"

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "== build"
cargo build --workspace --all-targets --quiet

echo "== iptables (the vanished-client tests drop packets in a network namespace)"
if ! command -v iptables >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables >/dev/null 2>&1 \
            || (apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables >/dev/null 2>&1) \
            || echo "could not install iptables: the vanished-client tests will print SKIP"
    else
        echo "iptables missing and not root: the vanished-client tests will print SKIP"
    fi
fi

echo "== cargo test"
cargo test --workspace --quiet 2>&1 | tee "$target/cargo-test.log"
# cargo prints one "test result:" line per test binary; sum them into one closing line.
awk '/^test result:/ {for (i=1;i<=NF;i++) {if ($(i+1) ~ /^passed/) p+=$i; if ($(i+1) ~ /^failed/) f+=$i}} END {printf "rust: %d passed, %d failed\n", p, f}' "$target/cargo-test.log"

echo "== fuzz (each target briefly; FUZZ_SECONDS=600 scripts/fuzz.sh for 10 minutes each)"
FUZZ_SECONDS="${FUZZ_SECONDS:-5}" scripts/fuzz.sh

echo "== bench smoke (every scenario at tiny sizes; counts must be exact)"
GAPLESS_BIN="$target/debug/gapless" GAPLESS_BENCH="$target/debug/gapless-bench" scripts/bench-smoke.sh

echo "== browser"
GAPLESS_BIN="$(cd "$target" && pwd)/debug/gapless" scripts/browser-test.sh 2>&1 | tee "$target/browser-test.log"
bp=$(awk '/^# pass / {s+=$3} END {print s+0}' "$target/browser-test.log")
bf=$(awk '/^# fail / {s+=$3} END {print s+0}' "$target/browser-test.log")
rp=$(awk '/^test result:/ {for (i=1;i<=NF;i++) if ($(i+1) ~ /^passed/) p+=$i} END {print p+0}' "$target/cargo-test.log")
echo "all: $((rp + bp)) passed, $bf failed"
