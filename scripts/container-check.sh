#!/usr/bin/env bash
# Builds the container image with no network and proves it serves: the image's own HEALTHCHECK
# (`agentsessions health` inside the running container) answers 0, a turn runs against it from
# outside, its journal verifies on the volume, and SIGTERM drains it to exit 0.
#
# Uses podman as MACHINE-NOTES describes (runc, cgroupfs, fixed ulimits), a base image made locally
# from Debian's packages (mmdebstrap), and wheels built on the machine first (container-wheels.sh).
# As root it installs podman, runc and mmdebstrap when they are missing. Exits 0 after the checks,
# 0 with "skipped:" when no container builder can run here, non-zero when a check fails.
# Usage: scripts/container-check.sh [PYTHON]   (PYTHON: an interpreter with the repo installed)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${1:-$root/.venv/bin/python}"
bin="$(dirname "$python")"
base="localhost/debian-python:bookworm"
image="localhost/agentsessions:check"
name="agentsessions-check-$$"
podman=(podman --runtime runc --cgroup-manager=cgroupfs)
limits=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
work="$(mktemp -d /tmp/agentsessions-container.XXXXXX)"
# Once, on a machine of this kind, /dev/null was found replaced by a regular file owned by uid 10001
# (the image's user) after a run of this script; it could not be reproduced. So the script checks it
# after each podman phase and, as root, puts the device back, saying so.
devnull_intact() { [[ -c /dev/null ]]; }
guard_devnull() {
  if devnull_intact; then return 0; fi
  echo "WARNING: /dev/null is no longer a character device after: $1 ($(stat -c '%F, uid %u' /dev/null 2>&1))" >&2
  if [[ $(id -u) -eq 0 ]]; then
    rm -f /dev/null && mknod -m 666 /dev/null c 1 3 && echo "WARNING: /dev/null restored (mknod c 1 3)" >&2
  fi
}
cleanup() {
  "${podman[@]}" rm -f "$name" >/dev/null 2>&1 || true
  guard_devnull "removing the container"
  rm -rf "$work"
}
trap cleanup EXIT

skip() { echo "skipped: $*"; exit 0; }

if ! command -v podman >/dev/null || ! command -v mmdebstrap >/dev/null || ! command -v runc >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "installing podman, runc and mmdebstrap (Debian packages)"
    { apt-get update && apt-get install -y podman runc mmdebstrap; } >"$work/apt.log" 2>&1 \
      || skip "podman could not be installed ($(tail -n 1 "$work/apt.log"))"
  else
    skip "podman, runc or mmdebstrap missing and not root to install them"
  fi
fi
"${podman[@]}" info >"$work/info.log" 2>&1 || skip "podman cannot run here ($(tail -n 1 "$work/info.log"))"

if ! "${podman[@]}" image exists "$base"; then
  echo "base image $base from Debian's packages (mmdebstrap)"
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$work/base.tar"
  "${podman[@]}" import "$work/base.tar" "$base" >/dev/null
fi

echo "wheels for an offline build"
"$root/scripts/container-wheels.sh" "$python"

echo "building $image (--network=none)"
if ! "${podman[@]}" build --network=none "${limits[@]}" --format docker --quiet \
    --build-arg "BASE=$base" --build-arg PIP_INSTALL_ARGS=--no-index -t "$image" "$root" >"$work/build.log" 2>&1; then
  cat "$work/build.log" >&2
  echo "FAILED: the image does not build" >&2
  exit 1
fi

port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
address="127.0.0.1:$port"
guard_devnull "the build"
echo "running it on $address"
# (podman's complaints that it has no systemd to schedule health checks with go to a log.)
"${podman[@]}" run -d "${limits[@]}" --network=host --name "$name" \
  -e "AGENTSESSIONS_LISTEN=$address" -e "AGENTSESSIONS_SERVER=$address" "$image" >/dev/null 2>>"$work/podman.log"

# The image's HEALTHCHECK, run by podman inside the container: `agentsessions health --quiet`.
healthy=""
for _ in $(seq 1 60); do
  if "${podman[@]}" healthcheck run "$name" >/dev/null 2>&1; then healthy=yes; break; fi
  sleep 1
done
if [[ -z "$healthy" ]]; then
  "${podman[@]}" logs "$name" >&2 || true
  echo "FAILED: the container's HEALTHCHECK never answered 0" >&2
  exit 1
fi
echo "HEALTHCHECK (agentsessions health in the container): healthy"
"${podman[@]}" exec "$name" agentsessions health

out="$("$bin/agentsessions" exec --server "$address" "hello from the container check")"
[[ "$out" == *"echo:hello from the container check"* ]] || { echo "FAILED: exec answered: $out" >&2; exit 1; }
echo "a turn from outside: $(tail -n 1 <<<"$out")"
"${podman[@]}" exec "$name" agentsessions journal verify --journal /var/lib/agentsessions/agentsessions.db
"${podman[@]}" exec "$name" id -u | grep -qx 10001 || { echo "FAILED: not running as uid 10001" >&2; exit 1; }

"${podman[@]}" stop -t 30 "$name" >/dev/null 2>>"$work/podman.log"
code="$("${podman[@]}" inspect --format '{{.State.ExitCode}}' "$name")"
[[ "$code" == 0 ]] || { echo "FAILED: the container exited $code after SIGTERM" >&2; exit 1; }
guard_devnull "running, checking and stopping the container"
echo "drained on SIGTERM, exit 0"
echo "ok: image $image builds offline, serves, checks healthy and drains"
