# Sourced (not run) by scripts/test.sh, scripts/browser-test.sh and scripts/ts-test.sh: the
# install steps they share, each idempotent and non-interactive (as root, or with sudo -n).
#
# The caller defines log() (its own prefix) and sets $repo (the repository root).
# Functions:
#   as_root CMD...            CMD as root
#   apt_install PKG...        apt-get update + install PKG (quietly; the log's tail on failure)
#   ensure_chromium           Debian's chromium when /usr/bin/chromium is missing
#                             (playwright's own browser downloads do not work here)
#   ensure_node_modules DIR MARKER
#                             npm ci in DIR when DIR/MARKER is missing or the packages were
#                             installed from another package-lock.json
#   ensure_gapless_bin        exports GAPLESS_BIN as an absolute path: as given (relative to
#                             $repo), or target/debug/gapless built with cargo when unset

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi
}

apt_install() {
  local apt_log
  apt_log="$(mktemp)"
  if ! { as_root apt-get update -qq &&
         as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; } \
       >"$apt_log" 2>&1 </dev/null; then
    tail -n 30 "$apt_log" >&2
    rm -f "$apt_log"
    log "installing $* failed"
    return 1
  fi
  rm -f "$apt_log"
}

ensure_chromium() {
  if [ ! -x /usr/bin/chromium ]; then
    log "installing chromium (apt)"
    apt_install chromium
  fi
}

ensure_node_modules() {
  local dir="$1" marker="$2" stamp want
  stamp="$dir/node_modules/.gapless-lock.sha256"
  want="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
  if [ ! -e "$dir/$marker" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    log "npm ci in ${dir#"$repo"/}"
    (cd "$dir" && npm ci --no-audit --no-fund --no-update-notifier --loglevel=error </dev/null)
    echo "$want" >"$stamp"
  fi
}

ensure_gapless_bin() {
  if [ -z "${GAPLESS_BIN:-}" ]; then
    log "cargo build -p gapless"
    (cd "$repo" && cargo build -q -p gapless </dev/null)
    GAPLESS_BIN="$repo/target/debug/gapless"
  fi
  case "$GAPLESS_BIN" in /*) ;; *) GAPLESS_BIN="$repo/$GAPLESS_BIN" ;; esac
  if [ ! -x "$GAPLESS_BIN" ]; then
    log "GAPLESS_BIN=$GAPLESS_BIN is not an executable"
    return 1
  fi
  export GAPLESS_BIN
}
