#!/usr/bin/env bash
# Installs a pinned Helm 3 for the chart test (deploy/helm/charttest), built
# from source with `go install` (no download site, only the Go module proxy),
# into a cache directory: $PLOVER_HELM_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/plover,
# as helm-<version>/helm. The first build takes 2.5 to 11 minutes on 2 cores
# (idle to loaded); later runs find
# it and exit at once. Prints the binary's path. Idempotent.
#
# The chart test finds the binary there by itself (or through $HELM or PATH).
set -euo pipefail

HELM_VERSION=v3.22.0
# Kubernetes version Helm assumes for .Capabilities and for lint's deprecation
# checks when no cluster is asked: the k8s.io/client-go minor this Helm is built
# against (v0.37 -> 1.37), as Helm's own Makefile sets it. A plain go install
# would leave its default, 1.20.
K8S_MAJOR=1
K8S_MINOR=37

base="${PLOVER_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/plover}"
dir="$base/helm-$HELM_VERSION"
bin="$dir/helm"

if [ -x "$bin" ] && "$bin" version --short 2>/dev/null | grep -q "^$HELM_VERSION"; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { echo "install-helm: Go is required" >&2; exit 1; }
mkdir -p "$dir"
. "$(dirname "$0")/lib/go-install.sh"
cache_lock install-helm "$dir"
if [ -x "$bin" ] && "$bin" version --short 2>/dev/null | grep -q "^$HELM_VERSION"; then
  echo "$bin"
  exit 0
fi
tmp="$(mktemp -d "$dir/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

pkg=helm.sh/helm/v3
ldflags="-s -w -X $pkg/internal/version.version=$HELM_VERSION"
ldflags+=" -X $pkg/pkg/chartutil.k8sVersionMajor=$K8S_MAJOR -X $pkg/pkg/chartutil.k8sVersionMinor=$K8S_MINOR"
ldflags+=" -X $pkg/pkg/lint/rules.k8sVersionMajor=$K8S_MAJOR -X $pkg/pkg/lint/rules.k8sVersionMinor=$K8S_MINOR"

echo "install-helm: building helm $HELM_VERSION with go install (minutes, once)" >&2
# Build into a temporary GOBIN and rename, so an interrupted build never
# leaves a half-written helm behind; each try bounded, 3 tries
# (scripts/lib/go-install.sh).
go_install_retry install-helm "$tmp" -trimpath -ldflags "$ldflags" "$pkg/cmd/helm@$HELM_VERSION"
mv -f "$tmp/helm" "$bin"
"$bin" version --short >&2
echo "$bin"
