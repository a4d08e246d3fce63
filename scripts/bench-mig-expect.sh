#!/usr/bin/env bash
# The MIG policies in expectation: each seed replays its own bootstrap of
# the trace (`bench mig --resample`: as many pods, drawn with replacement),
# so the seeds are independent streams of the same kind, unlike the fixed
# trace's seeds (which only order simultaneous arrivals). Prints, per pod
# list and load, each policy against first-fit on the same streams: the
# mean difference in served slice-hours with its 95 % confidence interval
# and the seeds at or above first-fit, by the full total and before the
# last arrival. About 6 minutes for 60 seeds on 40 GPUs here.
# With a third argument N, the seeds replay the trace itself with each
# arrival moved a uniform 0 to N seconds later instead (`bench mig
# --jitter-s N`): whether one stream's outcome survives a shift of its
# arrivals that no person would notice.
# Usage: scripts/bench-mig-expect.sh [SEEDS] [GPUS] [JITTER_S]
set -euo pipefail
cd "$(dirname "$0")/.."
T=../shared/bench/traces
seeds=${1:-1..60}
gpus=${2:-40}
jitter=${3:-0}
cargo build --release --quiet
python3 - ./target/release/gpuslice "$T" "$seeds" "$gpus" "$jitter" <<'PY'
import sys
sys.path.insert(0, "scripts")
import mig_bench
bin, traces, seeds, gpus, jitter = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
vary = dict(jitter_s=jitter) if jitter else dict(resample=True)
cell = lambda g: "%+.2f ± %.2f %% (%d of %d)" % g
print("| pods | load | policy | vs first-fit, full total | before the last arrival |")
print("| --- | --- | --- | --- | --- |")
for pods in ("default", "gpushare100"):
    for s in (1, 2, 4, 8, 16):
        by = mig_bench.run(bin, traces, pods, gpus, s, seeds, **vary)
        for policy in ("gpuslice", "best-fit", "repack-reference"):
            full = mig_bench.paired(by, policy, "first-fit")
            before = mig_bench.paired(by, policy, "first-fit", "served_in_window_slice_hours")
            print("| %s | %d× | %s | %s | %s |" % (pods, s, policy, cell(full), cell(before)), flush=True)
PY
