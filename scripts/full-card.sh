#!/usr/bin/env bash
# full-card.sh DEVICE BUNDLE INPUT PORT WORKDIR [SERVE FLAGS...]
#
# Loads that evict on a full device, in both worker scopes: two functions
# made from BUNDLE (vecadd) with buffers of BUF_MIB each (default 1024:
# an instance of 3 GiB) fit one at a time, so each request to the other
# evicts the one loaded and must load right after it. The driver counts
# the victim's memory free only once its worker has let go of it (its
# instance's free, its unload, its exit); the load waits for that
# (worker/release.go) and must not fail. On a GPU the card is made full by
# scripts/gpu-ballast.cu (the caller runs it); on the host device pass
# --memory-limit. It shows that every load right after an eviction was
# served, not that one had to wait (a card that frees at once passes too).
# ROUNDS (default 5) pairs of requests a scope. Runs
# bin/plover from the repository root; servers on 127.0.0.1:PORT, data and
# logs under WORKDIR. Prints a line a request and PASS or FAIL lines; exits
# 1 on a failure. Ends by itself: every wait is bounded.
set -u
. scripts/lib/bench.sh
if [ "$#" -lt 5 ]; then
  echo "usage: $0 DEVICE BUNDLE INPUT PORT WORKDIR [SERVE FLAGS...]" >&2
  exit 2
fi
dev=$1 bundle=$2 in=$3 port=$4 work=$5
shift 5
url=http://127.0.0.1:$port
buf=$((${BUF_MIB:-1024} << 20)) rounds=${ROUNDS:-5}
mkdir -p "$work"
failed=0 spid=
trap '[ -n "$spid" ] && kill "$spid" 2>/dev/null; wait 2>/dev/null' EXIT
trap 'exit 124' INT TERM # through the EXIT trap: the server goes too

for f in a b; do
  rm -rf "$work/full-$f"
  cp -r "$bundle" "$work/full-$f"
  sed -i -e "s/\"name\": *\"[^\"]*\"/\"name\": \"full-$f\"/" \
    -e "s/\"max_input_bytes\": *[0-9]*/\"max_input_bytes\": $buf/" \
    -e "s/\"tmp_bytes\": *[0-9]*/\"tmp_bytes\": $buf/" \
    -e "s/\"out_bytes\": *[0-9]*/\"out_bytes\": $buf/" "$work/full-$f/plover.json"
done

for scope in function tenant; do
  log=$work/server-$scope.log
  PLOVER_STANDBY_WORKERS=0 bin/plover serve --listen "127.0.0.1:$port" --data "$work/data-$scope" --device "$dev" \
    --isolation process --worker-scope "$scope" "$@" >"$log" 2>&1 &
  spid=$!
  if ! await_healthz "$url" "$spid" "$log"; then
    echo "FAIL: full card, $scope scope: the server did not come up"
    kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    spid=
    failed=1
    continue
  fi
  for f in a b; do
    bin/plover deploy "$work/full-$f" --server "$url" >/dev/null || { echo "FAIL: full card: deploy full-$f"; failed=1; }
  done
  bad=0
  for r in $(seq "$rounds"); do
    for f in a b; do
      rm -f "$work/hdr" "$work/out"
      res=$(curl -sS -m 60 -o "$work/out" -D "$work/hdr" -w '%{http_code} %{time_total}' \
        -H 'Content-Type: application/octet-stream' --data-binary @"$in" "$url/v1/functions/full-$f/invoke" 2>&1)
      start=$(tr -d '\r' <"$work/hdr" 2>/dev/null | sed -n 's/^[Xx]-[Pp]lover-[Ss]tart: *//p')
      timing=$(tr -d '\r' <"$work/hdr" 2>/dev/null | sed -n 's/^[Ss]erver-[Tt]iming: *//p')
      echo "$scope round $r full-$f: ${res} ${start:--} ${timing}"
      if [ "${res%% *}" != 200 ]; then
        bad=$((bad + 1))
        echo "  $(head -c 300 "$work/out" | tr -c '[:print:]\n' '.')"
      fi
    done
  done
  # Instances and functions evicted (only a function's is logged).
  evicted=$(curl -sf -m 10 "$url/metrics" | awk '/^plover_evictions_total/ { n += $NF } END { print n + 0 }')
  kill "$spid" 2>/dev/null
  wait "$spid" 2>/dev/null
  spid=
  if [ "$bad" -gt 0 ]; then
    echo "FAIL: full card, $scope scope: $bad of $((2 * rounds)) requests failed ($evicted evictions; $log)"
    failed=1
  elif [ "$evicted" -lt $((2 * rounds - 1)) ]; then
    echo "FAIL: full card, $scope scope: $evicted evictions in $((2 * rounds)) alternating requests: the device was not full, nothing was tested"
    failed=1
  else
    echo "PASS: full card, $scope scope: $((2 * rounds)) alternating loads, each after an eviction ($evicted), all 200"
  fi
done
exit "$failed"
