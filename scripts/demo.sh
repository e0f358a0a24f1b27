#!/usr/bin/env bash
# make demo: start a server on a free loopback port with a throwaway data
# directory, deploy the samples, invoke them, check the results, print the
# timing breakdown, and stop the server.
set -euo pipefail
cd "$(dirname "$0")/.."
# None of the user's PLOVER_* variables (PLOVER_STORE, PLOVER_AUTH_FILE, ...):
# the demo's server and deploys use the demo's own settings only.
. scripts/lib/demo-env.sh
demo_clean_env
plover=bin/plover
data=$(mktemp -d -t plover-demo-XXXXXX)
log="$data/serve.log"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$data"
}
trap cleanup EXIT

"$plover" serve --listen 127.0.0.1:0 --data "$data" --store "file://$data/store" --device host >"$log" 2>&1 &
server_pid=$!
addr=""
for _ in $(seq 1 100); do
  addr=$(sed -n 's/.*addr=http:\/\/\([0-9.:]*\).*/\1/p' "$log" | head -n 1)
  [ -n "$addr" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$log"; echo "demo: server exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$addr" ] || { cat "$log"; echo "demo: server did not start" >&2; exit 1; }
export PLOVER_SERVER="http://$addr"
echo "== plover serve is up at $PLOVER_SERVER (data in $data)"

echo "== deploy vecadd"
"$plover" deploy build/samples/vecadd-host
for round in 1 2 3; do
  "$plover" invoke vecadd --in build/samples/vecadd-input.bin --out "$data/sum.bin" --timing 2>"$data/timing"
  echo "-- invoke $round: $(head -n 1 "$data/timing")"
  sed -n 's/^Server-Timing: /   Server-Timing (ms): /p' "$data/timing"
done
if cmp -s "$data/sum.bin" build/samples/vecadd-expected.bin; then
  echo "== vecadd: 1,000,000 sums match the expected output byte for byte"
else
  echo "demo: vecadd output differs from build/samples/vecadd-expected.bin" >&2
  exit 1
fi
od -A d -t f4 -N 16 "$data/sum.bin" | head -n 1 | sed 's/^/   first floats: /'

if [ -d build/samples/cnn-host ] && [ -x scripts/demo-cnn.sh ]; then
  bash scripts/demo-cnn.sh "$plover"
  if [ -d build/samples/digits-pipeline ]; then
    bash scripts/demo-digits.sh "$plover" "$data"
  fi
fi
echo "== functions"
"$plover" ls
echo "== demo passed"
