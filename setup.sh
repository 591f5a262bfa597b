#!/usr/bin/env bash
# One-shot setup on a fresh Debian machine: system packages, a virtualenv in .venv, and this package.
#   bash setup.sh        everything: the app, the analysis scripts, training and the tests (Chromium, Playwright, pytest)
#   bash setup.sh --app  the app and the analysis scripts only (no browser, no test tools)
# Safe to re-run; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")"

mode=all
case "${1:-}" in
  "") ;;
  --app) mode=app ;;
  *) echo "usage: bash setup.sh [--app]" >&2; exit 2 ;;
esac

# System packages: real Fashion-MNIST for training and the scenes, local fonts for the app; Chromium for the browser tests.
APT_PACKAGES=(dataset-fashion-mnist fonts-dejavu-core)
[ "$mode" = app ] || APT_PACKAGES+=(chromium)
missing=()
for p in "${APT_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/pip install -q --disable-pip-version-check)
if [ "$mode" = app ]; then
  # the app extra's packages at the versions requirements.txt pins
  "${PIP[@]}" -c requirements.txt -e '.[app]'
else
  "${PIP[@]}" -r requirements.txt
  "${PIP[@]}" --no-deps --no-build-isolation -e .
fi
echo "setup done: use .venv/bin/python"
