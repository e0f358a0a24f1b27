#!/usr/bin/env bash
# cpu-per-request.sh — where the CPU of a loaded server goes, per request:
# the server, the worker serving the function (--isolation process; the
# busiest of the server's children: the standby workers idle) and the load
# generator (GNU time), user and system time and context switches, for the CNN
# sample at C closed-loop clients, through --isolation none and process in
# turn. On a machine whose CPUs are all busy, throughput is the inverse of
# this sum, so the two modes' sums explain their throughput ratio.
# Usage: scripts/cpu-per-request.sh [CLIENTS] [REQUESTS] [ROUNDS]
# (defaults 4, 20000, 1; run from the repository root after make build samples)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x /usr/bin/time ] || { echo "needs GNU time (/usr/bin/time)" >&2; exit 1; }
clients=${1:-4}
requests=${2:-20000}
rounds=${3:-1}
plover=${PLOVER:-bin/plover}
work=$(mktemp -d)
pids=()
trap 'for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT

. scripts/lib/bench.sh
cnn_digit "$work/digit.bin"

# user and system clock ticks of a process, its threads included
times() { awk '{ s = $0; sub(/.*\) /, "", s); split(s, f, " "); print f[12], f[13] }' "/proc/$1/stat"; }
# voluntary and involuntary context switches over its threads
switches() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^voluntary/ { v += $2 } /^nonvoluntary/ { n += $2 } END { print v + 0, n + 0 }'; }
hz=$(getconf CLK_TCK)
per() { awk -v a="$1" -v b="$2" -v n="$requests" -v hz="$hz" 'BEGIN { printf "%.0f", (b - a) * 1e6 / hz / n }'; }
perc() { awk -v a="$1" -v b="$2" -v n="$requests" 'BEGIN { printf "%.2f", (b - a) / n }'; }

printf "| round | mode | req/s | server user / sys µs | worker user / sys µs | client µs | switches per request, server (vol/invol) | worker (vol/invol) |\n|---|---|---:|---|---|---:|---|---|\n"
for r in $(seq 1 "$rounds"); do
  for mode in none process; do
    log=$work/$mode-$r.log
    "$plover" serve --listen 127.0.0.1:0 --data "$work/d-$mode-$r" --device host --isolation "$mode" --poll 0 >"$log" 2>&1 &
    spid=$!
    pids+=("$spid")
    PLOVER_SERVER=$(server_url "$log")
    export PLOVER_SERVER
    "$plover" deploy build/samples/cnn-host >/dev/null
    "$plover" bench cnn --in "$work/digit.bin" --concurrency "$clients" --requests 3000 >/dev/null # warm
    # the worker serving cnn: the server's child with the most CPU so far
    wpid=$spid
    if [ "$mode" = process ]; then
      wpid=$(for p in $(pgrep -P "$spid"); do read -r u s < <(times "$p"); echo "$((u + s)) $p"; done | sort -n | tail -n 1 | cut -d' ' -f2)
    fi
    read -r su0 ss0 < <(times "$spid"); read -r wu0 ws0 < <(times "$wpid")
    read -r sv0 sn0 < <(switches "$spid"); read -r wv0 wn0 < <(switches "$wpid")
    out=$(/usr/bin/time -o "$work/time" -f "%U %S" "$plover" bench cnn --in "$work/digit.bin" --concurrency "$clients" --requests "$requests" --json)
    read -r su1 ss1 < <(times "$spid"); read -r wu1 ws1 < <(times "$wpid")
    read -r sv1 sn1 < <(switches "$spid"); read -r wv1 wn1 < <(switches "$wpid")
    rps=$(python3 -c 'import json,sys; print(round(json.load(sys.stdin)["throughput_per_s"]))' <<<"$out")
    client=$(awk -v n="$requests" '{ printf "%.0f", ($1 + $2) * 1e6 / n }' "$work/time")
    if [ "$mode" = none ]; then
      wcol="-"; wsw="-"
    else
      wcol="$(per "$wu0" "$wu1") / $(per "$ws0" "$ws1")"; wsw="$(perc "$wv0" "$wv1") / $(perc "$wn0" "$wn1")"
    fi
    printf "| %d | %s | %s | %s / %s | %s | %s | %s / %s | %s |\n" "$r" "$mode" "$rps" \
      "$(per "$su0" "$su1")" "$(per "$ss0" "$ss1")" "$wcol" "$client" "$(perc "$sv0" "$sv1")" "$(perc "$sn0" "$sn1")" "$wsw"
    kill "$spid"
    wait "$spid" 2>/dev/null || true
  done
done
