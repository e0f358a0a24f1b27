#!/usr/bin/env bash
# Installs nvcc (Debian's nvidia-cuda-toolkit, CUDA 11.8, component non-free) so
# the CUDA sample bundles compile here. Nothing CUDA runs on a machine without a
# GPU; this only lets CI catch CUDA compile errors. Idempotent.
set -euo pipefail
if command -v nvcc >/dev/null 2>&1; then exit 0; fi
sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
list=/etc/apt/sources.list.d/plover-nonfree.sources
if [ ! -f "$list" ]; then
  $sudo tee "$list" >/dev/null <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: non-free non-free-firmware contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends nvidia-cuda-toolkit >/dev/null
nvcc --version | tail -n 2
