#!/usr/bin/env bash
# Creates (or refreshes) the virtual environment with one line of output; the full pip log goes to
# $VENV/setup.log and is printed only when a step fails.
# Usage: scripts/setup-venv.sh PYTHON VENV
set -euo pipefail
python="$1"
venv="$2"
first=""
[[ -x "$venv/bin/python" ]] || first=" (first run, about a minute)"
mkdir -p "$venv"
log="$venv/setup.log"
: >"$log"
echo "setting up $venv$first..."
run() {
  if ! "$@" >>"$log" 2>&1; then
    echo "setup failed running: $*" >&2
    echo "---- $log ----" >&2
    cat "$log" >&2
    exit 1
  fi
}
[[ -x "$venv/bin/python" ]] || run "$python" -m venv "$venv"
run "$venv/bin/python" -m pip install --disable-pip-version-check --upgrade pip setuptools wheel
run "$venv/bin/python" -m pip install --disable-pip-version-check -r requirements-dev.txt
# compat editable mode puts each src/ folder on the path, so a package added later (a new
# agentsessions.* subpackage) is importable without reinstalling.
run "$venv/bin/python" -m pip install --disable-pip-version-check --config-settings editable_mode=compat \
  -e ./sdk -e ./harnesses -e ./host
echo "setup done (log: $log)"
