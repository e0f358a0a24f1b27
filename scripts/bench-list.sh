#!/bin/bash
# BenchmarkListMany in two trees, alternating, in ROUNDS rounds:
#   bash scripts/bench-list.sh BEFORE_TREE [AFTER_TREE]
# Each tree needs bin/plover-worker built (make bin/plover-worker) and
# engine/list_test.go (copy it into an older tree; adjust its imports).
set -euo pipefail
before=${1:?usage: bench-list.sh BEFORE_TREE [AFTER_TREE]}
after=${2:-$(cd "$(dirname "$0")/.." && pwd)}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for tree in "$before" "$after"; do
    echo "== round $round tree $tree ($(cd "$tree" && git rev-parse --short HEAD)) load $(cut -d' ' -f1-3 /proc/loadavg)"
    (cd "$tree" && PLOVER_BENCH_WORKER=$tree/bin/plover-worker go test -run '^$' -bench ListMany -benchtime 20x ./engine/ 2>&1 | grep Benchmark)
  done
done
