#!/usr/bin/env bash
# warm-sequence.sh — a function with large constants warmed up again and
# again: the CNN with MIB MiB of zeros after its weights, idle_ttl 1s, so
# that every request after the first finds it unloaded. Prints each
# request's load time and the cold start's fetch part, where the bundle
# cache's check of the cached files shows: hashed (about 1 ms per MiB
# here) or checked by their identity once they are settled (README,
# "verifies the sha256"). Usage: scripts/warm-sequence.sh [N] [MIB]
# (defaults 5 and 64; after make build samples).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-5}
mib=${2:-64}
plover=${PLOVER:-bin/plover}

. scripts/lib/bench.sh
scratch
cnn_digit "$work/digit.bin"
mkdir -p "$work/big"
cp build/samples/cnn-host/* "$work/big/"
python3 - "$work/big" "$mib" <<'PY'
import json, sys
d, mib = sys.argv[1], int(sys.argv[2])
m = json.load(open(d + "/plover.json")); m["name"] = "big"; m["idle_ttl"] = "1s"
json.dump(m, open(d + "/plover.json", "w"))
w = open(d + "/weights.bin", "rb").read()
open(d + "/weights.bin", "wb").write(w + bytes(mib << 20))
PY
serve "$work/log"
PLOVER_SERVER=$url "$plover" deploy "$work/big" >/dev/null
for i in $(seq 1 "$n"); do
  unloads=$(grep -c 'msg=unloaded' "$work/log" || true)
  curl -s -o /dev/null -D - -H 'Content-Type: application/octet-stream' --data-binary @"$work/digit.bin" "$url/v1/functions/big/invoke" |
    tr -d '\r' | sed -n "s/^[Ss]erver-[Tt]iming:.*load;dur=\([0-9.]*\).*/request $i: load \1 ms/p"
  # The next request finds it unloaded: wait for the unload, as logged.
  for _ in $(seq 1 100); do
    [ "$(grep -c 'msg=unloaded' "$work/log" || true)" -gt "$unloads" ] && break
    sleep 0.1
  done
done
grep 'msg="cold start"' "$work/log" | sed -n 's/.*load_ms=\([0-9.]*\) fetch_ms=\([0-9.]*\).*/cold start: load_ms \1, fetch_ms \2 (the cached bundle: taken and checked)/p'
