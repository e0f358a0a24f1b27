#!/usr/bin/env bash
# bench-repository.sh — plover serve --repository at scale: a repository of
# N copies of the vecadd sample (each its own function, one folder each),
# served from an empty store (every bundle deployed), then again over the
# same store (a restart: every version already recorded, none deployed),
# timing from the server's start to its first answered request and to the
# last function's; then the index's latency at that size, and how long a
# new version folder takes to become current under --repository-poll 1s.
# Usage: scripts/bench-repository.sh [N] (default 200; after make build samples);
# INVOKE_ALL=0 skips invoking every function (N cold starts, one curl each).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200}
plover=${PLOVER:-bin/plover}
. scripts/lib/bench.sh
scratch

sample=build/samples/vecadd-host
in=build/samples/vecadd-input.bin
mkdir -p "$work/models"
for i in $(seq -f '%04g' 1 "$n"); do
  d="$work/models/fn-$i"
  mkdir -p "$d"
  ln "$sample/vecadd.so" "$sample/b.bin" "$d/"
  sed "s/\"name\": \"vecadd\"/\"name\": \"fn-$i\"/" "$sample/plover.json" >"$d/plover.json"
done
touch -d '1 minute ago' "$work/models" "$work/models"/* "$work/models"/*/*
last=fn-$(printf '%04d' "$n")
now_ms() { date +%s%3N; }

# run LABEL: starts a server on the shared data directory, then times its
# first answered request (fn-0001) and the last function's.
run() {
  local t0 url first all
  t0=$(now_ms)
  "$plover" serve --listen 127.0.0.1:0 --data "$work/data" --device host --poll 0 \
    --repository "$work/models" --repository-poll 1s --repository-settle 1s >"$work/$1.log" 2>&1 &
  spid=$!
  url=$(server_url "$work/$1.log")
  until curl -sf -o /dev/null -H 'Content-Type: application/octet-stream' --data-binary @"$in" "$url/v1/functions/fn-0001/invoke"; do sleep 0.02; done
  first=$(($(now_ms) - t0))
  until [ "$(curl -s -X POST "$url/v2/repository/index" | grep -o READY | wc -l)" -ge "$n" ]; do sleep 0.02; done
  ready=$(($(now_ms) - t0))
  if [ "${INVOKE_ALL:-1}" = 1 ]; then
    for f in $(ls "$work/models"); do # every function answers (a cold start each, a curl each)
      curl -sf -o /dev/null -H 'Content-Type: application/octet-stream' --data-binary @"$in" "$url/v1/functions/$f/invoke"
    done
  fi
  all=$(($(now_ms) - t0))
  echo "$1: $n functions: first request (fn-0001) answered $first ms after start; all READY at $ready ms; each invoked once (cold, one curl each) by $all ms; deploys: $(grep -c 'model repository: deployed' "$work/$1.log" || true)"
  URL=$url
}
stop() { kill "$spid"; wait "$spid" 2>/dev/null || true; spid=; }

run "empty store"
stop
run "restart"

# The index: 200 requests from one keep-alive client.
python3 - "$URL" <<'PY'
import http.client, sys, time, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
c = http.client.HTTPConnection(u.hostname, u.port)
ts, size = [], 0
for i in range(200):
    t = time.perf_counter()
    c.request("POST", "/v2/repository/index", body=b"")
    r = c.getresponse(); b = r.read(); assert r.status == 200
    ts.append((time.perf_counter() - t) * 1e3); size = len(b)
ts.sort()
print(f"index of {b.count(b'READY')} entries ({size} bytes): p50 {ts[100]:.2f} ms, p99 {ts[197]:.2f} ms, max {ts[-1]:.2f} ms (200 requests, one keep-alive connection)")
PY

# New version folders, one at a time: from the end of each copy to current.
v="$work/models/fn-0001"
mkdir -p "$work/v"
mv "$v/plover.json" "$v/vecadd.so" "$v/b.bin" "$work/v/" # fn-0001 becomes a folder of versions
mkdir -p "$v/1"
cp "$work/v/"* "$v/1/"
until curl -s -X POST "$URL/v2/repository/index" | grep -q '"name":"fn-0001","version":"1","state":"READY"'; do sleep 0.02; done
took=()
for k in 2 3 4 5 6 7; do
  sleep 0.$((RANDOM % 10)) # at a random point of the poll
  mkdir "$v/$k"
  cp "$work/v/"* "$v/$k/"
  t0=$(now_ms)
  until curl -s -X POST "$URL/v2/repository/index" | grep -q "\"name\":\"fn-0001\",\"version\":\"$k\",\"state\":\"READY\""; do sleep 0.02; done
  took+=($(($(now_ms) - t0)))
done
echo "new version folders (--repository-poll 1s, --repository-settle 1s): current after their copy ended in ${took[*]} ms"
stop
