#!/usr/bin/env bash
# Measures sign-in latency (argon2id verify + session rotation + audit) of a
# release build on the embedded database, against /healthz in the same run
# as a baseline. Usage: scripts/bench-login.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-30}
cargo build --release --quiet --bin gpuslice
dir=$(mktemp -d /tmp/gpuslice-bench.XXXXXX); chmod 755 "$dir"
port=18089
GPUSLICE_DATA_DIR="$dir" DATABASE_URL= RUST_LOG=warn ./target/release/gpuslice demo --bind 127.0.0.1:$port >/dev/null 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.2; done

times() { sort -n | awk '{a[NR]=$1; s+=$1} END {printf "%.1f %.1f %.1f\n", s/NR*1000, a[int((NR+1)/2)]*1000, a[int(NR*0.95+0.5)]*1000}'; }
health=$(for _ in $(seq "$rounds"); do curl -s -o /dev/null -w '%{time_total}\n' "http://127.0.0.1:$port/healthz"; done | times)
login=$(for _ in $(seq "$rounds"); do
  jar=$(mktemp)
  token=$(curl -s -c "$jar" "http://127.0.0.1:$port/login" | sed -n 's/.*name="csrf_token" value="\([^"]*\)".*/\1/p' | head -1)
  curl -s -b "$jar" -c "$jar" -o /dev/null -w '%{time_total}\n' \
    --data-urlencode "csrf_token=$token" --data-urlencode "email=student@demo.gpuslice.dev" \
    --data-urlencode "password=try gpuslice on a laptop" "http://127.0.0.1:$port/login"
  rm -f "$jar"
done | times)
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -m)"
echo "rounds: $rounds (sequential, one client)"
echo "GET /healthz  mean/median/p95 ms: $health"
echo "POST /login   mean/median/p95 ms: $login"
awk -v h="${health%% *}" -v l="${login%% *}" 'BEGIN { printf "login / healthz (mean): %.0fx\n", l/h }'
