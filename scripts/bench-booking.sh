#!/usr/bin/env bash
# Booking POST throughput and latency at 100 concurrent clients against a
# release build on the embedded database, with GET /api/v1/me (bearer auth
# only) in the same run as the baseline. 20 tenants, 5 clients each, a
# simulated fleet of 20 nodes x 8 H100-80GB in MIG mode plus 8 L40S for
# shares, with the node workers running.
# Usage: scripts/bench-booking.sh [requests]
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-2000}
cargo build --release --quiet --bin gpuslice --example booking_load
bin=./target/release/gpuslice
dir=$(mktemp -d /tmp/gpuslice-bench.XXXXXX); chmod 755 "$dir"
port=18090
{
  for n in $(seq 1 20); do
    printf '[[node]]\nname = "node-%02d"\n[[node.gpu]]\nmodel = "H100-80GB"\nmode = "mig"\ncount = 8\n' "$n"
  done
  printf '[[node]]\nname = "share-node"\n[[node.gpu]]\nmodel = "L40S-48GB"\nmode = "timeslice"\ncount = 8\nmax_shares = 12\n'
} > "$dir/fleet.toml"
export GPUSLICE_DATA_DIR="$dir" DATABASE_URL= RUST_LOG=warn GPUSLICE_FLEET="$dir/fleet.toml" GPUSLICE_BACKEND=sim
$bin serve --bind 127.0.0.1:$port >"$dir/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; cp "$dir/serve.log" /tmp/bench-serve.log 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 200); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.2; done
: > "$dir/clients"
for t in $(seq 1 20); do
  slug=$(printf 'lab-%02d' "$t")
  $bin tenant add --slug "$slug" --name "Lab $t" --max-active-bookings 1000 --max-gpu-memory-gib 100000 \
    --max-compute-slices 10000 --monthly-slice-hours 10000000 --max-booking-hours 24 >/dev/null
  for u in $(seq 1 5); do
    email="u$u@$slug.example"
    echo "benchmark password $t-$u of gpuslice" | $bin user add --email "$email" --tenant "$slug" >/dev/null
    echo "$slug $($bin token create --email "$email" | tail -1)" >> "$dir/clients"
  done
done
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -m)"
echo "clients: $(wc -l < "$dir/clients") concurrent, $requests requests per phase"
./target/release/examples/booking_load --url "http://127.0.0.1:$port" --clients "$dir/clients" --requests 300 --mode me >/dev/null  # warm-up
./target/release/examples/booking_load --url "http://127.0.0.1:$port" --clients "$dir/clients" --requests "$requests" --mode me
./target/release/examples/booking_load --url "http://127.0.0.1:$port" --clients "$dir/clients" --requests "$requests" --mode book
# The same with 10 clients (one per tenant pair), for latency without a queue of 100.
awk 'NR % 10 == 1' "$dir/clients" > "$dir/clients10"
echo "then 10 concurrent clients:"
./target/release/examples/booking_load --url "http://127.0.0.1:$port" --clients "$dir/clients10" --requests "$((requests / 4))" --mode me
./target/release/examples/booking_load --url "http://127.0.0.1:$port" --clients "$dir/clients10" --requests "$((requests / 4))" --mode book
curl -s "http://127.0.0.1:$port/metrics" >/dev/null
echo "bookings by status: $(psql -qAt -h "$dir/pg" -U gpuslice -d gpuslice -c "SELECT string_agg(status || '=' || n, ' ') FROM (SELECT status, count(*) n FROM bookings GROUP BY status ORDER BY status) s" 2>/dev/null || echo '?')"
