#!/usr/bin/env bash
# The comparison matrix of docs/performance.md: every scenario at the sizes the
# targets name, gapless then Nchan, via bench/compare. Results (JSON lines, logs
# and one Markdown table per comparison) go under bench/results/RUN/.
#
# Usage: bench/run-all.sh [GROUP...]   groups: idle fanout channels storm publish history
#   (default: all). Build first: cargo build --release -p gapless -p gapless-bench
#   REPEAT=N runs each comparison N times, alternating which server goes first;
#   the tables then show the median of each figure.
# Takes about 12 minutes per repetition on the 2-core machine.
set -uo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-$(date -u +%Y%m%dT%H%M%SZ)}
BASE=bench/results/$RUN
mkdir -p "$BASE"
GROUPS_TO_RUN=${*:-idle fanout channels storm publish history}
REPEAT=${REPEAT:-1}

cmp() { # NAME [ENV=VALUE...] -- SCENARIO ARGS...
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  echo "#### $name: $*" | tee -a "$BASE/summary.md"
  : >"$BASE/$name.txt"
  for i in $(seq "$REPEAT"); do
    local order="gapless nchan"
    [ $((i % 2)) = 0 ] && order="nchan gapless"
    env TARGETS="$order" "${envs[@]}" OUT="$BASE/$name" bench/compare "$@" >>"$BASE/$name.txt" 2>&1
    echo "exit $?" >>"$BASE/$name.txt"
  done
  if [ -f "$BASE/$name/table.md" ]; then cat "$BASE/$name/table.md"; else tail -n 40 "$BASE/$name.txt"; fi \
    | tee -a "$BASE/summary.md"
  echo | tee -a "$BASE/summary.md"
}

for g in $GROUPS_TO_RUN; do
  case $g in
  idle)
    for n in 1000 5000 10000; do
      cmp "idle-$n-distinct" -- idle --subs "$n"
      cmp "idle-$n-one" -- idle --subs "$n" --one-channel
    done
    ;;
  fanout)
    cmp fanout-1000-max -- fanout --subs 1000 --events 4000 --bytes 100 --max-secs 20
    cmp fanout-1000-max-p4 -- fanout --subs 1000 --events 8000 --bytes 100 --max-secs 20 --publishers 4
    cmp fanout-1000-max-async GAPLESS_ARGS="--durability async" -- \
      fanout --subs 1000 --events 4000 --bytes 100 --max-secs 20
    cmp fanout-1000-200 -- fanout --subs 1000 --events 3000 --bytes 100 --rate 200
    cmp fanout-1000-200-async GAPLESS_ARGS="--durability async" -- \
      fanout --subs 1000 --events 3000 --bytes 100 --rate 200
    ;;
  channels)
    cmp channels-1000x5 -- channels --channels 1000 --subs-per-channel 5 --events 20000 --bytes 100 --publishers 4 --max-secs 30
    ;;
  storm)
    cmp storm-5000x100 -- storm --subs 5000 --behind 100 --bytes 100
    ;;
  publish)
    cmp publish-64-sync -- publish --publishers 64 --events 200000 --bytes 100 --max-secs 20 --durability sync
    cmp publish-64-async GAPLESS_ARGS="--durability async" TARGETS=gapless -- \
      publish --publishers 64 --events 200000 --bytes 100 --max-secs 20 --durability async
    ;;
  history)
    cmp history-100k TARGETS=gapless -- history --events 100000 --page 1000 --bytes 100
    ;;
  *) echo "run-all: unknown group $g" >&2; exit 64 ;;
  esac
done
echo "summary: $BASE/summary.md"
