#!/usr/bin/env bash
# Go and golang.org/x/mod for the independent tile reader (tests/service/test_log_tiles.py),
# from the system's packages (Debian: golang-go, golang-golang-x-mod-dev; built offline in
# GOPATH mode against /usr/share/gocode). Does nothing when both are present; installs them
# when missing and run as root (CI); otherwise says how and lets that test skip.
set -euo pipefail
if command -v go >/dev/null 2>&1 && [ -d /usr/share/gocode/src/golang.org/x/mod/sumdb/tlog ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "tile reader test: Go or golang.org/x/mod missing; install them (Debian: apt-get install golang-go golang-golang-x-mod-dev) or that test skips" >&2
  exit 0
fi
echo "installing golang-go and golang-golang-x-mod-dev for the independent tile reader (apt-get)..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends golang-go golang-golang-x-mod-dev >/dev/null
echo "installed $(go version 2>/dev/null || echo go)"
