#!/usr/bin/env bash
# The class rush: 300 students of one course book a 1g.10gb each within one
# second (open loop), then poll their booking until it is active (or waits
# in the queue). A release `gpuslice serve` with its node workers on the
# embedded database and a simulated fleet of 4 nodes x 8 H100-80GB in MIG
# mode (224 1g.10gb slots): 224 bookings must be placed and become active,
# 76 must wait, no answer may be 5xx (the client counts every status), and no
# two bookings may share a slot.
# Usage: scripts/bench-rush.sh [students] [window-ms]
set -euo pipefail
cd "$(dirname "$0")/.."
students=${1:-300}
window=${2:-1000}
cargo build --release --quiet --bin gpuslice --example booking_load
bin=./target/release/gpuslice
dir=$(mktemp -d /tmp/gpuslice-bench-rush.XXXXXX); chmod 755 "$dir"
port=18094
for n in 1 2 3 4; do
  printf '[[node]]\nname = "gpu-%02d"\n[[node.gpu]]\nmodel = "H100-80GB"\nmode = "mig"\ncount = 8\n' "$n"
done > "$dir/fleet.toml"
export GPUSLICE_DATA_DIR="$dir" DATABASE_URL= RUST_LOG=warn GPUSLICE_FLEET="$dir/fleet.toml" GPUSLICE_BACKEND=sim
$bin serve --bind 127.0.0.1:$port >"$dir/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.2; done
$bin tenant add --slug cs-201 --name "CS 201" --max-active-bookings 1000 --max-gpu-memory-gib 100000 \
  --max-compute-slices 10000 --monthly-slice-hours 10000000 --max-booking-hours 24 >/dev/null
echo "making $students students with API tokens ..."
: > "$dir/clients"
for u in $(seq 1 "$students"); do
  email="student$u@cs201.example"
  echo "rush password $u of gpuslice" | $bin user add --email "$email" --tenant cs-201 >/dev/null
  echo "cs-201 $($bin token create --email "$email" | tail -1)" >> "$dir/clients"
done
# Wait until the workers have reported every GPU.
q() { psql -qAt -h "$dir/pg" -U gpuslice -d gpuslice -c "$1"; }
for _ in $(seq 300); do [ "$(q "SELECT count(*) FROM gpus WHERE mode = 'mig' AND mig_current")" = 32 ] && break; sleep 0.2; done
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -m)"
./target/release/examples/booking_load --url "http://127.0.0.1:$port" --clients "$dir/clients" --mode rush --window-ms "$window"
echo "bookings by status: $(q "SELECT string_agg(status || '=' || n, ' ') FROM (SELECT status, count(*) n FROM bookings GROUP BY status ORDER BY status) s")"
echo "slots held twice: $(q "SELECT count(*) FROM bookings a JOIN bookings b ON a.id < b.id AND a.gpu_id = b.gpu_id AND a.slices && b.slices AND a.during && b.during WHERE a.status NOT IN ('queued','cancelled','failed','released','expired') AND b.status NOT IN ('queued','cancelled','failed','released','expired')")"
