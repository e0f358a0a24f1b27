#!/usr/bin/env bash
# Part of make demo: the digits pipeline (samples/digits-pipeline) on the
# running server ($PLOVER_SERVER), after demo-cnn.sh deployed cnn: raw
# pixels in, normalised on the host, classified by the CNN, top-1 out, in
# one request. Checks five held-out digits.
set -euo pipefail
# Every PLOVER_* variable unset but PLOVER_SERVER, set by demo.sh (scripts/lib/demo-env.sh).
. "$(dirname "$0")/lib/demo-env.sh"
demo_clean_env PLOVER_SERVER
plover=${1:-bin/plover}
work=${2:?work directory}
echo "== deploy the digits pipeline: digits-normalize > cnn > digits-top1"
"$plover" deploy build/samples/digits-normalize-host
"$plover" deploy build/samples/digits-top1-host
"$plover" deploy build/samples/digits-pipeline
held=samples/cnn/testdata/heldout.bin
right=0
for i in 0 100 200 350 499; do  # labels 0, 1, 3, 6 and 9
  # Record i: 785 bytes from offset 12, its label first, then 784 pixels.
  off=$((12 + 785 * i))
  want=$(od -A n -t u1 -j "$off" -N 1 "$held" | tr -d ' ')
  dd if="$held" of="$work/pixels.bin" iflag=skip_bytes,count_bytes skip=$((off + 1)) count=784 status=none
  "$plover" invoke digits --in "$work/pixels.bin" --out "$work/top1.bin" --timing 2>"$work/timing"
  label=$(od -A n -t d4 -N 4 "$work/top1.bin" | tr -d ' ')
  score=$(od -A n -t f4 -j 4 -N 4 "$work/top1.bin" | tr -d ' ')
  echo "-- held-out digit $i: label $label (score $score), expected $want"
  [ "$label" = "$want" ] && right=$((right + 1))
done
sed -n 's/^Server-Timing: /   Server-Timing (ms) of the last: /p' "$work/timing"
if [ "$right" -lt 5 ]; then
  echo "demo: the digits pipeline labelled $right of 5 held-out digits correctly" >&2
  exit 1
fi
echo "== digits pipeline: 5 of 5 held-out digits labelled correctly, in one request each"
