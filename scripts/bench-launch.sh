#!/usr/bin/env bash
# Time-sliced shares at the kernel-launch layer on the stand-in libcuda:
# how 3 and 10 busy shares split the simulated GPU with no control, the
# cgroup freezer alone (as root) and the launch shim, and the shim's added
# cost per launch. Builds the release binaries first.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --quiet -p gpuslice -p cuda-standin -p gpuslice-shim
exec target/release/gpuslice bench launch --parts target/release --secs "${1:-15}"
