#!/usr/bin/env bash
# Installs nginx (Debian's package) for the function-affinity test
# (cli/plover/affinity_test.go) and scripts/nginx-example.sh, which run it as
# a child process with their own configuration. Idempotent.
#
# The package's postinst would start the system nginx on port 80 where an init
# system runs; that is not wanted here, so a policy-rc.d that refuses service
# starts is put in place for the install (unless one exists) and removed after.
set -euo pipefail
if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then exit 0; fi
sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
policy=/usr/sbin/policy-rc.d
ours=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  $sudo chmod 755 "$policy"
  ours=1
fi
cleanup() { if [ -n "$ours" ]; then $sudo rm -f "$policy"; fi; }
trap cleanup EXIT
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends nginx >/dev/null
/usr/sbin/nginx -v
