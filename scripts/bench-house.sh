#!/bin/bash
# Served hot path, builds side by side (BENCHMARKS.md, "The house, second
# step"): for each build, plover serve --device host (worker processes), then
# plover bench of the CNN at 1 and 4 clients and vecadd 4 MB at 1 client,
# 4 s each; rounds alternate the builds. Each build is a worktree at
# $AB/ab-<name> (with make samples run) and binaries in $AB/ab-bin-<name>
# (plover, plover-worker); $AB is /tmp unless set:
#   git worktree add /tmp/ab-c993191 c993191 && (cd /tmp/ab-c993191 && make samples &&
#     go build -o /tmp/ab-bin-c993191/plover ./cli/plover && go build -o /tmp/ab-bin-c993191/plover-worker ./cmd/plover-worker)
# Each cell is p50 ms, p99 ms, requests/s and ok/requests. A row whose
# requests failed ends FAILED, naming the errors, and the script exits 1
# after its rounds: a build that fails some requests looks faster by those
# it did not serve.
# Usage: scripts/bench-house.sh ROUNDS NAME...
set -u
rounds=${1:?rounds}; shift
AB=${AB:-/tmp}

# cell [server]: the cell of one plover bench --json on stdin (with
# "server", also the server's own total, kernels and dispatch p50); exit 1,
# the errors in the cell, where any request failed or no report came.
cell() {
  python3 -c '
import json, sys
try:
    d = json.load(sys.stdin)
except ValueError:
    print("FAILED: no report from plover bench")
    sys.exit(1)
l = d["latency_ms"]
out = "%s %s %d %d/%d" % (l["p50"], l["p99"], round(d["throughput_per_s"]), d["ok"], d["requests"])
if sys.argv[1:] == ["server"]:
    s = d.get("server_ms") or {}
    p = lambda k: s[k]["p50"] if k in s else "-"
    out += " | server total/kernels/dispatch p50: %s %s %s" % (p("total"), p("kernels"), p("dispatch"))
errors = d.get("errors") or []
if errors or d["ok"] != d["requests"]:
    said = "; ".join("%s x %d: %s" % (e["status"] or "no response", e["count"], " ".join(e.get("message", "").split())[:120]) for e in errors)
    print(out + " FAILED: " + (said or "%d of %d requests without a 2xx answer" % (d["requests"] - d["ok"], d["requests"])))
    sys.exit(1)
print(out)' "$@"
}

status=0
for round in $(seq "$rounds"); do
for c in "$@"; do
  P=$AB/ab-bin-$c/plover; cd "$AB/ab-$c" || exit 1
  data=$(mktemp -d); port=$((19400 + RANDOM % 500))
  $P serve --listen 127.0.0.1:$port --data $data --device host >$AB/ab_srv.log 2>&1 &
  pid=$!
  for i in $(seq 50); do curl -s 127.0.0.1:$port/healthz >/dev/null && break; sleep 0.1; done
  export PLOVER_SERVER=http://127.0.0.1:$port
  $P deploy build/samples/vecadd-host >/dev/null; $P deploy build/samples/cnn-host >/dev/null
  # A few untimed requests to each: a function's first is a cold start (its
  # load), which 4 s of one client counted in its p99. By curl: the builds
  # compared may be older than plover bench --warmup.
  head -c 3136 /dev/urandom >$data/cnn-input.bin
  for i in 1 2 3; do
    for f in cnn:$data/cnn-input.bin vecadd:build/samples/vecadd-input.bin; do
      curl -s -o /dev/null -H 'Content-Type: application/octet-stream' --data-binary "@${f#*:}" "$PLOVER_SERVER/v1/functions/${f%%:*}/invoke"
    done
  done
  failed=
  # One client: also the server's own total and dispatch (the worker's
  # round trip beside the kernels) at p50, where the build's bench reports
  # them, so that a change in p50 can be placed inside or outside the server.
  c1=$($P bench cnn --size 3136 --concurrency 1 --duration 4s --json | cell server) || failed=1
  c4=$($P bench cnn --size 3136 --concurrency 4 --duration 4s --json | cell) || failed=1
  v=$($P bench vecadd --in build/samples/vecadd-input.bin --concurrency 1 --duration 4s --json | cell) || failed=1
  row="round $round $c cnn-c1 p50/p99/rps/ok: $c1 | cnn-c4 p50/p99/rps/ok: $c4 | vecadd p50/p99/rps/ok: $v"
  if [ -n "$failed" ]; then
    echo "$row | FAILED"
    status=1
  else
    echo "$row"
  fi
  kill $pid; wait $pid 2>/dev/null; rm -rf $data
done; done
exit $status
