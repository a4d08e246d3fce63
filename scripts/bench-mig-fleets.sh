#!/usr/bin/env bash
# Checks the MIG default policy beyond the fleet it was chosen on: gpuslice
# against first-fit by served slice-hours on fleets of 20, 30, 40 and 60
# H100s, at 1/2/4/8/16x arrival speed, for the two pod lists with arrival
# times (default, gpushare100). One seed: the seed only orders simultaneous
# arrivals and draws the length of pods without a deletion time, so other
# seeds are not independent samples (BENCHMARKS.md). Prints one line per
# fleet, then how many cells are at or above first-fit. MIX is the profile
# mix the default policy keeps room for (`bench mig --mix`): recent (the
# last 30 days of requests, as the booking path) or stream.
# Usage: scripts/bench-mig-fleets.sh [SEED] [MIX]
set -euo pipefail
cd "$(dirname "$0")/.."
T=../shared/bench/traces
seed=${1:-42}
mix=${2:-recent}
cargo build --release --quiet
python3 - ./target/release/gpuslice "$T" "$seed" "$mix" <<'PY'
import sys
sys.path.insert(0, "scripts")
import mig_bench
bin, traces, seed, mix = sys.argv[1:5]
loads = (1, 2, 4, 8, 16)
cells = []
print("| pods | GPUs | %s |" % " | ".join("%d×" % s for s in loads))
print("| --- | --- |%s" % (" --- |" * len(loads)))
for pods in ("default", "gpushare100"):
    for gpus in (20, 30, 40, 60):
        row = []
        for s in loads:
            by = mig_bench.run(bin, traces, pods, gpus, s, seed, mix=mix)
            d, _, _ = mig_bench.gain(by, "gpuslice", "first-fit")
            cells.append(d)
            row.append("%+.2f %%" % d)
        print("| %s | %d | %s |" % (pods, gpus, " | ".join(row)), flush=True)
at = sum(1 for d in cells if d >= -0.005)
print("\ngpuslice at or above first-fit (to 0.01 %%) in %d of %d cells; mean %+.2f %%, lowest %+.2f %%"
      % (at, len(cells), sum(cells) / len(cells), min(cells)))
PY
