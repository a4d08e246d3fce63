#!/usr/bin/env bash
# Finance CSV export of 1,000,000 rows (1,000 bookings x 1,000 days) from a
# release build of `gpuslice serve` on the embedded PostgreSQL: wall time and
# the server's peak memory. Baseline in the same run: PostgreSQL writing the
# same rows as CSV itself (psql \copy of the export's query, on the daily
# rollup as the export reads it, to /dev/null).
# Usage: scripts/bench-export.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin gpuslice
bin=./target/release/gpuslice
dir=$(mktemp -d /tmp/gpuslice-bench.XXXXXX); chmod 755 "$dir"
port=18091
export GPUSLICE_DATA_DIR="$dir" DATABASE_URL= RUST_LOG=warn GPUSLICE_BACKEND=sim
$bin serve --no-worker --bind 127.0.0.1:$port >"$dir/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 200); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.2; done
$bin tenant add --slug lab --name "Lab, \"quoted\"" >/dev/null
echo "a finance password for the bench" | $bin user add --email fin@bench.example --role finance >/dev/null
echo "a member password for the bench" | $bin user add --email ana@bench.example --tenant lab >/dev/null
token=$($bin token create --email fin@bench.example | tail -1)
q() { psql -qAt -h "$dir/pg" -U gpuslice -d gpuslice "$@"; }
q -c "INSERT INTO bookings (tenant_id, user_id, kind, model, profile, memory_gib, compute_slices, priority, hours, during, status)
      SELECT t.id, u.id, 'mig', 'H100-80GB', '1g.10gb', 10, 1, 'normal', 24, tstzrange('2024-01-01', '2026-10-01'), 'failed'
      FROM tenants t, users u, generate_series(1, 1000) WHERE t.slug = 'lab' AND u.email = 'ana@bench.example'"
q -c "INSERT INTO usage (booking_id, interval_start, interval_end, slice_seconds, gib_seconds)
      SELECT b.id, timestamptz '2024-01-01 12:00+00' + d * interval '1 day', timestamptz '2024-01-01 12:01+00' + d * interval '1 day', 60, 600
      FROM bookings b, generate_series(0, 999) d"
q -c "INSERT INTO tariffs (model, kind, price_per_slice_hour, effective_from) VALUES ('H100-80GB', 'mig', 0.25, '2024-01-01')"
q -c "VACUUM ANALYZE usage"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -m)"
echo "usage rows: $(q -c 'SELECT count(*) FROM usage')"
hwm() { awk '/VmHWM/ {print $2}' "/proc/$pid/status"; }
before=$(hwm)
t0=$(date +%s.%N)
curl -sf -H "Authorization: Bearer $token" "http://127.0.0.1:$port/reports/usage.csv?from=2024-01-01&to=2026-12-31" -o "$dir/out.csv"
t1=$(date +%s.%N)
after=$(hwm)
lines=$(wc -l < "$dir/out.csv")
size=$(du -m "$dir/out.csv" | cut -f1)
# Baseline: the export's own query, written as CSV by PostgreSQL.
t2=$(date +%s.%N)
q -c "\copy (WITH days AS (SELECT booking_id, day, slice_seconds s, gib_seconds g FROM usage_daily) SELECT d.day, t.slug, t.name, us.email, b.id, b.kind, b.model, b.profile, d.s, d.s / 3600, d.g / 3600, round(d.s::numeric / 3600 * tf.price, 2), 'EUR' FROM days d JOIN bookings b ON b.id = d.booking_id JOIN tenants t ON t.id = b.tenant_id JOIN users us ON us.id = b.user_id LEFT JOIN LATERAL (SELECT price_per_slice_hour price FROM tariffs WHERE model = b.model AND kind = b.kind AND effective_from <= d.day ORDER BY effective_from DESC LIMIT 1) tf ON TRUE ORDER BY d.day, t.slug, b.id) TO '/dev/null' CSV"
t3=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" -v l="$lines" -v s="$size" -v h0="$before" -v h1="$after" 'BEGIN {
  printf "export: %d lines (%d MiB) in %.2f s (%.0f rows/s)\n", l, s, b - a, (l - 1) / (b - a);
  printf "server peak memory: %.1f MiB before, %.1f MiB after (grew %.1f MiB)\n", h0 / 1024, h1 / 1024, (h1 - h0) / 1024;
  printf "baseline, psql \\copy of the same query: %.2f s; export / baseline: %.2fx\n", d - c, (b - a) / (d - c) }'
