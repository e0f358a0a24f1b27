#!/usr/bin/env bash
# hot-scope.sh — the hot path under --worker-scope function and tenant,
# alternated: N copies of the CNN deployed, then per round and scope a
# fresh server with 1 of them loaded, then one with all N loaded (a tenant
# worker holding N programs), and one client of `plover bench` on the
# first for SECS seconds. The suite's tenants benchmark measures the hot
# path once a round between its cold measures; this measures nothing else,
# longer, the two scopes minutes apart at most.
# Usage: scripts/hot-scope.sh [N] [ROUNDS] [SECS] (default 60 3 3; after make build samples)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-60}
rounds=${2:-3}
secs=${3:-3}
plover=${PLOVER:-bin/plover}

. scripts/lib/bench.sh
scratch
cnn_digit "$work/digit.bin"

serve "$work/log"
deploy_cnn_copies "$n"
unserve
for _ in $(seq 1 "$rounds"); do
  for scope in function tenant; do
    for loaded in 1 "$n"; do
      serve "$work/log" --worker-scope "$scope"
      for i in $(seq 1 "$loaded"); do
        curl -sf -o /dev/null -H "Content-Type: application/octet-stream" --data-binary @"$work/digit.bin" "$url/v1/functions/$(printf 'cnn-%04d' "$i")/invoke"
      done
      PLOVER_SERVER=$url "$plover" bench cnn-0001 --in "$work/digit.bin" --duration "${secs}s" --json >"$work/bench.json"
      python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); l=j["latency_ms"]; print("%-8s %3s loaded: p50 %.3f ms  p99 %.3f ms" % (sys.argv[2], sys.argv[3], l["p50"], l["p99"]))' "$work/bench.json" "$scope" "$loaded"
      unserve
    done
  done
done
