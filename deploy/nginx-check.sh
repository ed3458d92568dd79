#!/usr/bin/env bash
# Manual check of gapless behind nginx (docs/deploy.md): starts gapless and nginx
# (Debian's package, installed when missing) with gzip on or off for
# text/event-stream, follows a channel through nginx, publishes one event
# straight to gapless, and prints how long it took to arrive through nginx.
# Usage: deploy/nginx-check.sh [on|off] [buffering-on|buffering-off]
#   GAPLESS_BIN  the gapless binary (default: target/release/gapless, else target/debug/gapless)
set -euo pipefail
gzip="${1:-on}"
buffering="${2:-buffering-on}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${GAPLESS_BIN:-$repo/target/release/gapless}"
[ -x "$bin" ] || bin="$repo/target/debug/gapless"
command -v nginx >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null
work="$(mktemp -d)"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
gp=$(free_port); np=$(free_port)
"$bin" serve --memory --listen "127.0.0.1:$gp" >"$work/gapless.log" 2>&1 &
gpid=$!
proxy_buffering=""
[ "$buffering" = buffering-off ] && proxy_buffering="proxy_buffering off;"
cat >"$work/nginx.conf" <<CONF
daemon off; worker_processes 1; pid $work/nginx.pid; error_log $work/nginx.err;
events {}
http {
  access_log off;
  gzip $gzip; gzip_types text/plain text/event-stream; gzip_min_length 1;
  server { listen 127.0.0.1:$np;
    location / { proxy_pass http://127.0.0.1:$gp; proxy_http_version 1.1; proxy_set_header Connection ""; $proxy_buffering proxy_read_timeout 1h; }
  }
}
CONF
nginx -c "$work/nginx.conf" &
npid=$!
trap 'kill $gpid $npid 2>/dev/null; pkill -P $$ curl 2>/dev/null; rm -rf "$work"' EXIT
sleep 1
curl -sN --compressed -D "$work/head" "http://127.0.0.1:$np/v1/channels/check/sse" >"$work/out" &
sleep 1
t0=$(date +%s%N)
curl -s -d arrived "http://127.0.0.1:$gp/v1/channels/check/events" >/dev/null
for _ in $(seq 1 500); do
  if grep -q arrived "$work/out"; then
    echo "nginx $(nginx -v 2>&1 | cut -d/ -f2), gzip $gzip, $buffering: the event arrived through nginx after $(( ($(date +%s%N) - t0) / 1000000 )) ms ($(grep -i '^content-encoding' "$work/head" | tr -d '\r' || echo 'not compressed'))"
    exit 0
  fi
  sleep 0.01
done
echo "nginx $(nginx -v 2>&1 | cut -d/ -f2), gzip $gzip, $buffering: the event did NOT arrive within 5 s"
exit 1
