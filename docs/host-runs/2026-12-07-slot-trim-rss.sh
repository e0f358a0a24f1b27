#!/bin/bash
# A burst of 4 MB requests (vecadd), then the server's RSS and Go heap
# figures right after it and past the pool slots' idle bound (30 s).
# Usage: run.sh PLOVER_BINARY PORT SAMPLES_DIR OUT_DIR
P=$1 PORT=$2 S=$3 OUT=$4
rm -rf "$OUT"; mkdir -p "$OUT"
$P serve --listen 127.0.0.1:$PORT --device host --data "$OUT/data" > "$OUT/serve.log" 2>&1 &
SP=$!
for i in $(seq 100); do curl -s 127.0.0.1:$PORT/healthz >/dev/null && break; sleep 0.2; done
$P deploy $S/vecadd-host --server http://127.0.0.1:$PORT >/dev/null
m() { curl -s 127.0.0.1:$PORT/metrics | grep -E '^go_memstats_(heap_inuse|sys)_bytes' | awk '{printf "%s=%.0fMB ", $1, $2/1048576}'; }
rss() { awk '/VmRSS|RssAnon|RssShmem|RssFile/{printf "%s%dMB ", $1, $2/1024}' /proc/$SP/status; printf "workers' RssShmem:%dMB slot maps:%d " $(( $(wshm) / 1024 )) $(grep -c "memfd:plover-slot" /proc/$SP/maps); }
# the server's descendants' (its workers') RssShmem, in kB
wshm() {
  local pids=$SP all="" n=0
  while [ -n "$pids" ]; do
    local next=""
    for p in $pids; do next="$next $(cat /proc/$p/task/*/children 2>/dev/null)"; done
    all="$all $next"; pids=$(echo $next)
  done
  for p in $all; do n=$(( n + $(awk '/RssShmem/{print $2}' /proc/$p/status 2>/dev/null || echo 0) )); done
  echo $n
}
echo "before: $(rss) $(m)"
$P bench vecadd --server http://127.0.0.1:$PORT --in $S/vecadd-input.bin --concurrency 40 --duration 8s 2>&1 | grep -E "requests|p50" | head -3
echo "t=0s: $(rss) $(m)"
for t in 15 30 45 60 120; do
  sleep $(( t <= 60 ? 15 : 60 ))
  echo "t=${t}s: $(rss) $(m)"
done
# the function still answers exactly after its slots went
curl -s -o "$OUT/out.bin" -H 'Content-Type: application/octet-stream' --data-binary @$S/vecadd-input.bin 127.0.0.1:$PORT/v1/functions/vecadd/invoke -w 'invoke: %{http_code}\n'
cmp "$OUT/out.bin" $S/vecadd-expected.bin && echo "output exact"
echo "after the invoke: $(rss)"
kill $SP; wait $SP
