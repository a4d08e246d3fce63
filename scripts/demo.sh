#!/usr/bin/env bash
# Runs the gpuslice demo on a fresh machine: installs what it needs when
# missing (the PostgreSQL server programs for the embedded database, with
# apt when run as root; otherwise it says what to install), builds a release
# binary and starts `gpuslice demo` (embedded PostgreSQL, simulated GPUs,
# demo accounts) on http://127.0.0.1:8080/ unless GPUSLICE_BIND says
# otherwise. Extra arguments go to `gpuslice demo`.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "error: Rust (cargo) is needed: install it with rustup (https://rustup.rs)" >&2
  exit 1
fi
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing postgresql (server programs for the embedded database) ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    echo "installing postgresql with sudo (server programs for the embedded database) ..."
    sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  else
    echo "error: the demo needs the PostgreSQL server programs (Debian/Ubuntu: sudo apt-get install postgresql; Fedora: sudo dnf install postgresql-server)" >&2
    exit 1
  fi
fi
exec cargo run --release --locked -- demo "$@"
