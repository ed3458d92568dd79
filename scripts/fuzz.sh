#!/usr/bin/env bash
# Builds the cargo-fuzz targets in fuzz/ (nightly; installs cargo-fuzz if
# missing) and runs each for FUZZ_SECONDS (default 5) on its corpus in
# fuzz/corpus/<target>, seeded from fuzz/seeds/<target>. A crash fails the
# script and leaves its input in fuzz/artifacts/<target>/.
# Usage: scripts/fuzz.sh [target...]     FUZZ_SECONDS=600 scripts/fuzz.sh
#
# Short runs (under a minute each, as in scripts/test.sh) use an unoptimized build with
# debug assertions and overflow checks (about 3 minutes cold on 2 cores, where the optimized
# build takes about 8); longer runs use the optimized build, which executes inputs several
# times faster. FUZZ_PROFILE=dev|release overrides the choice. Both keep AddressSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-5}"
profile="${FUZZ_PROFILE:-$([ "$seconds" -lt 60 ] && echo dev || echo release)}"
case "$profile" in
    dev) build_flag=--dev ;;
    release) build_flag=-O ;;
    *) echo "FUZZ_PROFILE must be dev or release, not $profile" >&2; exit 64 ;;
esac

if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --help >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

cd fuzz
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
build_log="$(mktemp)"
if ! cargo +nightly fuzz build "$build_flag" >"$build_log" 2>&1; then
    tail -60 "$build_log"
    echo "fuzz: build FAILED"
    exit 1
fi
rm -f "$build_log"

failed=()
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    seeds=()
    [ -d "seeds/$t" ] && seeds=("seeds/$t")
    log="$(mktemp)"
    if ! cargo +nightly fuzz run "$build_flag" "$t" "corpus/$t" "${seeds[@]}" -- \
        -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
        tail -40 "$log"
        echo "fuzz: $t FAILED (input in fuzz/artifacts/$t/)"
        failed+=("$t")
        continue
    fi
    runs=$(awk '/^stat::number_of_executed_units:/ {print $2}' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
    corpus=$(find "corpus/$t" -type f | wc -l)
    echo "fuzz: $t ok ($profile build): ${seconds}s, ${runs:-?} runs, cov ${cov:-?}, corpus $corpus"
    rm -f "$log"
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: failed: ${failed[*]}"
    exit 1
fi
