#!/usr/bin/env bash
# Builds the cargo-fuzz targets in fuzz/ (nightly; installs cargo-fuzz if
# missing) and runs each for FUZZ_SECONDS (default 5) on its corpus in
# fuzz/corpus/<target>, seeded from fuzz/seeds/<target>. A crash fails the
# script and leaves its input in fuzz/artifacts/<target>/.
# Usage: scripts/fuzz.sh [target...]     FUZZ_SECONDS=600 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-5}"

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
if ! cargo +nightly fuzz build -O >"$build_log" 2>&1; then
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
    if ! cargo +nightly fuzz run -O "$t" "corpus/$t" "${seeds[@]}" -- \
        -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
        tail -40 "$log"
        echo "fuzz: $t FAILED (input in fuzz/artifacts/$t/)"
        failed+=("$t")
        continue
    fi
    runs=$(awk '/^stat::number_of_executed_units:/ {print $2}' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
    corpus=$(find "corpus/$t" -type f | wc -l)
    echo "fuzz: $t ok: ${seconds}s, ${runs:-?} runs, cov ${cov:-?}, corpus $corpus"
    rm -f "$log"
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: failed: ${failed[*]}"
    exit 1
fi
