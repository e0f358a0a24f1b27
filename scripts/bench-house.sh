#!/bin/bash
# Served hot path, builds side by side (BENCHMARKS.md, "The house, second
# step"): for each build, plover serve --device host (worker processes), then
# plover bench of the CNN at 1 and 4 clients and vecadd 4 MB at 1 client,
# 4 s each; rounds alternate the builds. Each build is a worktree at
# /tmp/ab-<name> (with make samples run) and binaries in /tmp/ab-bin-<name>
# (plover, plover-worker):
#   git worktree add /tmp/ab-c993191 c993191 && (cd /tmp/ab-c993191 && make samples &&
#     go build -o /tmp/ab-bin-c993191/plover ./cli/plover && go build -o /tmp/ab-bin-c993191/plover-worker ./cmd/plover-worker)
# Usage: scripts/bench-house.sh ROUNDS NAME...
set -u
rounds=${1:?rounds}; shift
for round in $(seq "$rounds"); do
for c in "$@"; do
  P=/tmp/ab-bin-$c/plover; cd /tmp/ab-$c
  data=$(mktemp -d); port=$((19400 + RANDOM % 500))
  $P serve --listen 127.0.0.1:$port --data $data --device host >/tmp/ab_srv.log 2>&1 &
  pid=$!
  for i in $(seq 50); do curl -s 127.0.0.1:$port/healthz >/dev/null && break; sleep 0.1; done
  export PLOVER_SERVER=http://127.0.0.1:$port
  $P deploy build/samples/vecadd-host >/dev/null; $P deploy build/samples/cnn-host >/dev/null
  # One client: also the server's own total and dispatch (the worker's
  # round trip beside the kernels) at p50, where the build's bench reports
  # them, so that a change in p50 can be placed inside or outside the server.
  c1=$($P bench cnn --size 3136 --concurrency 1 --duration 4s --json | python3 -c 'import json,sys;d=json.load(sys.stdin);l=d["latency_ms"];s=d.get("server_ms") or {};p=lambda k:s[k]["p50"] if k in s else "-";print(l["p50"],l["p99"],round(d["throughput_per_s"]),"| server total/kernels/dispatch p50:",p("total"),p("kernels"),p("dispatch"))')
  c4=$($P bench cnn --size 3136 --concurrency 4 --duration 4s --json | python3 -c 'import json,sys;d=json.load(sys.stdin);l=d["latency_ms"];print(l["p50"],l["p99"],round(d["throughput_per_s"]))')
  v=$($P bench vecadd --in build/samples/vecadd-input.bin --concurrency 1 --duration 4s --json | python3 -c 'import json,sys;d=json.load(sys.stdin);l=d["latency_ms"];print(l["p50"],l["p99"])')
  echo "round $round $c cnn-c1 p50/p99/rps: $c1 | cnn-c4 p50/p99/rps: $c4 | vecadd p50/p99: $v"
  kill $pid; wait $pid 2>/dev/null; rm -rf $data
done; done
