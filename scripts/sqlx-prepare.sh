#!/usr/bin/env bash
# Refreshes the sqlx offline query data in .sqlx/ (commit the result): starts
# a throw-away PostgreSQL, applies migrations/ with psql, and recompiles the
# crate with the query macros online.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(dirname "$(readlink -f "$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb | tail -1)")")
dir=$(mktemp -d /tmp/gpuslice-prepare.XXXXXX)
chmod 755 "$dir"  # the postgres account must reach it when we are root
as_pg=()
if [ "$(id -u)" = 0 ]; then
  as_pg=(runuser -u postgres --)
  chown postgres "$dir"
fi
cleanup() { "${as_pg[@]}" "$bin/pg_ctl" -D "$dir/pg" stop -m fast -s >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT
"${as_pg[@]}" "$bin/initdb" -D "$dir/pg" -U gpuslice --auth-local=trust --auth-host=reject -E UTF8 --locale=C.UTF-8 --no-instructions >/dev/null
"${as_pg[@]}" "$bin/pg_ctl" -D "$dir/pg" -l "$dir/pg/server.log" -w -s start \
  -o "-c listen_addresses='' -c unix_socket_directories='$dir/pg'"
psql -q -h "$dir/pg" -U gpuslice -d postgres -c "CREATE DATABASE gpuslice"
for f in migrations/*.sql; do
  psql -q -h "$dir/pg" -U gpuslice -d gpuslice -v ON_ERROR_STOP=1 -f "$f" >/dev/null
done
url="postgres://gpuslice@$(python3 -c "import urllib.parse,sys;print(urllib.parse.quote(sys.argv[1],safe=''))" "$dir/pg")/gpuslice"
rm -rf .sqlx && mkdir -p .sqlx
touch src/lib.rs
SQLX_OFFLINE=false SQLX_OFFLINE_DIR="$PWD/.sqlx" DATABASE_URL="$url" cargo check --quiet --lib --tests
echo "wrote $(ls .sqlx | wc -l) query files to .sqlx/"
