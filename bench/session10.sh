#!/usr/bin/env bash
# The issue 20 figures of session 10, every target's row, on a quiet machine: each comparison
# REPEAT times (default 3), the order of the servers rotating, medians by bench/compare's tables.
# Usage: bench/session10.sh [OUT_DIR]   (build first: cargo build --release -p gapless -p gapless-bench)
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-bench/results/s10-$(git rev-parse --short HEAD)}
REPEAT=${REPEAT:-3}
mkdir -p "$B"
rot() { # rotate a list of targets by round $1
  local r=$1; shift; local a=("$@"); local n=${#a[@]}; local out=()
  for ((i = 0; i < n; i++)); do out+=("${a[$(((i + r) % n))]}"); done
  echo "${out[*]}"
}
for ((r = 0; r < REPEAT; r++)); do
  T3=$(rot $r gapless nchan electric); T2n=$(rot $r gapless nchan); T2e=$(rot $r gapless electric)
  TARGETS="$T3" TABLE="gapless nchan electric" OUT=$B/fanout-100 \
    bench/compare fanout --subs 1000 --events 1500 --bytes 100 --rate 100 --max-secs 20
  TARGETS="$T3" TABLE="gapless nchan electric" OUT=$B/fanout-200 \
    bench/compare fanout --subs 1000 --events 3000 --bytes 100 --rate 200 --max-secs 20
  TARGETS="$T3" TABLE="gapless nchan electric" OUT=$B/fanout-1000 \
    bench/compare fanout --subs 1000 --events 15000 --bytes 100 --rate 1000 --max-secs 15
  TARGETS="$T2n" TABLE="gapless nchan" OUT=$B/fanout-ws-200 \
    bench/compare fanout --subs 1000 --events 3000 --bytes 100 --rate 200 --max-secs 20 --transport ws
  TARGETS="$T2n" TABLE="gapless nchan" OUT=$B/fanout-ws-max \
    bench/compare fanout --subs 1000 --events 4000 --bytes 100 --max-secs 15 --transport ws
  TARGETS="$T2e" TABLE="gapless electric" OUT=$B/publish-64 \
    bench/compare publish --publishers 64 --events 200000 --bytes 100 --max-secs 15
  NCHAN_PING=15 TARGETS="$T3" TABLE="gapless electric nchan" OUT=$B/idle-5000 \
    bench/compare idle --subs 5000 --one-channel --idle-cpu-ms 20000
  TARGETS="$T2n" TABLE="gapless nchan" OUT=$B/idle-ws-5000 \
    bench/compare idle --subs 5000 --one-channel --transport ws
done
for d in "$B"/*/; do echo "== $d"; cat "$d/table.md" 2>/dev/null; done > "$B/all-tables.md"
echo "tables: $B/all-tables.md"
