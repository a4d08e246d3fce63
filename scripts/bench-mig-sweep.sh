#!/usr/bin/env bash
# Orders of the MIG ranking terms against first-fit: every order of one to
# three of the terms (`bench mig --key`; the GPU's index and the slot break
# the remaining ties), each replayed on both pod lists at 1, 2, 4, 8 and
# 16× against first-fit on the same seeds. Prints one row per order, best
# first: the cells (pod list × load) at or above first-fit by the full
# total and before the last arrival, the lowest and the summed change, and
# the ten changes. A sweep of this kind (on a temporary switch, with the
# index as a term) proposed the default's order (BENCHMARKS.md, "Extension
# first"): one stream proposes, the paired resampled check
# (scripts/bench-mig-pair.sh ORDER) decides. About 4 minutes here for the 65 orders of the five
# default terms on 40 GPUs. A change counts as level to 0.01 %.
# Usage: scripts/bench-mig-sweep.sh [SEEDS] [GPUS] [TERMS]
#   e.g. scripts/bench-mig-sweep.sh 42..51 40 "ext overhang loss free mostfree"
set -euo pipefail
cd "$(dirname "$0")/.."
T=../shared/bench/traces
seeds=${1:-42..51}
gpus=${2:-40}
terms=${3:-ext overhang loss free mostfree}
cargo build --release --quiet
python3 - ./target/release/gpuslice "$T" "$seeds" "$gpus" "$terms" <<'PY'
import itertools, sys
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, "scripts")
import mig_bench
bin, traces, seeds, gpus, terms = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5].split()
cells = [(p, s) for p in ("default", "gpushare100") for s in (1, 2, 4, 8, 16)]
# After one of free and mostfree the other breaks no tie: such an order
# equals the order without the second, and is left out.
orders = [",".join(o) for n in (1, 2, 3) for o in itertools.permutations(terms, n)
          if not {"free", "mostfree"} <= set(o)]

def score(order):
    full, before = [], []
    for pods, s in cells:
        by = mig_bench.run(bin, traces, pods, gpus, s, seeds, key=order)
        full.append(mig_bench.gain(by, "key " + order, "first-fit")[0])
        before.append(mig_bench.gain(by, "key " + order, "first-fit", "served_in_window_slice_hours")[0])
    return order, full, before

ok = lambda xs: sum(round(x, 2) >= 0 for x in xs)
with ThreadPoolExecutor(2) as ex:
    rows = list(ex.map(score, orders))
rows.sort(key=lambda r: (-ok(r[1]), -sum(r[1])))
print("Orders against first-fit (%d GPUs, seeds %s); cells: %s" % (gpus, seeds,
      ", ".join("%s %d×" % c for c in cells)))
print("| order | cells ≥, full | lowest | sum | cells ≥, before the last arrival | the ten cells, full total (%) |")
print("| --- | --- | --- | --- | --- | --- |")
for order, full, before in rows:
    print("| %s | %d | %+.2f | %+.2f | %d | %s |" % (order, ok(full), min(full), sum(full), ok(before),
          " ".join("%+.2f" % x for x in full)))
PY
