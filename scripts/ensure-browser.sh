#!/usr/bin/env bash
# Chromium and its WebDriver for the browser tests (tests/service/test_ui.py), from the
# system's packages (Debian: chromium, chromium-driver). Does nothing when both are present;
# installs them when missing and run as root (CI); otherwise says how and lets the tests skip.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "browser tests: chromium/chromedriver missing; install them (Debian: apt-get install chromium chromium-driver) or the browser tests skip" >&2
  exit 0
fi
echo "installing chromium and chromium-driver for the browser tests (apt-get, about 30 s)..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
echo "installed $(chromium --version 2>/dev/null || echo chromium)"
