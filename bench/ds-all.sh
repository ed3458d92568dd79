#!/usr/bin/env bash
# The Durable Streams matrix of docs/performance.md ("Durable Streams: gapless beside Electric
# and the Node reference server"): each scenario on gapless's /ds paths, gapless's own API,
# Electric's server and the Node reference server, one after the other via bench/compare.
# Results (JSON lines, logs, one Markdown table per comparison) go under bench/results/RUN/.
#
# Usage: bench/ds-all.sh [GROUP...]   groups: publish fanout100 fanout200 history idle
#   (default: all). Build first: cargo build --release -p gapless -p gapless-bench
#   TARGETS   the servers (default "gapless-ds gapless electric dsnode"; the first is the
#             ratios' numerator)
#   SCALE     divides the sizes (default 1: 64 publishers × up to 200,000 appends, 1000
#             followers, 100,000-append catch-up, 5000 idle followers)
#   DSNODE_MEMORY=1 (passed to bench/compare) keeps the Node server in memory: file-backed, it
#             fsyncs each append and reached about 110 appends/s with 64 publishers here.
#   REPEAT=N  runs each comparison N times, rotating which server goes first; the tables
#             then show the median of each figure.
set -uo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-ds-$(date -u +%Y%m%dT%H%M%SZ)}
BASE=bench/results/$RUN
mkdir -p "$BASE"
GROUPS_TO_RUN=${*:-publish fanout100 fanout200 history idle}
REPEAT=${REPEAT:-1}
TARGETS=${TARGETS:-gapless-ds gapless electric dsnode}
SCALE=${SCALE:-1}

cmp() { # NAME -- SCENARIO ARGS...
  local name=$1; shift 2
  echo "#### $name: $*" | tee -a "$BASE/summary.md"
  : >"$BASE/$name.txt"
  local order=($TARGETS)
  for i in $(seq "$REPEAT"); do
    env TARGETS="${order[*]}" TABLE="$TARGETS" OUT="$BASE/$name" bench/compare "$@" >>"$BASE/$name.txt" 2>&1
    echo "exit $?" >>"$BASE/$name.txt"
    order=("${order[@]:1}" "${order[0]}")
  done
  if [ -f "$BASE/$name/table.md" ]; then cat "$BASE/$name/table.md"; else tail -n 40 "$BASE/$name.txt"; fi \
    | tee -a "$BASE/summary.md"
  echo | tee -a "$BASE/summary.md"
}

for g in $GROUPS_TO_RUN; do
  case $g in
  publish)
    cmp publish-64 -- publish --publishers 64 --events $((200000 / SCALE)) --bytes 100 --max-secs 15 --durability durable
    ;;
  fanout100)
    cmp fanout-1000-100 -- fanout --subs $((1000 / SCALE)) --events $((2000 / SCALE)) --bytes 100 --rate 100 \
      --max-secs 20
    ;;
  fanout200)
    cmp fanout-1000-200 -- fanout --subs $((1000 / SCALE)) --events $((4000 / SCALE)) --bytes 100 --rate 200 \
      --max-secs 20
    ;;
  history)
    cmp catchup-100k -- history --events $((100000 / SCALE)) --bytes 100
    ;;
  idle)
    cmp idle-5000-one -- idle --subs $((5000 / SCALE)) --one-channel
    ;;
  *) echo "ds-all: unknown group $g" >&2; exit 64 ;;
  esac
done
echo "summary: $BASE/summary.md"
