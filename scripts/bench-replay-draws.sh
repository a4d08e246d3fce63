#!/usr/bin/env bash
# How much the thirteen built workloads' results depend on the draw that
# built them: scripts/build-fgd-variants.py follows each published list's
# recipe, but the published lists are one draw and ours another. Builds
# DRAWS draws of every built list (draw 0 is the one in BENCHMARKS.md's
# replay table) and replays each with fgd and gpuslice (seeds
# 42..51). Prints, per workload, fgd's error against the published mean and
# gpuslice's margin over it (mean and range over the draws), and gpuslice
# minus the fgd run here. Usage: scripts/bench-replay-draws.sh [DRAWS] [SEEDS]
set -euo pipefail
cd "$(dirname "$0")/.."
T=../shared/bench/traces
draws=${1:-5}
seeds=${2:-42..51}
cargo build --release --quiet
for d in $(seq 0 $((draws - 1))); do
    python3 scripts/build-fgd-variants.py "$T" "target/fgd-draws/d$d" "$d" >/dev/null
done
python3 - ./target/release/gpuslice "$T" target/fgd-draws "$draws" "$seeds" <<'PY'
import os, sys
sys.path.insert(0, "scripts")
from fgd_replay import published_means, replay
bin, traces, root, draws, seeds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
pub = published_means(traces)
mean = lambda xs: sum(xs) / len(xs)
built = sorted(f[len("openb_pod_list_"):-4] for f in os.listdir(os.path.join(root, "d0")))
span = lambda xs: "%+.2f (%+.2f..%+.2f)" % (mean(xs), min(xs), max(xs))
print("| workload | fgd err, mean (range) | gpuslice margin, mean (range) | draws with margin ≥ 0 | gpuslice − fgd here, mean (range) |")
print("| --- | --- | --- | --- | --- |")
all_margins = []
for w in built:
    fgd_pub = pub[(w, "FGD")]
    err, margin, here = [], [], []
    for d in range(draws):
        got = replay(bin, traces, os.path.join(root, "d%d" % d, "openb_pod_list_%s.csv" % w), ("fgd", "gpuslice"), seeds)
        err.append(got["fgd"] - fgd_pub)
        margin.append(got["gpuslice"] - fgd_pub)
        here.append(got["gpuslice"] - got["fgd"])
    all_margins.append(mean(margin))
    print("| %s | %s | %s | %d of %d | %s |" % (w, span(err), span(margin), sum(1 for m in margin if m >= 0), draws, span(here)), flush=True)
print()
print("Mean over draws of gpuslice's margin: lowest %+.2f; at or above the published FGD mean on %d of %d built workloads" % (
    min(all_margins), sum(1 for m in all_margins if m >= 0), len(all_margins)))
PY
