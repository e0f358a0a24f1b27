# scripts/lib/bench.sh — sourced by the benchmark scripts (isolation-bench.sh,
# cpu-per-request.sh, cold-sequence.sh, warm-sequence.sh, bench-repository.sh)
# and the GPU check's servers (tenant-reload.sh, full-card.sh);
# run them from the repository root.

# cnn_digit OUT: the first held-out digit as the CNN's input, 784 float32
# pixels k/255 (heldout.bin: "PLVDGT01", a uint32 count, then a label byte
# and 784 pixel bytes per digit). Not the file's first 3136 bytes as they
# are: read as floats those are mostly denormals, which made the CNN's
# kernels about 4x slower than on a real digit (until 2026-11-27).
cnn_digit() {
  python3 - samples/cnn/testdata/heldout.bin "$1" <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read()
assert d[:8] == b"PLVDGT01"
open(sys.argv[2], "wb").write(struct.pack("<784f", *[k / 255 for k in d[13:13 + 784]]))
PY
}

# server_url LOG: waits (10 s at most) for a `plover serve --listen
# 127.0.0.1:0` writing LOG to say where it listens, and prints its URL; on
# failure prints the log to stderr and returns 1. Start the server in the
# calling shell (not in $(...)), so that its pid is the caller's to stop.
server_url() {
  local addr
  for _ in $(seq 1 200); do
    addr=$(sed -n 's/.*addr=http:\/\/\([0-9.:]*\).*/\1/p' "$1" | head -n 1)
    if [ -n "$addr" ]; then
      echo "http://$addr"
      return 0
    fi
    sleep 0.05
  done
  cat "$1" >&2
  return 1
}

# await_healthz URL PID LOG: waits (60 s at most) for the server PID to
# answer 200 on URL/healthz; if it exits or never does, prints the end of
# its LOG and returns 1.
await_healthz() {
  for _ in $(seq 1 120); do
    kill -0 "$2" 2>/dev/null || break
    curl -sf -m 5 -o /dev/null "$1/healthz" && return 0
    sleep 0.5
  done
  tail -n 20 "$3"
  return 1
}

# scratch: a temporary directory in $work, removed at exit, where the
# server started in $spid (if any) is stopped too.
scratch() {
  work=$(mktemp -d)
  spid=
  trap '[ -n "$spid" ] && kill "$spid" 2>/dev/null; rm -rf "$work"' EXIT
}

# cpu_ticks PID: the CPU ticks (user + system) of PID and, summed, of its
# children alive now: "SERVER WORKERS".
cpu_ticks() {
  local w=0 c
  for c in $(pgrep -P "$1"); do
    w=$((w + $(awk '{ print $14 + $15 }' "/proc/$c/stat" 2>/dev/null || echo 0)))
  done
  echo "$(awk '{ print $14 + $15 }' "/proc/$1/stat") $w"
}

# serve LOG [FLAGS...]: "$plover" serve on the host device over
# $work/data (shared by every server the caller starts), no store
# polling, logging to LOG; sets spid (scratch stops it at exit) and url.
serve() {
  local log=$1
  shift
  "$plover" serve --listen 127.0.0.1:0 --data "$work/data" --device host --poll 0 "$@" >"$log" 2>&1 &
  spid=$!
  url=$(server_url "$log")
}

# unserve: stops the server serve started.
unserve() { kill "$spid"; wait "$spid" 2>/dev/null || true; spid=; }

# deploy_cnn_copies N: the CNN sample deployed N times to $url, as
# cnn-0001 to cnn-N (each copy its own bundle directory under $work).
deploy_cnn_copies() {
  local i d
  for i in $(seq 1 "$1"); do
    d=$work/bundles/$(printf 'cnn-%04d' "$i")
    mkdir -p "$d"
    cp build/samples/cnn-host/* "$d/"
    python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); m["name"]=sys.argv[2]; json.dump(m, open(sys.argv[1], "w"))' "$d/plover.json" "${d##*/}"
    PLOVER_SERVER=$url "$plover" deploy "$d" >/dev/null
  done
}
