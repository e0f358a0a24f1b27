#!/usr/bin/env bash
# Installs a pinned grpcurl, the gRPC client the gRPC tests check Plover
# against (cli/plover/grpc_test.go: a client no one here wrote), built with
# `go install` from the Go module proxy into a cache directory:
# $PLOVER_GRPCURL_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/plover, as
# grpcurl-<version>/grpcurl. 2 to 10.5 minutes once on 2 cores (idle to
# loaded); later runs find it and
# exit at once. Prints the binary's path. Idempotent.
set -euo pipefail

GRPCURL_VERSION=v1.9.4

base="${PLOVER_GRPCURL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/plover}"
dir="$base/grpcurl-$GRPCURL_VERSION"
bin="$dir/grpcurl"

if [ -x "$bin" ] && "$bin" -version 2>&1 | grep -q "$GRPCURL_VERSION"; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { echo "install-grpcurl: Go is required" >&2; exit 1; }
mkdir -p "$dir"
. "$(dirname "$0")/lib/go-install.sh"
cache_lock install-grpcurl "$dir"
if [ -x "$bin" ] && "$bin" -version 2>&1 | grep -q "$GRPCURL_VERSION"; then
  echo "$bin"
  exit 0
fi
tmp="$(mktemp -d "$dir/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "install-grpcurl: building grpcurl $GRPCURL_VERSION with go install (minutes, once)" >&2
# The version goes in as grpcurl's own Makefile sets it, so that the check
# above finds it. Each try is bounded, 3 tries (scripts/lib/go-install.sh:
# the module proxy once stalled for 16 minutes).
go_install_retry install-grpcurl "$tmp" -trimpath \
  -ldflags "-s -w -X main.version=$GRPCURL_VERSION" "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION"
mv -f "$tmp/grpcurl" "$bin"
"$bin" -version >&2
echo "$bin"
