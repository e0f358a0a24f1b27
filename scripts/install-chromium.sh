#!/usr/bin/env bash
# Installs Chromium (Debian's package) for the console's browser test
# (cli/plover/console_test.go), which drives it headless with chromedp.
# Idempotent.
set -euo pipefail
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then exit 0; fi
done
sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
chromium --version
