# Sourced (not run) by scripts/bench-smoke.sh and scripts/bench-cluster.sh.
#
# listening_addr LOG
#   Waits (up to 10 s) for a `gapless serve --listen 127.0.0.1:0` whose output goes to LOG
#   to print its address and answer /readyz; prints the address (127.0.0.1:PORT). Returns 1,
#   with LOG on stderr, when it does not.
listening_addr() {
  local log="$1" addr=""
  for _ in $(seq 200); do
    addr=$(grep -oE '127\.0\.0\.1:[0-9]+' "$log" | grep -v ':0$' | head -n1 || true)
    [ -n "$addr" ] && curl -fs -o /dev/null "http://$addr/readyz" && break
    addr=""; sleep 0.05
  done
  if [ -z "$addr" ]; then
    cat "$log" >&2
    return 1
  fi
  printf '%s\n' "$addr"
}
