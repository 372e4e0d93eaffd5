#!/usr/bin/env bash
# Install what the lab app's browser test (tests/test_app_browser.py) needs from Debian: the
# chromium package. Playwright (a Python package in the `test` extra) drives this system browser;
# it never downloads a browser of its own. Idempotent: does nothing when chromium is already there.
# Run as root (CI is root); uses sudo otherwise when available.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    echo "install-browser: $(chromium --version 2>/dev/null | tail -n 1) already installed"
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium
echo "install-browser: $(chromium --version 2>/dev/null | tail -n 1) installed"
