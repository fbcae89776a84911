#!/usr/bin/env bash
# Puts a wheel of everything the image installs into deploy/wheels/, so the Dockerfile can build with
# no package index (`--build-arg PIP_INSTALL_ARGS=--no-index`, as .ci/run does).
# Usage: scripts/container-wheels.sh [PYTHON]   (PYTHON: the interpreter of the image's Python version)
set -euo pipefail
python="${1:-.venv/bin/python}"
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/deploy/wheels"
mkdir -p "$out"
log="$out/pip.log"
wheel() {
  if ! "$python" -m pip wheel --disable-pip-version-check -w "$out" "$@" >>"$log" 2>&1; then
    cat "$log" >&2
    exit 1
  fi
}
: >"$log"
# The build backend of the three local packages, then the packages and everything they need.
wheel "setuptools>=77" wheel
wheel "$root/sdk" "$root/harnesses" "$root/host"
# The local packages are built again inside the image from the copied sources.
rm -f "$out"/agentsessions_*.whl
echo "wheels in $out: $(find "$out" -name '*.whl' | wc -l)"
