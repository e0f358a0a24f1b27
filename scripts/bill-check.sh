#!/usr/bin/env bash
# bill-check.sh — what a function is billed (device_seconds) per request,
# for the CNN sample at 1 and 4 closed-loop clients, through two builds in
# alternated rounds, with the latency beside: a check of what measuring a
# worker's CPU from outside (worker/cpucharge.go) does to an honest
# function's bill and to its hot path. Each
# round starts a fresh server per build and client count, warms the CNN,
# runs it SECONDS, waits 1.5 s (the server looks at a worker's CPU once a
# second while no run is in flight) and reads its device_seconds.
# Usage: scripts/bill-check.sh BEFORE_BIN_DIR AFTER_BIN_DIR [ROUNDS] [SECONDS]
# (defaults 2, 4; run from the repository root after make build samples)
set -euo pipefail
cd "$(dirname "$0")/.."
before=${1:?BEFORE_BIN_DIR}
after=${2:?AFTER_BIN_DIR}
rounds=${3:-2}
secs=${4:-4}
. scripts/lib/bench.sh
scratch
cnn_digit "$work/digit.bin"

one() { # BIN_DIR CLIENTS: prints "requests device_seconds p50_ms p99_ms"
  plover=$1/plover
  rm -rf "$work/data"
  serve "$work/serve.log"
  PLOVER_SERVER=$url "$plover" deploy build/samples/cnn-host >/dev/null
  PLOVER_SERVER=$url "$plover" bench cnn --in "$work/digit.bin" --requests 1 >/dev/null
  PLOVER_SERVER=$url "$plover" bench cnn --in "$work/digit.bin" --concurrency "$2" --duration "${secs}s" --json >"$work/b.json"
  sleep 1.5
  curl -sf "$url/v1/functions/cnn" >"$work/f.json"
  unserve
  python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); f=json.load(open(sys.argv[2])); l=b["latency_ms"]; print(b["requests"], f["device_seconds"], l["p50"], l["p99"])' "$work/b.json" "$work/f.json"
}

echo "round clients build requests device_s us_per_request p50_ms p99_ms"
for r in $(seq 1 "$rounds"); do
  for c in 1 4; do
    for b in before after; do
      dir=$before
      [ "$b" = after ] && dir=$after
      read -r n s p50 p99 < <(one "$dir" "$c")
      awk -v r="$r" -v c="$c" -v b="$b" -v n="$n" -v s="$s" -v p50="$p50" -v p99="$p99" 'BEGIN { printf "%d %d %s %d %.3f %.1f %.3f %.3f\n", r, c, b, n, s, s * 1e6 / (n + 1), p50, p99 }'
    done
  done
done
