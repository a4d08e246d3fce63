#!/usr/bin/env bash
# Refreshes the sqlx offline query data in .sqlx/ (commit the result).
# Starts a throw-away PostgreSQL with the project's migrations, then
# recompiles the crate with the macros online.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d /tmp/gpuslice-prepare.XXXXXX)
chmod 755 "$dir"  # the postgres account must reach it when we are root
trap 'rm -rf "$dir"' EXIT
cargo build --quiet --bin gpuslice
# `migrate` creates the cluster and stops it again when it is done.
GPUSLICE_DATA_DIR="$dir" DATABASE_URL= ./target/debug/gpuslice migrate >/dev/null
as_pg=()
[ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1 && as_pg=(runuser -u postgres --)
"${as_pg[@]}" pg_ctl -D "$dir/pg" -l "$dir/pg/server.log" -w -s start \
  -o "-c listen_addresses='' -c unix_socket_directories='$dir/pg'"
url="postgres://gpuslice@$(python3 -c "import urllib.parse,sys;print(urllib.parse.quote(sys.argv[1],safe=''))" "$dir/pg")/gpuslice"
rm -rf .sqlx && mkdir -p .sqlx
touch src/lib.rs
SQLX_OFFLINE=false SQLX_OFFLINE_DIR="$PWD/.sqlx" DATABASE_URL="$url" cargo check --quiet --lib --tests
"${as_pg[@]}" pg_ctl -D "$dir/pg" stop -m fast -s >/dev/null 2>&1 || true
echo "wrote $(ls .sqlx | wc -l) query files to .sqlx/"
