#!/usr/bin/env bash
# gpu-check.sh — checks Plover on a machine with an NVIDIA GPU, no Go and no
# network, from the repository root, using artifacts built beforehand
# elsewhere (see "Build" below). It prints, and copies to $OUT when that is
# set: the GPU, the CUDA device tests, a cold/warm/hot latency table, graph
# vs direct time for a 9-kernel chain, copy bandwidth, CUDA-vs-host output
# equality, what a faulting kernel does (with and without worker
# processes), and the cost of isolation on the CNN. Exit status 0
# means every check passed.
#
# Build (on the dev machine, from the repository root):
#   make build vecadd-host vecadd-cuda          # bin/plover, build/samples/vecadd-{host,cuda}/,
#                                               # build/samples/vecadd-input.bin
#   go test -c -o bin/device.test ./device
#   mkdir -p build/cudatest && nvcc -x cu -shared -Xcompiler -fPIC -O3 -Iabi \
#     -gencode arch=compute_80,code=sm_80 -gencode 'arch=compute_90,code=[sm_90,compute_90]' \
#     -o build/cudatest/testkernels.so device/testdata/kernels.cu
#   optional: make cnn-host cnn-cuda            # build/samples/cnn-{host,cuda}/; the CNN check
#                                               # also needs python3 here to read heldout.bin
#
# Assumptions about the CLI and HTTP API (written while they were being
# written; adjust here if they drift):
#   plover serve --listen HOST:PORT --data DIR --device cuda|host
#   plover deploy DIR --server URL
#   plover invoke NAME --in FILE --out FILE --server URL
#   POST /v1/functions/NAME/invoke (application/octet-stream) answers with the
#     output and the headers X-Plover-Start: cold|warm|hot and
#     Server-Timing: queue;dur=…, load;dur=…, copyin;dur=…, kernels;dur=…,
#     copyout;dur=…, total;dur=… (milliseconds)
#   a kernel failure is 500, an unhealthy device 503; GET /healthz is 200, or
#     503 with "unhealthy" in its body
#   curl is used when present (status codes, headers); without it invokes go
#   through `plover invoke --timing` and /healthz through bash's /dev/tcp.
#
# Environment: OUT (copy the report and logs there), HOT_RUNS (default 50),
# BENCHTIME (go test -test.benchtime, default 2s), PORT (first of two ports),
# NO_CURL=1 (use the fallbacks even where curl exists), SKIP (sections to
# leave out, of "tests bench sanitizer eager batch"), ISO_SECONDS/ISO_ROUNDS
# (isolation bench, default 5 and 3), FAIR_TIME (fairness bench, default
# 5s), BATCH_TIME/BATCH_SWEEP (batching bench, default 3s and 0.5,1,2).
# $OUT gets gpu-check.txt (this report) and gpu-check-logs.tgz (the logs).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  # tee ignores the timeout's TERM (sent to the whole process group), so
  # that the report's end and the cleanup below still reach it.
  exec > >(trap '' INT TERM; exec tee -a "$OUT/gpu-check.txt") 2>&1
  tee_pid=$!
fi

hot_runs=${HOT_RUNS:-50}
benchtime=${BENCHTIME:-2s}
port=${PORT:-$((20000 + RANDOM % 20000))}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/plover-gpu-check.XXXXXX")
mkdir -p "$tmp/logs"
failures=0
pids=()

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
  local p
  trap '' PIPE
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  # Also when a section hangs and a timeout ends the script: the logs say
  # why. One archive beside the report: the device tool returns 8 files.
  if [ -n "${OUT:-}" ]; then
    for p in "$tmp"/server-*.log; do [ -f "$p" ] && cp "$p" "$tmp/logs/"; done
    tar czf "$OUT/gpu-check-logs.tgz" -C "$tmp/logs" . 2>/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 143' TERM INT # a timeout's signal still runs cleanup

say() { printf '%s\n' "$*"; }
section() { printf '\n== %s ==\n' "$*"; }
pass() { say "PASS: $*"; }
fail() {
  say "FAIL: $*"
  failures=$((failures + 1))
}
skip() { case " ${SKIP:-} " in *" $1 "*) say "SKIP: $1 (SKIP=${SKIP})"; return 0 ;; esac; return 1; }
have() { # NO_CURL=1 exercises the fallbacks
  if [ "$1" = curl ] && [ -n "${NO_CURL:-}" ]; then return 1; fi
  command -v "$1" >/dev/null 2>&1
}
body() { head -c 300 "$1" | tr -c '[:print:]\n' '.'; } # a response body, printable
save() { # save FILE NAME: keep a log for $OUT/gpu-check-logs.tgz
  if [ -f "$1" ]; then cp "$1" "$tmp/logs/$2"; fi
}

# ---------------------------------------------------------------- artifacts
section "artifacts"
# make gpu-artifacts packs the binaries (plover, plover-worker beside it,
# device.test, plover-bench-suite) into one gzip so that the carry fits.
if [ -f build/gpu-bin.tgz ]; then
  tar xzf build/gpu-bin.tgz && say "ok  unpacked build/gpu-bin.tgz"
fi
missing=0
for f in bin/plover bin/plover-worker bin/device.test build/cudatest/testkernels.so \
  build/samples/vecadd-cuda/plover.json build/samples/vecadd-host/plover.json \
  build/samples/vecadd-input.bin; do
  if [ -e "$f" ]; then say "ok  $f"; else
    say "missing $f"
    missing=1
  fi
done
if [ "$missing" = 1 ]; then
  fail "artifacts missing: build them first (see the top of $0)"
  exit 1
fi
if have curl; then say "curl: $(command -v curl)"; else say "curl: not found, using plover invoke and /dev/tcp"; fi

# ---------------------------------------------------------------- the GPU
section "GPU"
if have nvidia-smi; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || fail "nvidia-smi failed"
else
  fail "nvidia-smi not found"
fi

# ---------------------------------------------------------------- device tests
section "CUDA device tests (bin/device.test -test.v)"
if ! skip tests; then
testlog=$tmp/cuda-test.txt
(cd device && PLOVER_TEST_CUDA_BUNDLE_DIR="$root/build/cudatest" \
  "$root/bin/device.test" -test.v -test.count=1 -test.timeout=10m) >"$testlog" 2>&1
test_rc=$?
save "$testlog" cuda-test.txt
grep -E '^(=== RUN|--- (PASS|FAIL|SKIP)|    --- (PASS|FAIL|SKIP)|PASS$|FAIL$|ok |panic)' "$testlog" | grep -v '^=== RUN'
grep -E 'no CUDA device|no CUDA test bundle' "$testlog" | sort -u | head -3
if [ "$test_rc" -ne 0 ]; then
  fail "bin/device.test exited $test_rc (full log: cuda-test.txt)"
  tail -n 40 "$testlog"
elif grep -q -- '--- SKIP: TestGPUSuite' "$testlog"; then
  fail "the GPU tests skipped (reason above)"
else
  pass "CUDA device tests"
fi
fi

# ---------------------------------------------------------------- benchmarks
section "benchmarks (graph vs direct, copy bandwidth, a new instance and its first runs)"
if ! skip bench; then
benchlog=$tmp/cuda-bench.txt
(cd device && PLOVER_TEST_CUDA_BUNDLE_DIR="$root/build/cudatest" \
  "$root/bin/device.test" -test.run='^$' -test.bench='^Benchmark(Chain9|Copy|NewInstance)' \
  -test.benchtime="$benchtime" -test.timeout=10m) >"$benchlog" 2>&1 || fail "benchmarks failed (cuda-bench.txt)"
save "$benchlog" cuda-bench.txt
grep -E '^Benchmark' "$benchlog"
# field value before a unit, e.g. metric "ns/op"
metric() { awk -v unit="$2" '{ for (i = 2; i <= NF; i++) if ($i == unit) { print $(i - 1); exit } }' <<<"$1"; }
g_line=$(grep -E '^BenchmarkChain9Graph' "$benchlog" | tail -n 1)
d_line=$(grep -E '^BenchmarkChain9Direct' "$benchlog" | tail -n 1)
if [ -n "$g_line" ] && [ -n "$d_line" ]; then
  say ""
  say "9-kernel chain (load, 7 x inc, store at <<<64,64>>>; 3136 B in, 40 B out), per request:"
  printf '%-8s %14s %14s %14s\n' mode "Run (us)" "kernels (us)" "copies (us)"
  for m in graph direct; do
    line=$g_line
    [ "$m" = direct ] && line=$d_line
    awk -v m="$m" -v a="$(metric "$line" ns/op)" -v k="$(metric "$line" kernel-ns/op)" -v c="$(metric "$line" copy-ns/op)" \
      'BEGIN { printf "%-8s %14.1f %14.1f %14.1f\n", m, a / 1000, k / 1000, c / 1000 }'
  done
  awk -v g="$(metric "$g_line" ns/op)" -v d="$(metric "$d_line" ns/op)" \
    'BEGIN { if (g > 0) printf "graph speedup per request: %.2fx (%.1f us saved)\n", d / g, (d - g) / 1000 }'
else
  fail "no Chain9 benchmark results"
fi
say ""
say "copy bandwidth (staged: Run with a host memcpy beside the DMA; inplace: Run on registered memory, the DMA alone by events; pinned: plain cuMemcpy of the same registered bytes, host-timed):"
printf '%-18s %10s %10s\n' size/mode "in GB/s" "out GB/s"
grep -E '^BenchmarkCopy/' "$benchlog" | while read -r line; do
  name=${line%% *}
  name=${name#BenchmarkCopy/}
  printf '%-18s %10s %10s\n' "${name%-*}" "$(metric "$line" in-GB/s)" "$(metric "$line" out-GB/s)"
done
fi

# ---------------------------------------------------------------- servers
http_get() { # http_get PORT PATH BODYFILE -> prints the status code
  if have curl; then
    curl -sS -o "$3" -w '%{http_code}' "http://127.0.0.1:$1$2" 2>/dev/null || printf '000'
    return
  fi
  local resp
  resp=$( (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3 && cat <&3) 2>/dev/null) || {
    printf '000'
    return
  }
  printf '%s' "${resp#*$'\r\n\r\n'}" >"$3"
  awk 'NR == 1 { print $2; exit }' <<<"$resp"
}

start_server() { # start_server DEVICE PORT [ISOLATION] -> sets server_pid
  local dev=$1 p=$2 iso=${3:-process} log=$tmp/server-$1${3:+-$3}.log
  mkdir -p "$tmp/data-$dev${3:+-$3}"
  # Every server also serves gRPC, 100 ports above its HTTP port.
  bin/plover serve --listen "127.0.0.1:$p" --grpc-listen "127.0.0.1:$((p + 100))" --data "$tmp/data-$dev${3:+-$3}" --device "$dev" --isolation "$iso" >"$log" 2>&1 &
  server_pid=$!
  pids+=("$server_pid")
  local i code
  for i in $(seq 1 120); do
    if ! kill -0 "$server_pid" 2>/dev/null; then
      say "server --device $dev exited:"
      tail -n 20 "$log"
      return 1
    fi
    code=$(http_get "$p" /healthz "$tmp/healthz")
    if [ "$code" = 200 ]; then
      say "server --device $dev on 127.0.0.1:$p: $(cat "$tmp/healthz")"
      return 0
    fi
    sleep 0.5
  done
  say "server --device $dev: /healthz never answered 200"
  tail -n 20 "$log"
  return 1
}

# invoke URL NAME IN OUT -> "code start total kernels copyin copyout client" (ms)
invoke() {
  local hdr=$tmp/hdr.$$.$RANDOM code client t0 t1 err
  if have curl; then
    read -r code client < <(curl -sS -m 60 -o "$4" -D "$hdr" -w '%{http_code} %{time_total}\n' \
      -H 'Content-Type: application/octet-stream' --data-binary @"$3" \
      "$1/v1/functions/$2/invoke" 2>/dev/null || printf '000 0\n')
    client=$(awk -v c="$client" 'BEGIN { printf "%.3f", c * 1000 }')
  else
    t0=$(date +%s%N)
    if bin/plover invoke "$2" --in "$3" --out "$4" --server "$1" --timing 2>"$hdr.err"; then code=200; else
      err=$(cat "$hdr.err")
      code=$(sed -n 's/.*server said \([0-9][0-9][0-9]\).*/\1/p' <<<"$err" | head -n 1)
      cp "$hdr.err" "$4"
    fi
    t1=$(date +%s%N)
    client=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", (b - a) / 1e6 }')
    sed -n 's/^start=\([a-z]*\).*/X-Plover-Start: \1/p; s/^Server-Timing:/Server-Timing:/p' "$hdr.err" >"$hdr"
  fi
  awk -v code="${code:-000}" -v client="$client" '
    { line = $0; sub(/\r$/, "", line); low = tolower(line) }
    low ~ /^x-plover-start:/ { start = line; sub(/^[^:]*:[ ]*/, "", start) }
    low ~ /^server-timing:/ {
      sub(/^[^:]*:[ ]*/, "", line)
      n = split(line, parts, /, */)
      for (i = 1; i <= n; i++) { split(parts[i], kv, /;dur=/); t[kv[1]] = kv[2] }
    }
    END { printf "%s %s %.4f %.4f %.4f %.4f %s\n", code, (start == "" ? "-" : start),
          t["total"], t["kernels"], t["copyin"], t["copyout"], client }' "$hdr" 2>/dev/null
  rm -f "$hdr" "$hdr.err"
}

median() { sort -n | awk '{ a[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# latency SERVER_URL LABEL NAME INPUT: cold (first request), a concurrent
# burst (warm where a new instance starts), then hot runs; rows to $rows.
rows=$tmp/latency-rows
: >"$rows"
latency() {
  local url=$1 label=$2 name=$3 in=$4 i r
  r=$(invoke "$url" "$name" "$in" "$tmp/lat-out")
  say "$label first request: $r"
  echo "$label $r" >>"$rows"
  for i in 1 2 3 4 5 6 7 8; do
    (invoke "$url" "$name" "$in" "$tmp/lat-out-$i" >"$tmp/burst-$i") &
  done
  wait_burst
  for i in 1 2 3 4 5 6 7 8; do echo "$label $(cat "$tmp/burst-$i")" >>"$rows"; done
  for i in $(seq 1 "$hot_runs"); do echo "$label $(invoke "$url" "$name" "$in" "$tmp/lat-out")" >>"$rows"; done
}
# Waits for the burst's subshells only: the servers are children too.
wait_burst() {
  local j
  for j in $(jobs -p); do
    case " ${pids[*]} " in *" $j "*) ;; *) wait "$j" ;; esac
  done
}

section "servers"
cuda_port=$port
host_port=$((port + 1))
cuda_url=http://127.0.0.1:$cuda_port
host_url=http://127.0.0.1:$host_port
cuda_up=0
host_up=0
if start_server cuda "$cuda_port"; then cuda_up=1; else fail "plover serve --device cuda did not come up"; fi
cuda_pid=${server_pid:-}
if start_server host "$host_port"; then host_up=1; else fail "plover serve --device host did not come up"; fi

# ---------------------------------------------------------------- vecadd
section "vecadd: CUDA vs host"
vin=build/samples/vecadd-input.bin
if [ "$cuda_up" = 1 ] && [ "$host_up" = 1 ]; then
  bin/plover deploy build/samples/vecadd-cuda --server "$cuda_url" || fail "deploy vecadd-cuda"
  bin/plover deploy build/samples/vecadd-host --server "$host_url" || fail "deploy vecadd-host"
  # The first requests are the cold ones in the latency table.
  latency "$cuda_url" cuda-vecadd vecadd "$vin"
  latency "$host_url" host-vecadd vecadd "$vin"
  bin/plover invoke vecadd --in "$vin" --out "$tmp/vecadd-cuda.out" --server "$cuda_url" || fail "invoke vecadd (cuda)"
  bin/plover invoke vecadd --in "$vin" --out "$tmp/vecadd-host.out" --server "$host_url" || fail "invoke vecadd (host)"
  if cmp "$tmp/vecadd-cuda.out" "$tmp/vecadd-host.out"; then
    pass "vecadd output: CUDA and host identical ($(wc -c <"$tmp/vecadd-cuda.out") bytes)"
  else
    fail "vecadd output differs between CUDA and host"
  fi
  if [ -f build/samples/vecadd-expected.bin ]; then
    if cmp "$tmp/vecadd-cuda.out" build/samples/vecadd-expected.bin; then
      pass "vecadd output matches vecadd-expected.bin"
    else
      fail "vecadd output differs from vecadd-expected.bin"
    fi
  fi
fi

# ---------------------------------------------------------------- cnn (optional)
section "cnn: CUDA vs host (optional)"
heldout=samples/cnn/testdata/heldout.bin
if [ "$cuda_up" = 1 ] && [ "$host_up" = 1 ] && [ -f build/samples/cnn-cuda/plover.json ] &&
  [ -f build/samples/cnn-host/plover.json ] && [ -f "$heldout" ] && have python3; then
  bin/plover deploy build/samples/cnn-cuda --server "$cuda_url" || fail "deploy cnn-cuda"
  bin/plover deploy build/samples/cnn-host --server "$host_url" || fail "deploy cnn-host"
  # heldout.bin: "PLVDGT01", uint32 count, then records of 1 label byte and
  # 784 pixel bytes k; the network's input is 784 float32 k/255.
  python3 - "$heldout" "$tmp" <<'PY' || fail "cannot read $heldout"
import struct, sys
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"PLVDGT01", "bad magic"
n = struct.unpack_from("<I", data, 8)[0]  # all 500 held-out digits
with open(sys.argv[2] + "/cnn-labels", "w") as labels:
    for i in range(n):
        rec = data[12 + i * 785: 12 + (i + 1) * 785]
        labels.write("%d\n" % rec[0])
        with open("%s/cnn-in-%d.bin" % (sys.argv[2], i), "wb") as f:
            f.write(struct.pack("<784f", *[k / 255 for k in rec[1:]]))
PY
  argmax() { od -An -v -t f4 "$1" | tr -s ' ' '\n' | awk 'NF { i++; if (i == 1 || $1 > m) { m = $1; a = i - 1 } } END { print a }'; }
  n=0 same=0 agree=0 correct=0
  latency "$cuda_url" cuda-cnn cnn "$tmp/cnn-in-0.bin"
  latency "$host_url" host-cnn cnn "$tmp/cnn-in-0.bin"
  while read -r label; do
    in=$tmp/cnn-in-$n.bin
    rc=$(invoke "$cuda_url" cnn "$in" "$tmp/cnn-cuda-$n.out")
    rh=$(invoke "$host_url" cnn "$in" "$tmp/cnn-host-$n.out")
    if [ "${rc%% *}" != 200 ] || [ "${rh%% *}" != 200 ]; then
      fail "cnn digit $n: cuda $rc, host $rh"
    else
      if cmp -s "$tmp/cnn-cuda-$n.out" "$tmp/cnn-host-$n.out"; then same=$((same + 1)); fi
      lc=$(argmax "$tmp/cnn-cuda-$n.out")
      lh=$(argmax "$tmp/cnn-host-$n.out")
      if [ "$lc" = "$lh" ]; then agree=$((agree + 1)); fi
      if [ "$lc" = "$label" ]; then correct=$((correct + 1)); fi
    fi
    n=$((n + 1))
  done <"$tmp/cnn-labels"
  say "cnn: $n digits; CUDA and host labels agree on $agree, outputs byte-identical on $same, CUDA correct on $correct"
  if [ "$agree" = "$n" ]; then pass "cnn labels: CUDA = host"; else fail "cnn labels differ between CUDA and host"; fi
  # The issue's bar: every one of the 10 scores within 1e-4 of the host device's.
  maxdiff=$(python3 - "$tmp" "$n" <<'PY'
import struct, sys
d = 0.0
for i in range(int(sys.argv[2])):
    try:
        c = struct.unpack("<10f", open("%s/cnn-cuda-%d.out" % (sys.argv[1], i), "rb").read())
        h = struct.unpack("<10f", open("%s/cnn-host-%d.out" % (sys.argv[1], i), "rb").read())
    except (OSError, struct.error):
        print("nan"); sys.exit(0)
    d = max(d, max(abs(a - b) for a, b in zip(c, h)))
print("%.3g" % d)
PY
)
  say "cnn: largest score difference CUDA vs host over $n digits: $maxdiff"
  if python3 -c "import sys; sys.exit(0 if float('$maxdiff') <= 1e-4 else 1)"; then pass "cnn scores within 1e-4"; else fail "cnn scores differ by $maxdiff (> 1e-4)"; fi
else
  say "SKIP: needs build/samples/cnn-{cuda,host}/, $heldout and python3"
fi

# ---------------------------------------------------------------- gRPC
# The CUDA CNN through the Open Inference Protocol's gRPC ModelInfer beside
# the HTTP route, same server, same digit: plover bench both ways, in turn.
section "gRPC against HTTP: the CUDA CNN (plover bench, 2000 requests each, one client)"
if [ "$cuda_up" = 1 ] && [ -f "$tmp/cnn-in-0.bin" ] && have python3; then
  p50() { python3 -c 'import json,sys; r=json.load(sys.stdin); print("%s ok, p50 %.3f ms, p99 %.3f ms, server total p50 %.3f ms" % (r["ok"], r["latency_ms"]["p50"], r["latency_ms"]["p99"], r["server_ms"]["total"]["p50"]))'; }
  for round in 1 2; do
    h=$(bin/plover bench cnn --in "$tmp/cnn-in-0.bin" --server "$cuda_url" --requests 2000 --json 2>/dev/null | p50) || h="failed"
    g=$(bin/plover bench cnn --in "$tmp/cnn-in-0.bin" --grpc "grpc://127.0.0.1:$((cuda_port + 100))" --requests 2000 --json 2>/dev/null | p50) || g="failed"
    say "round $round: HTTP /v1: $h"
    say "round $round: gRPC:    $g"
  done
  case "$g" in 2000*) pass "gRPC ModelInfer serves the CUDA CNN" ;; *) fail "gRPC ModelInfer on the CUDA CNN: $g" ;; esac
else
  say "SKIP: needs the cuda server and the cnn section's inputs"
fi

# ---------------------------------------------------------------- pipeline
# CPU and GPU steps in one server: the cuda server also opens the host
# device, so the digits pipeline normalises and picks the top-1 on the CPU
# and runs the CNN (deployed above as cnn-cuda) on the GPU. Its labels must
# be the host CNN's for the same digits.
section "digits pipeline: host steps and the CUDA CNN in one server"
if [ "$cuda_up" = 1 ] && [ -f build/samples/digits-pipeline/plover.json ] && [ -f build/samples/digits-normalize-host/plover.json ] &&
  [ -f "$tmp/cnn-host-49.out" ]; then
  bin/plover deploy build/samples/digits-normalize-host --server "$cuda_url" || fail "deploy digits-normalize-host on the cuda server"
  bin/plover deploy build/samples/digits-top1-host --server "$cuda_url" || fail "deploy digits-top1-host on the cuda server"
  bin/plover deploy build/samples/digits-pipeline --server "$cuda_url" || fail "deploy the digits pipeline"
  curl -sS "$cuda_url/v1/functions" | python3 -c 'import json,sys; print("   runs on:", ", ".join("%s %s" % (f["name"], f.get("target") or f["kind"]) for f in json.load(sys.stdin)["functions"]))' || true
  ok=0
  for n in $(seq 0 49); do
    dd if="$heldout" of="$tmp/px-$n.bin" iflag=skip_bytes,count_bytes skip=$((12 + 785 * n + 1)) count=784 status=none
    r=$(invoke "$cuda_url" digits "$tmp/px-$n.bin" "$tmp/digits-$n.out")
    want=$(argmax "$tmp/cnn-host-$n.out")
    got=$(od -An -t d4 -N 4 "$tmp/digits-$n.out" 2>/dev/null | tr -d ' ')
    if [ "${r%% *}" = 200 ] && [ "$got" = "$want" ]; then ok=$((ok + 1)); else say "digit $n: $r label $got, host cnn $want"; fi
  done
  latency "$cuda_url" cuda-digits-pipeline digits "$tmp/px-0.bin"
  if [ "$ok" = 50 ]; then pass "digits pipeline (CPU steps + GPU CNN): 50 of 50 labels equal the host CNN's"; else fail "digits pipeline: $ok of 50 labels equal the host CNN's"; fi
else
  say "SKIP: needs the cuda server, build/samples/digits-{pipeline,normalize-host,top1-host} and the cnn section's outputs"
fi

# ---------------------------------------------------------------- batching
# ABI 2.1 on a GPU: 64 concurrent digits through the batching CNN build;
# each response must be that digit's host score vector (same bar, 1e-4),
# and runs must hold more than one digit (Server-Timing batch;desc=N).
section "cnn-batch (ABI 2.1 batching): 64 concurrent digits, CUDA vs host"
if [ "$cuda_up" = 1 ] && [ -f build/samples/cnn-batch-cuda/plover.json ] && [ -f "$tmp/cnn-host-63.out" ] && have python3 && have curl; then
  bin/plover deploy build/samples/cnn-batch-cuda --server "$cuda_url" || fail "deploy cnn-batch-cuda"
  invoke "$cuda_url" cnn-batch "$tmp/cnn-in-0.bin" "$tmp/cnnb-warm.out" >/dev/null
  for i in $(seq 0 63); do
    curl -sS -m 60 -o "$tmp/cnnb-$i.out" -D "$tmp/cnnb-$i.hdr" -H 'Content-Type: application/octet-stream' \
      --data-binary "@$tmp/cnn-in-$i.bin" "$cuda_url/v1/functions/cnn-batch/invoke" &
  done
  wait_burst # a bare wait would wait for the servers too (it hung the first GPU run)
  res=$(python3 - "$tmp" <<'PY'
import re, struct, sys
d, biggest = 0.0, 0
for i in range(64):
    try:
        c = struct.unpack("<10f", open("%s/cnnb-%d.out" % (sys.argv[1], i), "rb").read())
        h = struct.unpack("<10f", open("%s/cnn-host-%d.out" % (sys.argv[1], i), "rb").read())
    except (OSError, struct.error):
        print("nan 0"); sys.exit(0)
    d = max(d, max(abs(a - b) for a, b in zip(c, h)))
    m = re.search(r"batch;desc=(\d+)", open("%s/cnnb-%d.hdr" % (sys.argv[1], i)).read())
    biggest = max(biggest, int(m.group(1)) if m else 0)
print("%.3g %d" % (d, biggest))
PY
)
  say "cnn-batch: largest score difference from the host over 64 concurrent digits: ${res% *}; largest run ${res#* } digits"
  if python3 -c "import sys; sys.exit(0 if float('${res% *}') <= 1e-4 else 1)"; then pass "cnn-batch scores within 1e-4"; else fail "cnn-batch scores differ by ${res% *}"; fi
  if [ "${res#* }" -ge 2 ]; then pass "cnn-batch: runs held more than one digit"; else fail "cnn-batch: no run held two digits"; fi
else
  say "SKIP: needs build/samples/cnn-batch-cuda/, the cnn section's host outputs, python3 and curl"
fi

# ---------------------------------------------------------------- softmax
# ABI 2 on a GPU: shared memory, barriers and a lowered out.len, one source
# for both targets; the expected response comes from the Go reference.
section "softmax (ABI 2: __shared__, __syncthreads, out.len): CUDA vs host vs reference"
if [ "$cuda_up" = 1 ] && [ "$host_up" = 1 ] && [ -f build/samples/softmax-cuda/plover.json ] &&
  [ -f build/samples/softmax-host/plover.json ] && [ -f build/samples/softmax-input.bin ] && have python3; then
  bin/plover deploy build/samples/softmax-cuda --server "$cuda_url" || fail "deploy softmax-cuda"
  bin/plover deploy build/samples/softmax-host --server "$host_url" || fail "deploy softmax-host"
  sin=build/samples/softmax-input.bin
  for i in 1 2 3 4; do # direct, captured, replayed, replayed: out.len must hold on replay
    rc=$(invoke "$cuda_url" softmax "$sin" "$tmp/softmax-cuda-$i.out")
    [ "${rc%% *}" = 200 ] || fail "softmax on CUDA, request $i: $rc"
  done
  rh=$(invoke "$host_url" softmax "$sin" "$tmp/softmax-host.out")
  [ "${rh%% *}" = 200 ] || fail "softmax on host: $rh"
  sdiff=$(python3 - "$tmp" build/samples/softmax-expected.bin <<'PY'
import struct, sys
exp = open(sys.argv[2], "rb").read()
worst = 0.0
for name in ["softmax-cuda-%d.out" % i for i in range(1, 5)] + ["softmax-host.out"]:
    got = open(sys.argv[1] + "/" + name, "rb").read()
    if len(got) != len(exp):
        print("length %s %d != %d" % (name, len(got), len(exp))); sys.exit(0)
    n = len(exp) // 4
    a, b = struct.unpack("<%df" % n, got), struct.unpack("<%df" % n, exp)
    worst = max(worst, max(abs(x - y) for x, y in zip(a, b)))
print("%.3g" % worst)
PY
)
  say "softmax: largest difference from the reference (4 CUDA requests, 1 host): $sdiff"
  if python3 -c "import sys; sys.exit(0 if float('$sdiff') <= 1e-5 else 1)" 2>/dev/null; then
    pass "softmax: CUDA (direct, captured, replayed) and host match the reference within 1e-5, lengths equal"
  else
    fail "softmax: $sdiff"
  fi
else
  say "SKIP: needs build/samples/softmax-{cuda,host}/ and python3"
fi

# ---------------------------------------------------------------- latency table
section "latency (ms; server = Server-Timing total, client = whole HTTP request)"
printf '%-12s %-5s %4s %9s %9s %9s %9s %9s\n' function start n server kernels copyin copyout client
awk '{ print $1, $3 }' "$rows" | sort -u | while read -r label start; do
  [ "$start" = - ] && continue
  sel() { awk -v l="$label" -v s="$start" -v f="$1" '$1 == l && $3 == s && $2 == 200 { print $f }' "$rows"; }
  count=$(sel 4 | wc -l)
  [ "$count" -eq 0 ] && continue
  printf '%-12s %-5s %4d %9.3f %9.3f %9.3f %9.3f %9.3f\n' "$label" "$start" "$count" \
    "$(sel 4 | median)" "$(sel 5 | median)" "$(sel 6 | median)" "$(sel 7 | median)" "$(sel 8 | median)"
done
bad=$(awk '$2 != 200' "$rows" | wc -l)
[ "$bad" -eq 0 ] || fail "$bad timed requests did not answer 200: $(awk '$2 != 200 { print $1, $2 }' "$rows" | sort | uniq -c | tr '\n' ';')"
if grep -q '^cuda-vecadd 200 cold' "$rows"; then
  pass "first CUDA request reported cold"
elif [ "$cuda_up" = 1 ]; then
  fail "no cold CUDA request recorded"
fi

# ---------------------------------------------------------------- faults
# With --isolation process (the default) a sticky fault ends only the worker
# of the function that caused it: that request fails naming the CUDA error,
# the next one runs on a fresh worker, the GPU stays healthy. With
# --isolation none it poisons the server's one context (a separate server,
# started last).
fault_bundle() {
  fb=$tmp/fault-bundle
  mkdir -p "$fb"
  cp build/cudatest/testkernels.so "$fb/"
  cat >"$fb/plover.json" <<'JSON'
{
  "name": "fault",
  "abi": 2,
  "target": "cuda",
  "library": "testkernels.so",
  "max_input_bytes": 16,
  "tmp_bytes": 16,
  "out_bytes": 16,
  "zero_tmp": false,
  "chain": [{"kernel": "pl_fault", "grid": 1, "block": 1}]
}
JSON
  head -c 16 /dev/zero >"$tmp/zero16"
}

fault_check() { # fault_check URL PORT PID MODE
  local url=$1 port=$2 pid=$3 mode=$4 r code
  bin/plover deploy "$fb" --server "$url" >/dev/null || fail "$mode: deploy the fault bundle"
  bin/plover deploy build/samples/vecadd-cuda --server "$url" >/dev/null || fail "$mode: deploy vecadd"
  r=$(invoke "$url" fault "$tmp/zero16" "$tmp/fault.out")
  say "$mode: fault: $r: $(body "$tmp/fault.out")"
  if [ "${r%% *}" = 500 ]; then pass "$mode: faulting request: 500"; else fail "$mode: faulting request answered ${r%% *}, want 500"; fi
  if grep -q CUDA_ERROR_ILLEGAL_ADDRESS "$tmp/fault.out"; then
    pass "$mode: the 500 names CUDA_ERROR_ILLEGAL_ADDRESS"
  else
    fail "$mode: the 500 does not name CUDA_ERROR_ILLEGAL_ADDRESS"
  fi
  r=$(invoke "$url" vecadd "$vin" "$tmp/after.out")
  say "$mode: vecadd after the fault: $r: $(body "$tmp/after.out")"
  code=$(http_get "$port" /healthz "$tmp/healthz")
  say "$mode: /healthz: $code $(cat "$tmp/healthz")"
  if [ "$mode" = process ]; then
    if [ "${r%% *}" = 200 ]; then pass "process: another function after the fault: 200"; else fail "process: another function answered ${r%% *} after the fault, want 200"; fi
    if [ "$code" = 200 ]; then pass "process: /healthz 200 (the GPU stays healthy)"; else fail "process: /healthz answered $code, want 200"; fi
    r=$(invoke "$url" fault "$tmp/zero16" "$tmp/fault2.out")
    if [ "${r%% *}" = 500 ] && grep -q CUDA_ERROR_ILLEGAL_ADDRESS "$tmp/fault2.out"; then
      pass "process: the faulting function faults again on a fresh worker (500), not 503"
    else
      fail "process: second fault answered ${r%% *}: $(body "$tmp/fault2.out")"
    fi
  else
    if [ "${r%% *}" = 503 ]; then pass "none: next request: 503"; else fail "none: next request answered ${r%% *}, want 503"; fi
    if [ "$code" = 503 ] && grep -q unhealthy "$tmp/healthz"; then pass "none: /healthz: 503 unhealthy"; else
      fail "none: /healthz answered $code, want 503 unhealthy"
    fi
  fi
  if kill -0 "$pid" 2>/dev/null; then pass "$mode: the CUDA server survived the fault"; else fail "$mode: the CUDA server died"; fi
}

section "faulting kernel, --isolation process"
if [ "$cuda_up" = 1 ]; then
  fault_bundle
  fault_check "$cuda_url" "$cuda_port" "$cuda_pid" process
else
  say "SKIP: no CUDA server"
fi

section "faulting kernel, --isolation none (poisons that server, so it runs last)"
none_port=$((cuda_port + 2))
if [ "$cuda_up" = 1 ] && start_server cuda "$none_port" none; then
  fault_check "http://127.0.0.1:$none_port" "$none_port" "$server_pid" none
  save "$tmp/server-cuda-none.log" server-cuda-none.log
else
  say "SKIP: no CUDA server"
fi

# ---------------------------------------------------------------- isolation cost
section "isolation cost: --isolation none vs process, CNN (scripts/isolation-bench.sh cuda)"
if [ "$cuda_up" = 1 ] && [ -d build/samples/cnn-cuda ] && command -v python3 >/dev/null; then
  bash scripts/isolation-bench.sh cuda "${ISO_SECONDS:-5}" "${ISO_ROUNDS:-3}" | tee "$tmp/isolation.md" || fail "isolation bench"
  save "$tmp/isolation.md" isolation.md
else
  say "SKIP: needs the CUDA server, build/samples/cnn-cuda and python3"
fi

# ---------------------------------------------------------------- data path
# vecadd 4 MB against an echo floor on CUDA: the body lands in the worker's
# registered slot, the DMA runs straight from it, the response is written
# from it (issue "The data path": vecadd hot server time <= 0.35 ms).
section "data path: vecadd 4 MB against an echo floor (plover-bench-suite --datapath)"
if ! skip datapath && [ -x bin/plover-bench-suite ] && [ -d build/samples/vecadd-cuda ] && [ -f build/samples/vecadd-input.bin ]; then
  if bin/plover-bench-suite --plover bin/plover --device cuda --datapath --dry-run >"$tmp/datapath.md" 2>&1; then
    pass "data-path benchmark on CUDA"
  else
    fail "data-path benchmark on CUDA (see datapath.md)"
  fi
  grep -E '^\||Targets' "$tmp/datapath.md" || true
  save "$tmp/datapath.md" datapath.md
else
  say "SKIP: needs bin/plover-bench-suite, build/samples/vecadd-cuda and vecadd-input.bin (or SKIP has datapath)"
fi

# ---------------------------------------------------------------- sharing
section "sharing a device: the CNN beside floods, shares 3:1, priorities (plover-bench-suite --fair)"
if [ -x bin/plover-bench-suite ] && [ -d build/samples/cnn-cuda ] && [ -d build/samples/spin-cuda ] && [ -d build/samples/vecadd-cuda ]; then
  if bin/plover-bench-suite --plover bin/plover --device cuda --fair --fair-time "${FAIR_TIME:-5s}" --dry-run >"$tmp/fair.md" 2>&1; then
    pass "fairness benchmark on CUDA"
  else
    fail "fairness benchmark on CUDA (see fair.md)"
  fi
  grep -E '^\|' "$tmp/fair.md" || true
  save "$tmp/fair.md" fair.md
else
  say "SKIP: needs bin/plover-bench-suite and build/samples/{cnn,spin,vecadd}-cuda"
fi

# ---------------------------------------------------------------- memcheck
# The device suite under compute-sanitizer: out-of-bounds and misaligned
# device accesses and leaked device memory. API errors are not reported:
# the suite provokes some on purpose (bad launches) and checks them itself.
section "compute-sanitizer memcheck: the device suite"
if ! skip sanitizer; then
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
  if [ -n "$cs" ]; then
    (cd device && PLOVER_TEST_CUDA_BUNDLE_DIR="$root/build/cudatest" timeout 300 "$cs" --tool memcheck \
      --leak-check full --report-api-errors no --error-exitcode 9 \
      "$root/bin/device.test" -test.run '^TestGPUSuite$' -test.count=1 -test.v) >"$tmp/memcheck.txt" 2>&1
    rc=$?
    save "$tmp/memcheck.txt" memcheck.txt
    grep -E 'ERROR SUMMARY|LEAK SUMMARY|^--- (PASS|FAIL|SKIP)' "$tmp/memcheck.txt" | head -n 5
    if [ "$rc" -eq 0 ] && ! grep -q -- '--- SKIP: TestGPUSuite' "$tmp/memcheck.txt"; then pass "memcheck: the device suite ran clean"; else
      fail "memcheck exited $rc (memcheck.txt in gpu-check-logs.tgz)"
      tail -n 30 "$tmp/memcheck.txt"
    fi
  else
    say "SKIP: compute-sanitizer not found"
  fi
fi

# ---------------------------------------------------------------- eager
# Module loading is lazy by default since CUDA 12: kernels load at their
# first launch, inside a capture too. Eager loading must work the same.
section "CUDA_MODULE_LOADING=EAGER: the device suite again"
if ! skip eager; then
  (cd device && CUDA_MODULE_LOADING=EAGER PLOVER_TEST_CUDA_BUNDLE_DIR="$root/build/cudatest" \
    "$root/bin/device.test" -test.run '^(TestGPUSuite|TestGPUFault)$' -test.count=1 -test.v) >"$tmp/eager.txt" 2>&1
  rc=$?
  save "$tmp/eager.txt" eager.txt
  grep -E '^--- (PASS|FAIL|SKIP)' "$tmp/eager.txt"
  if [ "$rc" -eq 0 ] && ! grep -q -- '--- SKIP: TestGPUSuite' "$tmp/eager.txt"; then pass "the device suite with eager module loading"; else
    fail "the device suite with eager module loading (eager.txt)"
    tail -n 30 "$tmp/eager.txt"
  fi
fi

# ---------------------------------------------------------------- batching
# The batched CNN against the unbatched one on one CUDA server, and against
# the same batched chain called in process: throughput and the batch size
# where it stops growing.
section "batching on CUDA: the CNN with and without it (plover-bench-suite --batch)"
if skip batch; then
  :
elif [ -x bin/plover-bench-suite ] && [ -d build/samples/cnn-cuda ] && [ -d build/samples/cnn-batch-cuda ]; then
  if bin/plover-bench-suite --plover bin/plover --device cuda --batch --batch-time "${BATCH_TIME:-3s}" \
    --batch-sweep "${BATCH_SWEEP:-0.5,1,2}" --dry-run >"$tmp/batch.md" 2>&1; then
    pass "batching benchmark on CUDA"
  else
    fail "batching benchmark on CUDA (batch.md)"
    tail -n 20 "$tmp/batch.md"
  fi
  grep -E '^\||over the|over unbatched' "$tmp/batch.md" || true
  save "$tmp/batch.md" batch.md
else
  say "SKIP: needs bin/plover-bench-suite and build/samples/cnn{,-batch}-cuda"
fi

save "$tmp/server-cuda.log" server-cuda.log
save "$tmp/server-host.log" server-host.log

section "summary"
if [ "$failures" -eq 0 ]; then say "all checks passed"; else say "$failures check(s) failed"; fi
status=$((failures > 0 ? 1 : 0))
if [ -n "${tee_pid:-}" ]; then
  exec >&- 2>&-
  wait "$tee_pid" 2>/dev/null
fi
exit "$status"
