#!/usr/bin/env bash
# On a machine with a real NVIDIA GPU: builds gpuslice and prints what NVML
# reports (GPUs, MIG mode, every GPU-instance profile with its id and
# possible placements) next to the catalog. Read-only: it never changes MIG
# mode, clocks or any other GPU setting, and needs no database.
# Usage: scripts/device-check.sh [--nvml-lib /path/to/libnvidia-ml.so.1]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin gpuslice
exec ./target/release/gpuslice gpu-check "$@"
