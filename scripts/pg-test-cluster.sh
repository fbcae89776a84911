#!/usr/bin/env bash
# A throwaway PostgreSQL 15 cluster for tests and benchmarks, on 127.0.0.1 only.
#
#   scripts/pg-test-cluster.sh start DIR [--durable]   init + start in DIR; prints the URL on stdout
#   scripts/pg-test-cluster.sh stop DIR                stop it (DIR is left for the caller to delete)
#   scripts/pg-test-cluster.sh url DIR                 print the URL of a running cluster
#   scripts/pg-test-cluster.sh bindir                  print the server binaries' directory (exit 1: none)
#
# Without --durable the cluster runs with fsync off (tests only need crash-free semantics,
# not durability); benchmarks pass --durable so commit costs are real. When run as root the
# server runs as an unprivileged account (PG_TEST_USER, else "postgres", else "nobody"),
# because postgres refuses to run as root.
set -euo pipefail

die() { echo "pg-test-cluster: $*" >&2; exit 1; }

find_bindir() {
  if [[ -n "${PG_BINDIR:-}" ]]; then
    [[ -x "$PG_BINDIR/initdb" ]] || die "PG_BINDIR=$PG_BINDIR has no initdb"
    echo "$PG_BINDIR"; return
  fi
  if command -v pg_config >/dev/null 2>&1; then
    local d; d="$(pg_config --bindir)"
    if [[ -x "$d/initdb" ]]; then echo "$d"; return; fi
  fi
  local v
  for v in 17 16 15 14; do
    if [[ -x "/usr/lib/postgresql/$v/bin/initdb" ]]; then echo "/usr/lib/postgresql/$v/bin"; return; fi
  done
  if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return; fi
  die "no PostgreSQL server binaries found (set PG_BINDIR, or install postgresql-15)"
}

run_user() {
  if [[ "$(id -u)" != 0 ]]; then return; fi
  if [[ -n "${PG_TEST_USER:-}" ]]; then echo "$PG_TEST_USER"; return; fi
  if id -u postgres >/dev/null 2>&1; then echo postgres; return; fi
  echo nobody
}

# as_user CMD...: run CMD as the unprivileged account when we are root.
as_user() {
  local u; u="$(run_user)"
  if [[ -z "$u" ]]; then "$@"; return; fi
  if command -v runuser >/dev/null 2>&1; then runuser -u "$u" -- "$@"; else su -s /bin/sh "$u" -c "$(printf '%q ' "$@")"; fi
}

free_port() {
  # The kernel picks an unused loopback port; a tiny race with other binders is acceptable here.
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

cmd_start() {
  local dir="$1" durable="${2:-}"
  [[ -n "$dir" ]] || die "usage: start DIR [--durable]"
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  local bindir; bindir="$(find_bindir)"
  local u; u="$(run_user)"
  if [[ -n "$u" ]]; then
    # The account must be able to reach DIR; /tmp/... made by mktemp is 0700 root.
    chmod o+x "$dir"
    mkdir -p "$dir/data" "$dir/sock"
    chown "$u" "$dir/data" "$dir/sock"
  else
    mkdir -p "$dir/data" "$dir/sock"
  fi
  as_user "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust --encoding=UTF8 --locale=C \
    --no-sync >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
  local port; port="$(free_port)"
  local fsync=off
  [[ "$durable" == "--durable" ]] && fsync=on
  {
    echo "listen_addresses = '127.0.0.1'"
    echo "port = $port"
    echo "unix_socket_directories = '$dir/sock'"
    echo "fsync = $fsync"
    echo "full_page_writes = $fsync"
    echo "max_connections = 200"
    echo "shared_buffers = 128MB"
    echo "log_min_messages = warning"
  } >>"$dir/data/postgresql.conf"
  echo "$port" >"$dir/port"
  as_user "$bindir/pg_ctl" -D "$dir/data" -l "$dir/data/server.log" -w -t 60 start >/dev/null \
    || { cat "$dir/data/server.log" >&2 || true; die "server did not start"; }
  cmd_url "$dir"
}

cmd_stop() {
  local dir="$1"
  [[ -n "$dir" && -d "$dir/data" ]] || die "no cluster in '$dir'"
  local bindir; bindir="$(find_bindir)"
  as_user "$bindir/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null 2>&1 || true
}

cmd_url() {
  local dir="$1"
  [[ -f "$dir/port" ]] || die "no cluster in '$dir'"
  echo "postgresql://postgres@127.0.0.1:$(cat "$dir/port")/postgres"
}

case "${1:-}" in
  start) shift; cmd_start "${1:-}" "${2:-}" ;;
  stop) shift; cmd_stop "${1:-}" ;;
  url) shift; cmd_url "${1:-}" ;;
  bindir) find_bindir ;;
  *) die "usage: $0 start DIR [--durable] | stop DIR | url DIR | bindir" ;;
esac
