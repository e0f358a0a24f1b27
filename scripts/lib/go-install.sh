# scripts/lib/go-install.sh — sourced by the scripts that build a pinned tool
# with `go install` into ~/.cache/plover (install-helm.sh, install-grpcurl.sh).

# cache_lock NAME DIR: holds DIR/.lock (flock, on fd 9, until the calling
# script exits), so that two installs of one tool run one after the other,
# then removes the scratch directories (.build.*) left in DIR by a build that
# was killed (SIGKILL skips the script's EXIT trap): under the lock none can
# be another build's. Without flock it neither waits nor removes anything.
# The caller checks again for the binary after this: another install may
# have built it while this one waited.
cache_lock() {
  local name=$1 dir=$2
  if ! command -v flock >/dev/null; then
    echo "$name: no flock here: not locking $dir, not removing old scratch directories" >&2
    return 0
  fi
  exec 9>"$dir/.lock"
  flock 9
  rm -rf "$dir"/.build.*
}

# go_install_retry NAME GOBIN ARGS...: `go install ARGS` into GOBIN, without
# cgo and without the caller's GOFLAGS (go install pkg@version ignores
# -mod=mod, and a -mod=vendor would break it). A download from the module
# proxy once stalled for 16 minutes at no CPU (2026-12-02) and went through at
# once when started again: each try is bounded ($PLOVER_GO_INSTALL_TIMEOUT
# seconds, 900 unless set) and a failed or stalled one is tried again, 3 tries
# in all. What a killed try compiled stays in Go's build cache, so the next
# one goes on from there.
go_install_retry() {
  local name=$1 gobin=$2 limit=${PLOVER_GO_INSTALL_TIMEOUT:-900} try
  shift 2
  for try in 1 2 3; do
    if GOFLAGS= CGO_ENABLED=0 GOBIN="$gobin" timeout "$limit" go install "$@"; then
      return 0
    fi
    if [ "$try" = 3 ]; then
      echo "$name: go install failed 3 times" >&2
      return 1
    fi
    echo "$name: go install failed or stalled (try $try, ${limit} s at most each); trying again" >&2
  done
}
