#!/usr/bin/env bash
# Part of make demo: deploy the MNIST CNN to the running server ($PLOVER_SERVER)
# and classify two real held-out digit images with the sample's client.
set -euo pipefail
# Every PLOVER_* variable unset but PLOVER_SERVER, set by demo.sh (scripts/lib/demo-env.sh).
. "$(dirname "$0")/lib/demo-env.sh"
demo_clean_env PLOVER_SERVER
plover=${1:-bin/plover}
echo "== deploy cnn"
"$plover" deploy build/samples/cnn-host
for img in samples/cnn/testdata/digit7.png samples/cnn/testdata/digit7-paper.png; do
  echo "-- bin/cnn-classify $img"
  bin/cnn-classify "$img" | sed 's/^/   /'
done
