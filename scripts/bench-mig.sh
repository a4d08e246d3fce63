#!/usr/bin/env bash
# The MIG benchmark's two tables (BENCHMARKS.md): served work by policy at
# each load, with the repack reference and how busy the fleet was when it
# refused; and bookings made ahead, with and without moving scheduled
# bookings. Usage: scripts/bench-mig.sh [SEEDS] [GPUS] [ADVANCE_PCT]
set -euo pipefail
cd "$(dirname "$0")/.."
T=../shared/bench/traces
seeds=${1:-42..51}
gpus=${2:-40}
advance=${3:-30}
cargo build --release --quiet
python3 - ./target/release/gpuslice "$T" "$seeds" "$gpus" "$advance" <<'EOF'
import json, subprocess, sys
from collections import defaultdict
bin, traces, seeds, gpus, advance = sys.argv[1:6]

def run(pods, speedup, adv):
    out = json.loads(subprocess.check_output([bin, "bench", "mig", "--pods", "%s/openb_pod_list_%s.csv" % (traces, pods),
        "--gpus", gpus, "--speedup", str(speedup), "--advance", str(adv), "--seeds", seeds, "--json"]))
    by = defaultdict(list)
    for r in out:
        by[r["result"]["policy"]].append(r["result"])
    return by

mean = lambda xs: sum(xs) / len(xs)
print("Served work by policy (%s GPUs, seeds %s)" % (gpus, seeds))
print("| pods | speed-up | policy | accepted | served slice-hours | vs first-fit | seeds ≥ first-fit | fleet busy at refusals |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for pods in ("default", "gpushare100"):
    for speedup in (1, 2, 4, 8, 16):
        by = run(pods, speedup, 0)
        ff = mean([r["served_slice_hours"] for r in by["first-fit"]])
        for pol in ("first-fit", "best-fit", "gpuslice", "repack-reference"):
            rs = by[pol]
            served = mean([r["served_slice_hours"] for r in rs])
            # Seeds on which this policy served at least first-fit's work.
            wins = sum(1 for x, y in zip(by["first-fit"], rs) if y["served_slice_hours"] >= x["served_slice_hours"])
            print("| %s | %d | %s | %.2f %% | %s | %s | %s | %.1f %% |" % (pods, speedup, pol, mean([r["acceptance_pct"] for r in rs]),
                  format(round(served), ","), "—" if pol == "first-fit" else "%+.2f %%" % (100 * (served / ff - 1)),
                  "—" if pol == "first-fit" else "%d of %d" % (wins, len(rs)),
                  mean([r["busy_pct_at_refusals"] for r in rs])), flush=True)
print()
print("Bookings ahead (%s %% of requests booked 1–72 h before their start), default policy" % advance)
print("| pods | speed-up | moves | accepted | served slice-hours | vs no moves | moves per 1,000 requests | least notice |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for pods in ("default", "gpushare100"):
    for speedup in (1, 2, 4, 8, 16):
        by = run(pods, speedup, advance)
        base, moving = by["gpuslice"], by["gpuslice + moves"]
        b = mean([r["served_slice_hours"] for r in base])
        m = mean([r["served_slice_hours"] for r in moving])
        wins = sum(1 for x, y in zip(base, moving) if y["served_slice_hours"] >= x["served_slice_hours"])
        notices = [r["least_notice_s"] for r in moving if r["least_notice_s"] is not None]
        print("| %s | %d | no | %.2f %% | %s | — | — | — |" % (pods, speedup, mean([r["acceptance_pct"] for r in base]), format(round(b), ",")))
        print("| %s | %d | yes | %.2f %% | %s | %+.2f %% (%d of %d seeds ≥) | %.1f | %s |" % (pods, speedup, mean([r["acceptance_pct"] for r in moving]),
              format(round(m), ","), 100 * (m / b - 1), wins, len(base), 1000 * mean([r["moves"] / r["requests"] for r in moving]),
              ("%d min" % (min(notices) // 60)) if notices else "—"), flush=True)
EOF
