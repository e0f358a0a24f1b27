#!/usr/bin/env bash
# cold-sequence.sh — the anatomy of cold starts in turn: N copies of the CNN
# deployed and loaded once, a fresh server, then each invoked once from one
# keep-alive client. Prints the client latency percentiles and, per request
# from the server's "cold start" log lines, the load time and its program
# part (worker taken or started, library, constants): a worker from the
# standby pool costs well under a millisecond there, one started for the
# request a worker's start more. Also the CPU the server spent per
# request, and about what its workers did (/proc: the workers alive at
# the start and at the end; those that came or went between count in part).
# Usage: scripts/cold-sequence.sh [N] (default 200; after make build samples);
# SERVE_FLAGS adds serve flags (SERVE_FLAGS="--worker-scope tenant").
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200}
plover=${PLOVER:-bin/plover}

. scripts/lib/bench.sh
scratch
cnn_digit "$work/digit.bin"

# invoke_all ADDR [TIMES]: each function once, one keep-alive connection
invoke_all() {
  python3 - "$1" "$n" "$work/digit.bin" <<'PY'
import http.client, sys, time
h, p = sys.argv[1].split(":"); n = int(sys.argv[2]); body = open(sys.argv[3], "rb").read()
c = http.client.HTTPConnection(h, int(p))
for i in range(1, n + 1):
    t0 = time.perf_counter()
    c.request("POST", "/v1/functions/cnn-%04d/invoke" % i, body, {"Content-Type": "application/octet-stream"})
    r = c.getresponse(); r.read()
    assert r.status == 200, r.status
    print("%.3f" % ((time.perf_counter() - t0) * 1000))
PY
}

# SERVE_FLAGS split into words on purpose: several flags in one variable.
# shellcheck disable=SC2086
serve "$work/deploy.log" ${SERVE_FLAGS:-}
deploy_cnn_copies "$n"
invoke_all "${url#http://}" >/dev/null # every bundle in the node cache
unserve

# shellcheck disable=SC2086
serve "$work/measure.log" ${SERVE_FLAGS:-}
sleep 1 # the standby pool at rest (it starts its floor of workers within this)
c0=$(cpu_ticks "$spid")
invoke_all "${url#http://}" >"$work/client"
c1=$(cpu_ticks "$spid")
unserve
echo "$c0 $c1" | awk -v n="$n" -v hz="$(getconf CLK_TCK)" '{ printf "CPU per request ms (/proc, %d Hz ticks): server %.3f, its workers about %.3f\n", hz, ($3 - $1) * 1000 / hz / n, ($4 - $2) * 1000 / hz / n }'
sort -n "$work/client" | awk '{ a[NR] = $1 } END { printf "client ms: p50 %s  p90 %s  p99 %s  max %s\n", a[int(NR * 0.5)], a[int(NR * 0.9)], a[int(NR * 0.99)], a[NR] }'
{ grep 'msg="cold start"' "$work/measure.log" || true; } |
  sed -n 's/.*load_ms=\([0-9.]*\) fetch_ms=[0-9.]* program_ms=\([0-9.]*\) instance_ms=\([0-9.]*\) wait_ms=\([0-9.]*\).*/\1 \2 \3 \4/p' | tee "$work/parts" |
  awk '{ n++; if ($2 < 2) { fast++; f += $2 } else { slow++; s += $2 } }
       END { printf "program part: %d of %d under 2 ms (mean %.2f ms: a standby worker), %d over (mean %.2f ms: a worker started for the request)\n", fast, n, fast ? f / fast : 0, slow, slow ? s / slow : 0 }'
sort -n -k2 "$work/parts" | awk '{ p[NR] = $2 } END { printf "program_ms p50 %s p90 %s max %s\n", p[int(NR * 0.5)], p[int(NR * 0.9)], p[NR] }'
sort -n -k3 "$work/parts" | awk '{ p[NR] = $3 } END { printf "instance_ms p50 %s p90 %s max %s\n", p[int(NR * 0.5)], p[int(NR * 0.9)], p[NR] }'
