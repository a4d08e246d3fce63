#!/usr/bin/env bash
# The security gate: `cargo deny` over the dependencies, then a
# `gpuslice demo` on a free port, Schemathesis against its API (every
# check, all phases with the stateful one, with a manager's token, then
# an admin's) and the hostile crawler against its pages and API as each
# demo role; then the demo stops.
# Exits non-zero on any server error, undocumented status code or content
# type, schema violation, error in the demo's log, or dependency refused.
#
#   scripts/security-gate.sh            # release build (what CI runs)
#   GATE_PROFILE=debug scripts/security-gate.sh   # the test build, faster
#   GATE_MAX_TIME=120 ...               # seconds of Schemathesis fuzzing, per role
set -euo pipefail
cd "$(dirname "$0")/.."

profile=${GATE_PROFILE:-release}
status=0

echo "== cargo deny (deny.toml)"
if ! command -v cargo-deny >/dev/null 2>&1; then
  echo "installing cargo-deny ..."
  cargo install --locked cargo-deny@0.20.2
fi
cargo deny --all-features check bans licenses sources || status=1
# Advisories need RustSec's database from github.com. Where it cannot be
# fetched (an offline machine) the check says so and is skipped, loudly;
# a database fetched before is used as it is.
if cargo deny check advisories 2>/tmp/gpuslice-deny-advisories.log; then
  echo "advisories ok"
elif grep -q "failed to fetch advisory database" /tmp/gpuslice-deny-advisories.log; then
  if ls "${CARGO_HOME:-$HOME/.cargo}"/advisory-dbs/*/crates >/dev/null 2>&1; then
    cargo deny check --disable-fetch advisories || status=1
  else
    echo "SKIPPED: cargo deny advisories: RustSec's advisory database (github.com) cannot be reached from this machine"
  fi
else
  cat /tmp/gpuslice-deny-advisories.log
  status=1
fi
max_time=${GATE_MAX_TIME:-180}

py=target/gate-py
if [ ! -x "$py/bin/schemathesis" ]; then
  echo "installing Schemathesis into $py ..."
  python3 -m venv "$py"
  "$py/bin/pip" install -q "schemathesis==4.32.5"
fi

if [ "$profile" = release ]; then
  cargo build --release --locked --bin gpuslice
else
  cargo build --locked --bin gpuslice
fi
bin=$PWD/target/$profile/gpuslice

# The data folder lives under target/ (not /tmp): as root the embedded
# PostgreSQL runs as `postgres`, which must be able to reach it.
data=$PWD/target/security-gate
rm -rf "$data"
mkdir -p "$data"
chmod 755 "$data"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
base=http://127.0.0.1:$port
log=$data/demo.log
GPUSLICE_LOG_JSON=true "$bin" --data-dir "$data" demo --bind "127.0.0.1:$port" >"$log" 2>&1 &
demo=$!
stop_demo() {
  kill -TERM "$demo" 2>/dev/null || true
  wait "$demo" 2>/dev/null || true
}
trap stop_demo EXIT
for _ in $(seq 1 120); do
  if curl -fs "$base/readyz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$demo" 2>/dev/null; then echo "the demo did not start:"; tail -20 "$log"; exit 1; fi
  sleep 1
done

# As a manager who books (pi), then as an admin, whose powers reach every
# tenant's bookings. The demo admin is in no tenant: it reaches the
# bookings pi made where a guessed id hits one (ids are small), which is
# how an admin's release without a reason was found (2026-12-07).
for who in pi admin; do
  token=$("$bin" --data-dir "$data" token create --email "$who@demo.gpuslice.dev" --name security-gate | grep -o 'gps_[A-Za-z0-9_-]*' | head -1) ||
    { echo "could not create an API token for $who@demo.gpuslice.dev"; exit 1; }
  echo "== Schemathesis as $who: $base/api/v1/openapi.json (${max_time}s)"
  "$py/bin/schemathesis" --config-file deploy/security/schemathesis.toml run "$base/api/v1/openapi.json" \
    --url "$base/api/v1" \
    -H "Authorization: Bearer $token" \
    --checks all \
    --phases examples,coverage,fuzzing,stateful \
    --max-time "$max_time" \
    --workers 1 \
    --suppress-health-check all \
    --seed 42 || status=$?
done

echo "== hostile crawl of the pages as each demo role"
"$py/bin/python" scripts/hostile_crawl.py "$base" "try gpuslice on a laptop" || status=$?

if grep -q '"level":"ERROR"' "$log"; then
  echo "the demo logged errors:"
  grep '"level":"ERROR"' "$log" | tail -20
  status=1
fi
exit "$status"
