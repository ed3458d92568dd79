#!/usr/bin/env bash
# Scale and growth (docs/performance.md, "Scale and growth (target 5)"): runs
# gapless-bench scenarios over lists of subscriber counts and event rates for
# each target via bench/compare (a fresh server per point), then draws the
# sweeps with `gapless-bench plot-sweep` as standalone SVG files (one line per
# target) and writes their points as Markdown tables to summary.md.
#
# Usage: bench/sweep.sh [GROUP...]   groups (default: all):
#   subs    idle --one-channel and fanout at each of SUBS subscribers:
#           rss-per-sub.svg (server RSS per idle subscriber), cpu-per-delivery.svg
#           (server CPU per delivery at max rate), connect-p99.svg
#   rates   fanout, 1000 subscribers, at each of RATES events/s (0 = max):
#           p99-vs-rate.svg (against the rate reached), cpu-vs-rate.svg
#   multi   1000 subscribers × 16 channels on one connection each, and the same split
#           into one connection per channel (16,000): the cost of a followed channel
#   burst   one channel with 10,000 subscribers, 5 events each published alone:
#           time until the last subscriber has it
#   plots   only draws the subs and rates plots again from the results in OUTDIR
# summary.md (appended to) collects every point's table and every plot's points.
# Environment:
#   TARGETS     servers (default "gapless nchan electric"; bench/compare's names)
#   SUBS        subscriber counts (default "100 1000 5000 15000")
#   RATES       events/s (default "10 100 200 1000 0"; 0 = as fast as acknowledged)
#   RATE_SUBS   subscribers of the rate sweep (default 1000)
#   SECS        seconds of publishing per rate point (default 10)
#   MAX_EVENTS  events of the max-rate point (default 20000, stopped after SECS)
#   DELIVERIES  deliveries per point of the subscriber sweep's fanout (default 1000000;
#               events = DELIVERIES / subscribers, at least 20)
#   HOLD_MS     idle: how long connections are held before RSS is read (default 2000)
#   MULTI       "SUBS CHANNELS_PER_SUB EVENTS" of the multi group (default "1000 16 2000")
#   BURST       "SUBS EVENTS" of the burst group (default "10000 5")
#   RUN / OUTDIR  results go to OUTDIR (default bench/results/RUN, RUN default sweep-DATE)
#   GAPLESS_BIN, GAPLESS_BENCH, GAPLESS_ARGS, BENCH_ARGS: passed to bench/compare
# Build first: cargo build --release -p gapless -p gapless-bench
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUN=${RUN:-sweep-$(date -u +%Y%m%dT%H%M%SZ)}
OUTDIR=${OUTDIR:-$ROOT/bench/results/$RUN}
mkdir -p "$OUTDIR"
GROUPS_TO_RUN=${*:-subs rates multi burst}
# (plots is not in the default: subs and rates draw their own)
TARGETS=${TARGETS:-gapless nchan electric}
SUBS=${SUBS:-100 1000 5000 15000}
RATES=${RATES:-10 100 200 1000 0}
RATE_SUBS=${RATE_SUBS:-1000}
SECS=${SECS:-10}
MAX_EVENTS=${MAX_EVENTS:-20000}
DELIVERIES=${DELIVERIES:-1000000}
HOLD_MS=${HOLD_MS:-2000}
read -r MULTI_SUBS MULTI_PER MULTI_EVENTS <<<"${MULTI:-1000 16 2000}"
read -r BURST_SUBS BURST_EVENTS <<<"${BURST:-10000 5}"
GAPLESS_BENCH=${GAPLESS_BENCH:-$ROOT/target/release/gapless-bench}
export GAPLESS_BENCH
SUMMARY=$OUTDIR/summary.md
status=0

point() { # NAME TARGETS -- SCENARIO ARGS...: one bench/compare run into OUTDIR/NAME
  local name=$1 targets=$2; shift 3
  echo "== $name: $* ($targets)" | tee -a "$OUTDIR/sweep.log"
  env TARGETS="$targets" OUT="$OUTDIR/$name" "$ROOT/bench/compare" "$@" >>"$OUTDIR/sweep.log" 2>&1 || {
    echo "sweep: $name exited $? (see sweep.log)" | tee -a "$SUMMARY"
    status=1
  }
  if [ -f "$OUTDIR/$name/table.md" ]; then
    { echo "#### $name: $*"; echo; cat "$OUTDIR/$name/table.md"; echo; } >>"$SUMMARY"
  fi
}

draw() { # FILE TITLE --x X --y Y [--scenario S] [--log-x] -- GLOB...
  local file=$1 title=$2; shift 2
  local args=()
  while [ "$1" != -- ]; do args+=("$1"); shift; done
  shift
  local files=()
  for f in "$@"; do [ -s "$f" ] && files+=("$f"); done
  [ ${#files[@]} -gt 0 ] || { echo "sweep: nothing to draw for $file"; return 0; }
  "$GAPLESS_BENCH" plot-sweep --out "$OUTDIR/$file" --title "$title" "${args[@]}" "${files[@]}" \
    | tee -a "$SUMMARY" || status=1
  echo "plot: $OUTDIR/$file"
}

draw_subs() { # the subscriber sweep's plots, from OUTDIR/subs-*
  draw rss-per-sub.svg "Server RSS per idle SSE subscriber (one channel)" \
    --x param:subs --y server_rss_per_sub_kb --scenario idle --log-x -- "$OUTDIR"/subs-*-idle/*.jsonl
  draw connect-p99.svg "Connect time p99 (idle subscribers)" \
    --x param:subs --y connect_p99_ms --scenario idle --log-x -- "$OUTDIR"/subs-*-idle/*.jsonl
  draw cpu-per-delivery.svg "Server CPU per delivery (µs), one channel, max rate" \
    --x param:subs --y server_cpu_us_per_delivery --scenario fanout --log-x -- "$OUTDIR"/subs-*-fanout/*.jsonl
}

draw_rates() { # the rate sweep's plots, from OUTDIR/rate-*
  draw p99-vs-rate.svg "Delivery latency p99 (ms), $RATE_SUBS subscribers, against events/s reached" \
    --x publish_per_s --y latency_p99_ms --scenario fanout --log-x --table-key rate -- "$OUTDIR"/rate-*/*.jsonl
  draw cpu-vs-rate.svg "Server CPU per delivery (µs), $RATE_SUBS subscribers, against events/s reached" \
    --x publish_per_s --y server_cpu_us_per_delivery --scenario fanout --log-x --table-key rate \
    -- "$OUTDIR"/rate-*/*.jsonl
}

{
  echo "# Sweep $RUN"
  echo
  echo "targets: $TARGETS; groups: $GROUPS_TO_RUN"
  echo "tree: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) with $(git -C "$ROOT" status --short --untracked-files=no 2>/dev/null | wc -l) modified files"
  echo "machine: $(nproc) cores, $(uname -sr); load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
  echo
} >>"$SUMMARY"

for g in $GROUPS_TO_RUN; do
  case $g in
  subs)
    for n in $SUBS; do
      point "subs-$n-idle" "$TARGETS" -- idle --subs "$n" --one-channel --hold-ms "$HOLD_MS"
      events=$((DELIVERIES / n)); [ "$events" -ge 20 ] || events=20
      point "subs-$n-fanout" "$TARGETS" -- fanout --subs "$n" --events "$events" --bytes 100 --max-secs 30
    done
    draw_subs
    ;;
  rates)
    for r in $RATES; do
      if [ "$r" = 0 ]; then
        point "rate-max" "$TARGETS" -- fanout --subs "$RATE_SUBS" --events "$MAX_EVENTS" --bytes 100 --max-secs "$SECS"
      else
        events=$(awk -v r="$r" -v s="$SECS" 'BEGIN { e = int(r * s); print (e < 10 ? 10 : e) }')
        point "rate-$r" "$TARGETS" -- fanout --subs "$RATE_SUBS" --events "$events" --bytes 100 --rate "$r" \
          --max-secs $((SECS * 3))
      fi
    done
    draw_rates
    ;;
  multi)
    # The Durable Streams kinds follow one stream per URL: they run split either way,
    # so they are only in the split run.
    joined=""
    for t in $TARGETS; do case $t in gapless | nchan) joined="$joined $t" ;; esac; done
    [ -z "$joined" ] || point "multi-joined" "${joined# }" -- multi --subs "$MULTI_SUBS" \
      --channels-per-sub "$MULTI_PER" --events "$MULTI_EVENTS" --bytes 100 --max-secs 30 --hold-ms "$HOLD_MS"
    point "multi-split" "$TARGETS" -- multi --subs "$MULTI_SUBS" --channels-per-sub "$MULTI_PER" \
      --events "$MULTI_EVENTS" --bytes 100 --max-secs 30 --hold-ms "$HOLD_MS" --split
    ;;
  plots)
    draw_subs
    draw_rates
    ;;
  burst)
    point "burst" "$TARGETS" -- burst --subs "$BURST_SUBS" --events "$BURST_EVENTS" --bytes 100
    ;;
  *) echo "sweep: unknown group $g" >&2; exit 64 ;;
  esac
done
echo "summary: $SUMMARY"
exit "$status"
