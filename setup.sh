#!/usr/bin/env bash
# One-shot setup on a fresh Debian machine: system packages, a virtualenv in .venv, and this package.
# Safe to re-run; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")"

# System packages: Chromium for the browser tests, real Fashion-MNIST for training, local fonts for the app.
APT_PACKAGES=(chromium dataset-fashion-mnist fonts-dejavu-core)
missing=()
for p in "${APT_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
.venv/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
echo "setup done: use .venv/bin/python"
