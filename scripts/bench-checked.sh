#!/bin/bash
# Checked mode on the server: vecadd (4 MB in, 4 MB out) and cnn (3136 B in), plover serve with and
# without --checked, two rounds alternating, plover bench --concurrency 1 --duration 4s.
# Needs `make build samples` first (bin/plover, build/samples/).
P=${PLOVER:-bin/plover}
cd "$(dirname "$0")/.." || exit 1
for round in 1 2; do
for mode in default checked; do
  data=$(mktemp -d); port=$((18900 + RANDOM % 500))
  extra=""; [ $mode = checked ] && extra="--checked"
  $P serve --listen 127.0.0.1:$port --data $data --device host $extra >/tmp/chk_srv.log 2>&1 &
  pid=$!
  for i in $(seq 50); do curl -s 127.0.0.1:$port/healthz >/dev/null && break; sleep 0.1; done
  export PLOVER_SERVER=http://127.0.0.1:$port
  $P deploy build/samples/vecadd-host >/dev/null
  $P deploy build/samples/cnn-host >/dev/null
  v=$($P bench vecadd --in build/samples/vecadd-input.bin --concurrency 1 --duration 4s --json | python3 -c 'import json,sys;d=json.load(sys.stdin);l=d["latency_ms"];print(l["p50"],l["p99"])')
  c=$($P bench cnn --size 3136 --concurrency 1 --duration 4s --json | python3 -c 'import json,sys;d=json.load(sys.stdin);l=d["latency_ms"];print(l["p50"],l["p99"])')
  echo "round $round $mode vecadd p50/p99 ms: $v  cnn p50/p99 ms: $c"
  kill $pid; wait $pid 2>/dev/null; rm -rf $data
done; done
