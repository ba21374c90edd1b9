#!/usr/bin/env bash
# Headless Chromium from Debian's packages, for the dashboards browser test (marker `browser`).
# Idempotent: does nothing when /usr/bin/chromium is already there. Run as root from the repo root.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    echo "chromium already installed: $(chromium --version 2>/dev/null || echo unknown version)"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# fonts-liberation so text renders in screenshots; no recommends keeps it small.
apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
chromium --version
