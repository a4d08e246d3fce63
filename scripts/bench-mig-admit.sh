#!/usr/bin/env bash
# What refusing requests that fit would buy: the default policy behind an
# admission rule (`bench mig --admit KEEP,QUANTILE[,all]`: a request is
# refused when its placement takes a GPU free over its window, leaving fewer
# than KEEP such GPUs, and it is shorter than the QUANTILE of the last 30
# days' request durations; whole-GPU requests only, or every profile with
# ",all"),
# against first-fit by served slice-hours at 1/2/4/8/16x arrival speed, on
# the two pod lists with arrival times (default, gpushare100). The first
# row is the default policy as it ships, with no rule. Prints one row per
# rule: the gain over first-fit in each cell, how many cells are at or
# above first-fit (to 0.01 %), the lowest, and the change in accepted
# requests (fewest and most, over the cells). gpuslice does not book with
# any of these rules (docs/design.md says why).
# Usage: scripts/bench-mig-admit.sh [SEEDS] [GPUS]   (default 42..51 40; about 5 min here)
set -euo pipefail
cd "$(dirname "$0")/.."
T=../shared/bench/traces
seeds=${1:-42..51}
gpus=${2:-40}
cargo build --release --quiet
python3 - ./target/release/gpuslice "$T" "$seeds" "$gpus" <<'PY'
import sys
sys.path.insert(0, "scripts")
import mig_bench
bin, traces, seeds, gpus = sys.argv[1:5]
loads = (1, 2, 4, 8, 16)
rules = [None] + ["%d,%s%s" % (k, q, every) for every in ("", ",all")
                  for k in (1, 2, 3) for q in ("0.25", "0.5", "0.75")]
head = ["%s %d×" % (p, s) for p in ("default", "gpushare100") for s in loads]
print("| rule | %s | cells ≥ first-fit | lowest | accepted vs first-fit |" % " | ".join(head))
print("| --- |%s --- | --- | --- |" % (" --- |" * len(head)))
for rule in rules:
    gains, accepted = [], []
    for pods in ("default", "gpushare100"):
        for s in loads:
            by = mig_bench.run(bin, traces, pods, int(gpus), s, seeds, admit=rule)
            name = "gpuslice" if rule is None else next(p for p in by if p != "first-fit")
            gains.append(mig_bench.gain(by, name, "first-fit")[0])
            accepted.append(mig_bench.gain(by, name, "first-fit", key="accepted")[0])
    at = sum(1 for d in gains if d >= -0.005)
    print("| %s | %s | %d of %d | %+.2f %% | %+.1f to %+.1f %% |" % (
        rule or "none (as it ships)", " | ".join("%+.2f" % d for d in gains),
        at, len(gains), min(gains), min(accepted), max(accepted)), flush=True)
PY
