#!/usr/bin/env bash
# Reports, usage pages, the dashboard and the finance CSV as usage history
# grows. A release `gpuslice serve` (no worker) on the embedded PostgreSQL;
# `gpuslice bench history` fills it in steps up to each size given (usage
# rows over the 12 months ending now) and after each step every page is
# fetched REQS times in a row with a bearer token (p50, p99, max), the
# year's CSV once for its first byte and its rate. hist-01 is the busiest
# tenant (about 29 % of all bookings).
# Usage: scripts/bench-history.sh [ROWS ...]   (default: 1000000 10000000)
# Env: REQS (default 50), KEEP_DIR=1 keeps the data directory.
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1000000 10000000)
reqs=${REQS:-50}
cargo build --release --quiet --bin gpuslice
bin=./target/release/gpuslice
dir=$(mktemp -d /tmp/gpuslice-bench-history.XXXXXX); chmod 755 "$dir"
port=18093
export GPUSLICE_DATA_DIR="$dir" DATABASE_URL= RUST_LOG=warn GPUSLICE_BACKEND=sim
$bin serve --no-worker --bind 127.0.0.1:$port >"$dir/serve.log" 2>&1 &
pid=$!
cleanup() {
  kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true
  [ -n "${KEEP_DIR:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.2; done
q() { psql -qAt -h "$dir/pg" -U gpuslice -d gpuslice "$@"; }
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -m); PostgreSQL $(q -c 'SHOW server_version')"

made=0
year_from=$(date -u -d '-365 days' +%F); today=$(date -u +%F); this_month=$(date -u +%Y-%m-01)
# Last month, whole (this one may be days old).
month_from=$(date -u -d "$this_month -1 month" +%F); month_to=$(date -u -d "$this_month -1 day" +%F)
base="http://127.0.0.1:$port"
# Times one URL REQS times (after one warm-up): p50, p99, max in ms.
timeit() {
  local token=$1 url=$2 label=$3
  curl -sf -o /dev/null -H "Authorization: Bearer $token" "$base$url" || { echo "FAILED: $label $url"; return 1; }
  for _ in $(seq "$reqs"); do
    curl -s -o /dev/null -w '%{http_code} %{time_total}\n' -H "Authorization: Bearer $token" "$base$url"
  done | sort -k2 -g | awk -v l="$label" '
    $1 != 200 { bad++ } { t[NR] = $2 * 1000 }
    END { n = NR; i99 = int(n * 0.99 + 0.999); if (i99 > n) i99 = n;
          printf "| %s | %d | %.0f ms | %.0f ms | %.0f ms | %d |\n", l, n, t[int((n + 1) / 2)], t[i99], t[n], bad }'
}
for size in "${sizes[@]}"; do
  add=$((size - made))
  if [ "$add" -gt 0 ]; then
    echo "filling: $add more usage rows"
    RUST_LOG=warn,sqlx=error $bin bench history --rows "$add" --months 12 --seed "$size"
    made=$(q -c 'SELECT count(*) FROM usage')
  fi
  if [ -z "${admin:-}" ]; then
    # Accounts once the history's tenants exist; tariffs that change mid-year.
    echo "correct horse battery staple 1" | $bin user add --email root@bench.example --role admin >/dev/null
    echo "correct horse battery staple 2" | $bin user add --email fin@bench.example --role finance >/dev/null
    echo "correct horse battery staple 3" | $bin user add --email lead@bench.example --tenant hist-01:manager >/dev/null
    admin=$($bin token create --email root@bench.example | tail -1)
    fin=$($bin token create --email fin@bench.example | tail -1)
    mgr=$($bin token create --email lead@bench.example | tail -1)
    q -c "INSERT INTO tariffs (model, kind, price_per_slice_hour, effective_from) VALUES
          ('H100-80GB', 'mig', 0.30, '2020-01-01'), ('H100-80GB', 'mig', 0.25, '$(date -u -d '-180 days' +%F)'),
          ('L40S-48GB', 'timeslice', 0.12, '2020-01-01'), ('L40S-48GB', 'timeslice', 0.10, '$(date -u -d '-90 days' +%F)')"
  fi
  echo
  echo "### $(q -c 'SELECT count(*) FROM usage') usage rows ($(q -c 'SELECT count(*) FROM bookings') bookings, $(q -c 'SELECT count(*) FROM usage_daily') daily rollup rows; database $(q -c "SELECT pg_size_pretty(pg_database_size('gpuslice'))"))"
  echo
  # The year's report once cold: its whole months' totals are computed
  # and cached by this first read (the timed reads after it use them).
  cold=$(curl -s -o /dev/null -w '%{time_total}' -H "Authorization: Bearer $fin" "$base/reports?from=$year_from&to=$today")
  awk -v c="$cold" 'BEGIN { printf "first (cold) /reports for a year: %.0f ms\n\n", c * 1000 }'
  echo "| page | requests | p50 | p99 | max | non-200 |"
  echo "| --- | --- | --- | --- | --- | --- |"
  timeit "$fin" "/reports?from=$year_from&to=$today" "/reports, a year (finance)"
  timeit "$fin" "/reports?from=$month_from&to=$month_to" "/reports, last month (finance)"
  timeit "$fin" "/reports?from=$this_month&to=$today" "/reports, this month so far (finance)"
  timeit "$mgr" "/usage?tenant=hist-01&from=$month_from&to=$month_to" "/usage, a tenant-month (manager)"
  timeit "$mgr" "/usage?tenant=hist-01&from=$year_from&to=$today&by=month" "/usage, a tenant-year by month (manager)"
  timeit "$admin" "/" "dashboard (admin)"
  timeit "$mgr" "/" "dashboard (manager)"
  timeit "$fin" "/api/v1/usage?from=$month_from&to=$month_to&tenant=hist-01" "GET /api/v1/usage, a tenant-month"
  # The year's CSV: first byte, then the whole file's rate.
  read -r code first total < <(curl -s -o "$dir/year.csv" -w '%{http_code} %{time_starttransfer} %{time_total}\n' \
    -H "Authorization: Bearer $fin" "$base/reports/usage.csv?from=$year_from&to=$today")
  lines=$(wc -l < "$dir/year.csv")
  awk -v c="$code" -v f="$first" -v t="$total" -v l="$lines" 'BEGIN {
    printf "\nCSV of the year (HTTP %s): first byte %.0f ms; %d lines in %.2f s (%.0f rows/s)\n", c, f * 1000, l, t, (l - 1) / t }'
  rm -f "$dir/year.csv"
done
