#!/usr/bin/env bash
# The replay on every workload of FGD's published results (fgd-expected/):
# the four pod lists in ../shared/bench/traces and the thirteen built from
# them by scripts/build-fgd-variants.py (or, where a folder of the published
# lists is given as $FGD_LISTS, those). For each workload: best-fit, fgd and
# gpuslice (mean allocation at 130 %, seeds 42..51), the published BestFit
# and FGD means, faithfulness (ours minus published) and gpuslice's margin
# over the published FGD mean. Usage: scripts/bench-replay-all.sh [SEEDS]
set -euo pipefail
cd "$(dirname "$0")/.."
T=../shared/bench/traces
seeds=${1:-42..51}
cargo build --release --quiet
bin=./target/release/gpuslice
built=target/fgd-variants
python3 scripts/build-fgd-variants.py "$T" "$built" >/dev/null
python3 - "$bin" "$T" "$built" "$seeds" "${FGD_LISTS:-}" <<'EOF'
import os, sys
sys.path.insert(0, "scripts")
from fgd_replay import published_means, replay
bin, traces, built, seeds, lists = sys.argv[1:6]
pub = published_means(traces)
mean = lambda xs: sum(xs) / len(xs)
work = sorted({w for w, _ in pub})
print("%-12s %-5s %8s %8s %8s %8s %8s %7s %7s %8s" % ("workload", "from", "bestfit", "fgd", "gpuslice", "BF pub", "FGD pub", "BF err", "FGD err", "margin"))
margins = []
for w in work:
    name = "openb_pod_list_%s.csv" % w
    if lists and os.path.exists(os.path.join(lists, name)):
        path, origin = os.path.join(lists, name), "pub"
    elif os.path.exists(os.path.join(traces, name)):
        path, origin = os.path.join(traces, name), "trace"
    else:
        path, origin = os.path.join(built, name), "built"
    got = replay(bin, traces, path, ("best-fit", "fgd", "gpuslice"), seeds)
    bf, fgd = pub[(w, "BestFit")], pub[(w, "FGD")]
    margins.append(got["gpuslice"] - fgd)
    print("%-12s %-5s %8.2f %8.2f %8.2f %8.2f %8.2f %+7.2f %+7.2f %+8.2f" % (w, origin, got["best-fit"], got["fgd"], got["gpuslice"], bf, fgd,
          got["best-fit"] - bf, got["fgd"] - fgd, got["gpuslice"] - fgd), flush=True)
print("gpuslice vs published FGD: mean margin %+.2f, lowest %+.2f, ahead or level on %d of %d" % (
    mean(margins), min(margins), sum(1 for m in margins if m >= 0), len(margins)))
EOF
