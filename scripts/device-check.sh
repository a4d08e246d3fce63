#!/usr/bin/env bash
# On a machine with a real NVIDIA GPU: builds gpuslice and records what NVML
# reports (driver and NVML versions, GPUs with PCI ids and MIG mode, every
# GPU-instance profile enum with its return code, id, slices, count, memory
# and driver name next to the catalog, existing instances, MIG devices, the
# time of one walk), once as root and once as the service user, so that
# what the worker may not do as that user is on record too. Read-only: it
# never changes MIG mode, clocks or any other GPU setting, and needs no
# database.
# Usage: scripts/device-check.sh [--service-user NAME] [--out DIR] [--nvml-lib PATH]
#   defaults: --service-user nobody, --out target/device-check
set -euo pipefail
cd "$(dirname "$0")/.."
user=nobody
out=target/device-check
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --service-user) user=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
cargo build --release --quiet --bin gpuslice
mkdir -p "$out"
bin=$PWD/target/release/gpuslice
if [ "$(id -u)" = 0 ]; then
  "$bin" gpu-check "${args[@]}" | tee "$out/gpu-check-root.txt"
  "$bin" gpu-check --json "${args[@]}" > "$out/gpu-check-root.json"
  # The service user needs to reach the binary.
  cp "$bin" /tmp/gpuslice-device-check && chmod 755 /tmp/gpuslice-device-check
  runuser -u "$user" -- /tmp/gpuslice-device-check gpu-check --json "${args[@]}" \
    > "$out/gpu-check-$user.json" || echo "as $user: gpu-check failed (see above)"
  rm -f /tmp/gpuslice-device-check
else
  echo "not root: recording as $(id -un) only"
  "$bin" gpu-check "${args[@]}" | tee "$out/gpu-check-$(id -un).txt"
  "$bin" gpu-check --json "${args[@]}" > "$out/gpu-check-$(id -un).json"
fi
echo "written to $out/"
