#!/usr/bin/env bash
# tenant-reload.sh DEVICE BUNDLE INPUT EXPECTED PORT WORKDIR
#
# A function unloaded by its idle TTL and loaded again into its tenant's
# worker, which a sibling's requests keep: the reload must run right. A
# worker never closes a CUDA library, and dlopen matches a file it holds by
# its device and inode, so the worker answers the reload that it maps the
# file already and the server stages a copy of the library under a new
# name (wire.StMapped; worker/tenant.go, stageCopy): this checks on a real
# driver that the copy's kernels register and run in the worker's one
# context, beside the sibling's. Runs bin/plover from the repository root; the server is on
# 127.0.0.1:PORT, its data and logs under WORKDIR. Prints PASS or FAIL lines;
# exits 1 on a failure. Ends by itself: every wait is bounded.
set -u
. scripts/lib/bench.sh
if [ "$#" -ne 6 ]; then
  echo "usage: $0 DEVICE BUNDLE INPUT EXPECTED PORT WORKDIR" >&2
  exit 2
fi
dev=$1 bundle=$2 in=$3 want=$4 port=$5 work=$6
url=http://127.0.0.1:$port
mkdir -p "$work"
failed=0
fail() {
  echo "FAIL: reload: $*"
  failed=1
}

PLOVER_WORKER_SCOPE=tenant PLOVER_IDLE_TTL=2s PLOVER_STANDBY_WORKERS=0 \
  bin/plover serve --listen "127.0.0.1:$port" --data "$work/data" --device "$dev" --isolation process >"$work/server.log" 2>&1 &
spid=$!
trap 'kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null' EXIT
trap 'exit 124' INT TERM # through the EXIT trap: the server goes too
if ! await_healthz "$url" "$spid" "$work/server.log"; then
  fail "the server did not come up"
  exit 1
fi

# Two functions of one bundle: a, as built, and b, a copy renamed.
a=$(sed -n 's/^ *"name": *"\([^"]*\)".*/\1/p' "$bundle/plover.json" | head -n 1)
b=reload-sibling
rm -rf "$work/sibling"
cp -r "$bundle" "$work/sibling"
sed -i "0,/\"name\": *\"$a\"/s//\"name\": \"$b\"/" "$work/sibling/plover.json"
for d in "$bundle" "$work/sibling"; do
  bin/plover deploy "$d" --server "$url" >/dev/null || fail "deploy $d"
done

info() { curl -sS -m 10 "$url/v1/functions/$1"; }
field() { grep -o "\"$2\":[^,}]*" <<<"$1" | head -n 1 | cut -d: -f2; }
right() { # right NAME WHEN: its output is the expected one
  if ! bin/plover invoke "$1" --in "$in" --out "$work/out" --server "$url" --timeout 60s 2>"$work/invoke.err"; then
    fail "$1, $2: $(head -c 300 "$work/invoke.err")"
  elif ! cmp -s "$work/out" "$want"; then
    fail "$1, $2: the output differs from $want"
  else
    return 0
  fi
  return 1
}
pids() { grep -o '"pid":[0-9]*' <<<"$1" | cut -d: -f2 | sort -u | tr '\n' ' '; }

right "$a" "first load" && right "$b" "first load" || exit 1
first=$(pids "$(info "$a")")
# b's requests keep the worker while a's instance and then a go idle.
unloaded=0
for _ in $(seq 1 100); do
  if [ "$(field "$(info "$a")" loaded)" = false ]; then
    unloaded=1
    break
  fi
  right "$b" "while $a idles" || exit 1
  sleep 0.2
done
[ "$unloaded" = 1 ] || {
  fail "$a was never unloaded (idle TTL 2s, 20 s waited)"
  exit 1
}
right "$a" "loaded again" || exit 1
ia=$(info "$a")
cold=$(field "$ia" cold_starts)
again=$(pids "$ia")
sib=$(pids "$(info "$b")")
if [ "$cold" != 2 ]; then
  fail "$a: $cold cold starts, want 2 (its first load and the reload)"
elif [ "$again" != "$first" ] || [ "$again" != "$sib" ]; then
  fail "$a ran in worker(s) ${first:-none} then ${again:-none}, $b in ${sib:-none}: want one tenant worker throughout"
else
  right "$b" "after the reload" && right "$a" "again, hot" &&
    echo "PASS: reload: $a unloaded and loaded again into its tenant's worker (pid ${again% }) beside $b: right output on $dev"
fi
exit "$failed"
