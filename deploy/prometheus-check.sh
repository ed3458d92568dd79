#!/usr/bin/env bash
# Manual check of the monitoring setup (docs/deploy.md, "Metrics, readiness, logs"): runs
# gapless and a real Prometheus (Debian's package, installed when missing) with
# deploy/prometheus/prometheus.yml (its target pointed at this gapless, scraping every
# second), makes some traffic, then checks that
#   - Prometheus scrapes gapless (`up` is 1, `gapless_events_published_total` counts the
#     publishes), and
#   - every query of the Grafana dashboard (deploy/grafana/gapless.json) is valid PromQL
#     and names only metrics that gapless exports.
# Usage: deploy/prometheus-check.sh
#   GAPLESS_BIN  the gapless binary (default: target/release/gapless, else target/debug/gapless)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${GAPLESS_BIN:-$repo/target/release/gapless}"
[ -x "$bin" ] || bin="$repo/target/debug/gapless"
if ! command -v prometheus >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
fi
work="$(mktemp -d)"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
gp=$(free_port); pp=$(free_port)
"$bin" serve --data-dir "$work/data" --listen "127.0.0.1:$gp" >"$work/gapless.log" 2>&1 &
gpid=$!
sed -e "s/gapless:8080/127.0.0.1:$gp/" -e "s/scrape_interval: 5s/scrape_interval: 1s/" \
  "$repo/deploy/prometheus/prometheus.yml" >"$work/prometheus.yml"
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$pp" >"$work/prometheus.log" 2>&1 &
ppid_=$!
trap 'kill $gpid $ppid_ 2>/dev/null; pkill -P $$ curl 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do curl -fs -o /dev/null "http://127.0.0.1:$gp/healthz" && break; sleep 0.1; done
# Traffic: a stream that stays open, publishes, a replay, a gap (a cursor of another
# epoch), and a refusal (a malformed cursor).
curl -sN "http://127.0.0.1:$gp/v1/channels/check/sse" >/dev/null &
for i in 1 2 3; do curl -fs -d "event $i" "http://127.0.0.1:$gp/v1/channels/check/events" >/dev/null; done
cursor=$(curl -fs "http://127.0.0.1:$gp/v1/channels/check/events?limit=1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["events"][0]["cursor"])' 2>/dev/null || true)
[ -n "$cursor" ] && curl -s --max-time 1 "http://127.0.0.1:$gp/v1/channels/check/sse?last_event_id=$cursor" >/dev/null || true
curl -s --max-time 1 -H 'Last-Event-ID: not-a-cursor' "http://127.0.0.1:$gp/v1/channels/check/sse" >/dev/null || true
curl -s "http://127.0.0.1:$gp/v1/channels/check/events?after=bad" >/dev/null
query() { curl -fs --get --data-urlencode "query=$1" "http://127.0.0.1:$pp/api/v1/query"; }
ok=""
for _ in $(seq 60); do
  v=$(query 'sum(gapless_events_published_total)' 2>/dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")' 2>/dev/null || true)
  up=$(query 'up{job="gapless"}' 2>/dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")' 2>/dev/null || true)
  if [ "$up" = 1 ] && [ "${v%%.*}" = 3 ]; then ok=1; break; fi
  sleep 0.5
done
[ -n "$ok" ] || { echo "FAIL: Prometheus did not scrape gapless (up=$up, published=$v)"; tail -5 "$work/prometheus.log"; exit 1; }
echo "ok: Prometheus scraped gapless: up=1, gapless_events_published_total=3"
sleep 3 # a few more samples, so rate() has two
exported=$(curl -fs "http://127.0.0.1:$gp/metrics" | grep -v '^#' | sed -E 's/[{ ].*//' | sort -u)
fail=0
while IFS= read -r expr; do
  status=$(query "$expr" | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])' 2>/dev/null || echo "error")
  for name in $(grep -oE 'gapless_[a-z_]+' <<<"$expr" | sort -u); do
    grep -qx "$name" <<<"$exported" || { echo "FAIL: the dashboard queries $name, which gapless does not export"; fail=1; }
  done
  if [ "$status" != success ]; then echo "FAIL: Prometheus refused the dashboard query: $expr"; fail=1; fi
done < <(python3 -c '
import json,sys
d=json.load(open(sys.argv[1]))
for p in d.get("panels",[]):
    for t in p.get("targets",[]):
        if t.get("expr"): print(t["expr"])' "$repo/deploy/grafana/gapless.json")
[ "$fail" = 0 ] || exit 1
echo "ok: every dashboard query is valid PromQL over metrics gapless exports ($(prometheus --version 2>&1 | head -1))"
