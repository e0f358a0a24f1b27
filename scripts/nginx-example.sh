#!/usr/bin/env bash
# Function affinity by hand: a local MinIO, three `plover serve` nodes sharing
# its bucket, and nginx in front with deploy/nginx/plover.conf (consistent
# hashing on the function name). Deploys six copies of the vecadd sample,
# invokes each through nginx, shows which node serves which function, kills
# the busiest node and shows its functions moving; then prints commands to
# try and waits for Ctrl-C. Everything runs on loopback, from a temp dir
# removed on exit.
#
#   bash scripts/nginx-example.sh            # NGINX_PORT=8080 MINIO_PORT=9000 by default
#   bash scripts/nginx-example.sh --no-wait  # run the steps, then clean up and exit
#
# Needs Go, g++, curl (7.75+, for --aws-sigv4) and nginx (bash scripts/install-nginx.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

NGINX_PORT=${NGINX_PORT:-8080}
MINIO_PORT=${MINIO_PORT:-9000}
wait_at_end=1
[ "${1:-}" = "--no-wait" ] && wait_at_end=""

die() { echo "nginx-example: $*" >&2; exit 1; }
command -v curl >/dev/null || die "curl is required"
curl --help all 2>/dev/null | grep -q -- --aws-sigv4 || die "curl 7.75 or later is required (--aws-sigv4, to create the bucket)"
nginx=$(command -v nginx || true)
[ -n "$nginx" ] || { [ -x /usr/sbin/nginx ] && nginx=/usr/sbin/nginx; } || die "nginx not found: bash scripts/install-nginx.sh"
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port_free "$NGINX_PORT" || die "port $NGINX_PORT is taken: set NGINX_PORT"
port_free "$MINIO_PORT" || die "port $MINIO_PORT is taken: set MINIO_PORT"

echo "== building plover and the vecadd sample"
make -s bin/plover vecadd-host
plover=bin/plover
echo "== MinIO (built once into ~/.cache/plover: minutes the first time)"
minio=$(go run ./internal/minio/cmd/install-minio)

work=$(mktemp -d -t plover-nginx-XXXXXX)
pids=()
cleanup() {
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# MinIO with throwaway root credentials, which plover reads from the environment.
export AWS_ACCESS_KEY_ID=plover-example
AWS_SECRET_ACCESS_KEY=$(od -An -N20 -tx1 /dev/urandom | tr -d ' \n')
export AWS_SECRET_ACCESS_KEY
mkdir -p "$work/minio/data"
MINIO_ROOT_USER=$AWS_ACCESS_KEY_ID MINIO_ROOT_PASSWORD=$AWS_SECRET_ACCESS_KEY MINIO_BROWSER=off \
  MINIO_UPDATE=off MINIO_CALLHOME_ENABLE=off \
  "$minio" server "$work/minio/data" --address "127.0.0.1:$MINIO_PORT" \
  --console-address 127.0.0.1:0 --certs-dir "$work/minio/certs" >"$work/minio.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 200); do
  curl -fs -o /dev/null "http://127.0.0.1:$MINIO_PORT/minio/health/ready" && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/minio.log"; die "MinIO exited"; }
  sleep 0.1
done
curl -fsS --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
  -X PUT "http://127.0.0.1:$MINIO_PORT/plover" >/dev/null || die "could not create the bucket"
s3=(--store s3://plover/example --s3-endpoint "127.0.0.1:$MINIO_PORT" --s3-insecure)
echo "   MinIO at 127.0.0.1:$MINIO_PORT, bucket plover, store s3://plover/example"

# Three nodes on free loopback ports, sharing the bucket.
addrs=()
node_pids=()
for i in 1 2 3; do
  "$plover" serve --listen 127.0.0.1:0 --data "$work/node$i" --device host "${s3[@]}" --poll 500ms \
    >"$work/node$i.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  node_pids+=("$pid")
  addr=""
  for _ in $(seq 1 200); do
    addr=$(sed -n 's/.*addr=http:\/\/\([0-9.:]*\).*/\1/p' "$work/node$i.log" | head -n 1)
    [ -n "$addr" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/node$i.log"; die "node $i exited"; }
    sleep 0.1
  done
  [ -n "$addr" ] || { cat "$work/node$i.log"; die "node $i did not start"; }
  addrs+=("$addr")
  echo "   node$i: http://$addr (pid $pid, log $work/node$i.log)"
done
node_of() { # node_of ADDR -> node number
  local i
  for i in 0 1 2; do [ "${addrs[i]}" = "$1" ] && { echo $((i + 1)); return; }; done
  echo "?"
}

# nginx: the shipped file with the three server lines, listen and the access
# log path replaced, inside a minimal nginx.conf of its own (one foreground
# process, temp files and logs under $work).
mkdir -p "$work/nginx/tmp" "$work/nginx/logs"
awk -v addrs="${addrs[*]}" -v listen="127.0.0.1:$NGINX_PORT" -v logpath="$work/nginx/logs/access.log" '
  BEGIN { split(addrs, a, " ") }
  /^[ \t]*server[ \t]+[^ \t;{]+:[0-9]+/ { n++; sub(/server[ \t]+[^ \t;]+:[0-9]+/, "server " a[n]) }
  /^[ \t]*listen[ \t]/ { sub(/listen[ \t]+[^;]+;/, "listen " listen ";") }
  /^[ \t]*access_log[ \t]/ { sub(/access_log[ \t]+[^ \t]+/, "access_log " logpath) }
  { print }' deploy/nginx/plover.conf >"$work/nginx/plover.conf"
cat >"$work/nginx/nginx.conf" <<EOF
events { worker_connections 512; }
http {
    access_log off;
    client_body_temp_path $work/nginx/tmp/client_body;
    proxy_temp_path       $work/nginx/tmp/proxy;
    fastcgi_temp_path     $work/nginx/tmp/fastcgi;
    uwsgi_temp_path       $work/nginx/tmp/uwsgi;
    scgi_temp_path        $work/nginx/tmp/scgi;
    include $work/nginx/plover.conf;
}
EOF
"$nginx" -p "$work/nginx/" -c "$work/nginx/nginx.conf" -e stderr \
  -g "daemon off; master_process off; pid $work/nginx/nginx.pid; error_log $work/nginx/logs/error.log notice;" \
  >"$work/nginx/stderr.log" 2>&1 &
nginx_pid=$!
pids+=("$nginx_pid")
for _ in $(seq 1 100); do
  port_free "$NGINX_PORT" || break
  kill -0 "$nginx_pid" 2>/dev/null || { cat "$work/nginx/stderr.log" "$work/nginx/logs/error.log" 2>/dev/null; die "nginx exited"; }
  sleep 0.1
done
proxy="http://127.0.0.1:$NGINX_PORT"
echo "   nginx: $proxy (config $work/nginx/plover.conf)"

echo "== deploying vecadd-a ... vecadd-f straight to the bucket"
fns=(vecadd-a vecadd-b vecadd-c vecadd-d vecadd-e vecadd-f)
for fn in "${fns[@]}"; do
  cp -r build/samples/vecadd-host "$work/$fn"
  sed -i "s/\"name\": *\"vecadd\"/\"name\": \"$fn\"/" "$work/$fn/plover.json"
  "$plover" deploy "$work/$fn" "${s3[@]}" | sed 's/^/   /'
done

invoke() { # invoke FN -> "start=cold|warm|hot upstream=node"
  local h
  h=$(curl -fsS -o /dev/null -D - -X POST -H 'Content-Type: application/octet-stream' \
    --data-binary @build/samples/vecadd-input.bin "$proxy/v1/functions/$1/invoke") || return 1
  printf '%s' "$h" | sed -n 's/^[Xx]-[Pp]lover-[Ss]tart: *\([a-z]*\).*/\1/p'
}
placement() { # which live node has started each function, from the nodes' own counters
  local fn i info cold reqs where
  for fn in "${fns[@]}"; do
    where=""
    for i in 0 1 2; do
      kill -0 "${node_pids[i]}" 2>/dev/null || continue
      info=$(curl -fsS "http://${addrs[i]}/v1/functions/$fn")
      cold=$(printf '%s' "$info" | sed -n 's/.*"cold_starts":\([0-9]*\).*/\1/p')
      reqs=$(printf '%s' "$info" | sed -n 's/.*"requests":\([0-9]*\).*/\1/p')
      [ "${reqs:-0}" -gt 0 ] && where="$where node$((i + 1)) (cold starts $cold, requests $reqs)"
    done
    echo "   $fn:${where:- nowhere}"
  done
}

echo "== three invokes of each function through nginx"
for fn in "${fns[@]}"; do
  starts=()
  for _ in 1 2 3; do starts+=("$(invoke "$fn")"); done
  echo "   $fn: ${starts[*]}"
done
echo "== where each function ran (GET /v1/functions/NAME on every node)"
placement

# The node holding the most functions, by nginx's access log.
busiest=$(sed -n 's/.*fn=\(vecadd-[a-f]\) upstream=\([0-9.:]*\) .*/\1 \2/p' "$work/nginx/logs/access.log" |
  sort -u | awk '{print $2}' | sort | uniq -c | sort -rn | awk 'NR==1{print $2}')
victim=$(node_of "$busiest")
echo "== kill -9 node$victim ($busiest), which holds the most functions; invoking everything again"
kill -9 "${node_pids[victim - 1]}"
wait "${node_pids[victim - 1]}" 2>/dev/null || true
for fn in "${fns[@]}"; do
  starts=()
  for _ in 1 2 3; do starts+=("$(invoke "$fn" || echo FAILED)"); done
  echo "   $fn: ${starts[*]}"
done
echo "== where each function ran, on the live nodes (only node$victim's functions moved)"
placement
echo "   nginx retried $(grep -c "upstream=$busiest, " "$work/nginx/logs/access.log" || true) request(s) that first tried the dead node"

cat <<EOF

== try it (the setup stays up until Ctrl-C)
  export AWS_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY
  curl -s -X POST -H 'Content-Type: application/octet-stream' --data-binary @build/samples/vecadd-input.bin \\
       -o /dev/null -D - $proxy/v1/functions/vecadd-a/invoke | grep -i '^x-plover'
  tail -f $work/nginx/logs/access.log    # upstream= names the node(s) tried
  curl -s http://${addrs[0]}/v1/functions/vecadd-a     # one node's counters (cold_starts, requests)
  $plover deploy build/samples/vecadd-host ${s3[*]}    # deploy straight to the bucket
  kill -9 PID                            # nodes: ${node_pids[*]}; their functions move to the next node
EOF
if [ -n "$wait_at_end" ]; then
  echo "== Ctrl-C stops MinIO, the nodes and nginx and removes $work"
  while :; do
    sleep 3600 &
    pids+=($!)
    wait $! || true
  done
fi
