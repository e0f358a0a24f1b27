#!/usr/bin/env bash
# The cost of isolation, both modes in one run on one machine: the CNN sample
# hot (p50 with 1 client, throughput with 4) and cold (a fresh deploy's first
# request, which with --isolation process takes a standby worker; the
# server's Server-Timing total and load), through
# `plover serve --isolation none` and `--isolation process` side by side.
# Rounds alternate the modes so drift on a shared machine hits both alike.
# Usage: scripts/isolation-bench.sh [DEVICE] [SECONDS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
device=${1:-host}
secs=${2:-5}
rounds=${3:-3}
plover=bin/plover
bundle=build/samples/cnn-$device
work=$(mktemp -d -t plover-isobench-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
. scripts/lib/bench.sh
cnn_digit "$work/digit.bin"

declare -A url
for mode in none process; do
  "$plover" serve --listen 127.0.0.1:0 --data "$work/$mode" --device "$device" --isolation "$mode" --poll 0 >"$work/$mode.log" 2>&1 &
  pids+=($!)
  url[$mode]=$(server_url "$work/$mode.log")
done
sleep 1 # the process server's standby worker starts in the background

field() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
printf "| round | mode | hot p50 ms (1 client) | hot p99 ms | req/s (4 clients) | cold total ms | cold load ms |\n|---|---|---:|---:|---:|---:|---:|\n"
for r in $(seq 1 "$rounds"); do
  for mode in none process; do
    export PLOVER_SERVER=${url[$mode]}
    # A fresh version each round: its first request is a cold start. The
    # pause lets the previous version's worker finish exiting (and the
    # standby pool refill), so the cold start is measured alone, as after a
    # scale to zero; both modes wait alike.
    "$plover" deploy "$bundle" >/dev/null
    sleep 0.3
    "$plover" invoke cnn --in "$work/digit.bin" --out /dev/null --timing 2>"$work/timing"
    cold_load=$(sed -n 's/.*load;dur=\([0-9.]*\).*/\1/p' "$work/timing")
    cold_total=$(sed -n 's/.*total;dur=\([0-9.]*\).*/\1/p' "$work/timing")
    one=$("$plover" bench cnn --in "$work/digit.bin" --concurrency 1 --duration "${secs}s" --json)
    four=$("$plover" bench cnn --in "$work/digit.bin" --concurrency 4 --duration "${secs}s" --json)
    p50=$(echo "$one" | field 'd["latency_ms"]["p50"]')
    p99=$(echo "$one" | field 'd["latency_ms"]["p99"]')
    rps=$(echo "$four" | field 'round(d["throughput_per_s"])')
    printf "| %d | %s | %.3f | %.3f | %s | %s | %s |\n" "$r" "$mode" "$p50" "$p99" "$rps" "$cold_total" "$cold_load"
    echo "$mode $p50 $rps $cold_total" >>"$work/rows"
  done
done
# process ÷ none, medians over the rounds
python3 - "$work/rows" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = lambda mode, i: statistics.median(float(r[i]) for r in rows if r[0] == mode)
print()
print("process ÷ none (medians of the rounds): hot p50 %.2f×, throughput %.2f×, cold total %.2f×"
      % (med("process", 1) / med("none", 1), med("process", 2) / med("none", 2), med("process", 3) / med("none", 3)))
PY
