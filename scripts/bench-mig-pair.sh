#!/usr/bin/env bash
# Two orders of the MIG ranking terms paired on resampled streams: the
# check that decides whether an order replaces the default's (BENCHMARKS.md,
# "Extension first"). Each seed replays its own bootstrap of the trace
# (`bench mig --resample`) with both orders (`bench mig --key`), on fleets
# of 20, 30, 40 and 60 GPUs (seeds 1–40, on 40 GPUs 1–60), both pod lists,
# 1 to 16×. Prints per cell A's served slice-hours against B's, seed by
# seed, with the 95 % interval (normal approximation), by the full total
# and before the last arrival, then the cells where A is better or worse
# beyond the interval. About 2 minutes here.
# Usage: scripts/bench-mig-pair.sh ORDER_A [ORDER_B]   (B: ext,loss, the default's)
#   e.g. scripts/bench-mig-pair.sh ext,loss,mostfree
set -euo pipefail
cd "$(dirname "$0")/.."
T=../shared/bench/traces
a=${1:?usage: scripts/bench-mig-pair.sh ORDER_A [ORDER_B]}
b=${2:-ext,loss}
cargo build --release --quiet
python3 - ./target/release/gpuslice "$T" "$a" "$b" <<'PY'
import math, sys
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, "scripts")
import mig_bench
bin, traces, a, b = sys.argv[1:5]
fleets = [(20, "1..40"), (30, "1..40"), (40, "1..60"), (60, "1..40")]
cells = [(g, seeds, p, s) for g, seeds in fleets for p in ("default", "gpushare100") for s in (1, 2, 4, 8, 16)]

def one(cell):
    g, seeds, pods, s = cell
    # The one policy besides first-fit, whatever spacing the order came in.
    run = lambda order: next(r for p, r in mig_bench.run(bin, traces, pods, g, s, seeds, resample=True, key=order).items()
                             if p != "first-fit")
    return cell, run(a), run(b)

def paired(ra, rb, key):
    d = [ra[s][key] - rb[s][key] for s in ra]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    base = sum(r[key] for r in rb.values()) / n
    return 100 * mean / base, 100 * 1.96 * sd / math.sqrt(n) / base

print("%s against %s, resampled streams, paired by seed" % (a, b))
print("| GPUs | pods | load | full total | before the last arrival |")
print("| --- | --- | --- | --- | --- |")
summary = {"full total": [], "before the last arrival": []}
with ThreadPoolExecutor(2) as ex:
    for (g, _, pods, s), ra, rb in ex.map(one, cells):
        full = paired(ra, rb, "served_slice_hours")
        before = paired(ra, rb, "served_in_window_slice_hours")
        summary["full total"].append(full)
        summary["before the last arrival"].append(before)
        print("| %d | %s | %d× | %+.3f ± %.3f %% | %+.3f ± %.3f %% |" % (g, pods, s, *full, *before), flush=True)
for what, xs in summary.items():
    print("%s: better beyond the interval in %d of %d cells, worse in %d; mean %+.3f points per cell"
          % (what, sum(m - c > 0 for m, c in xs), len(xs), sum(m + c < 0 for m, c in xs), sum(m for m, _ in xs) / len(xs)))
PY
