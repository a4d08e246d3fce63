#!/usr/bin/env bash
# The MIG benchmark's two tables (BENCHMARKS.md): served work by policy at
# each load, with the repack reference, the part served before the last
# arrival (while requests still competed) and how busy the fleet was when it
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
import sys
sys.path.insert(0, "scripts")
import mig_bench
bin, traces, seeds, gpus, advance = sys.argv[1:6]

mean = lambda xs: sum(xs) / len(xs)
print("Served work by policy (%s GPUs, seeds %s)" % (gpus, seeds))
print("| pods | speed-up | policy | accepted | served slice-hours | vs first-fit | seeds ≥ first-fit | served after the last arrival | served before it, vs first-fit | seeds ≥ first-fit | fleet busy before it | fleet busy at refusals |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
W = "served_in_window_slice_hours"
def vs_first_fit(by_seed, pol, key):
    """The two columns against first-fit: how much more, on how many seeds."""
    if pol == "first-fit":
        return "—", "—"
    d, wins, n = mig_bench.gain(by_seed, pol, "first-fit", key)
    return "%+.2f %%" % d, "%d of %d" % (wins, n)
cells = {}
for pods in ("default", "gpushare100"):
    for speedup in (1, 2, 4, 8, 16):
        by_seed = cells[pods, speedup] = mig_bench.run(bin, traces, pods, gpus, speedup, seeds, 0, causes=True)
        by = {p: list(rs.values()) for p, rs in by_seed.items()}  # means need no order
        for pol in ("first-fit", "best-fit", "gpuslice", "repack-reference"):
            rs = by[pol]
            served = mean([r["served_slice_hours"] for r in rs])
            inside = mean([r[W] for r in rs])
            print("| %s | %d | %s | %.2f %% | %s | %s | %s | %.0f %% | %s | %s | %.1f %% | %.1f %% |" % (pods, speedup, pol, mean([r["acceptance_pct"] for r in rs]),
                  format(round(served), ","), *vs_first_fit(by_seed, pol, "served_slice_hours"), 100 * (1 - inside / served),
                  *vs_first_fit(by_seed, pol, W), mean([r["window_busy_pct"] for r in rs]),
                  mean([r["busy_pct_at_refusals"] for r in rs])), flush=True)
print()
print("Refusals by cause: fragmentation's (packing every booking present again, largest first, would have held the request too) and capacity's (the rest: which requests were taken before decided them); means per seed")
print("| pods | speed-up | policy | refused | fragmentation's | their slice-hours | capacity's: slice-hours | served vs first-fit |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for (pods, speedup), by_seed in cells.items():
    for pol in ("first-fit", "gpuslice"):
        rs = list(by_seed[pol].values())
        m = lambda key: mean([r[key] for r in rs])
        refused = mean([r["requests"] - r["accepted"] for r in rs])
        frag, frag_sh = m("refused_fragmented"), m("refused_fragmented_slice_hours")
        print("| %s | %d | %s | %s | %s (%.0f %%) | %s | %s | %s |" % (pods, speedup, pol, format(round(refused), ","),
              format(round(frag), ","), 100 * frag / max(refused, 1), format(round(frag_sh), ","),
              format(round(m("refused_slice_hours") - frag_sh), ","),
              vs_first_fit(by_seed, pol, "served_slice_hours")[0]), flush=True)
print()
print("Bookings ahead (%s %% of requests booked 1–72 h before their start), default policy" % advance)
print("| pods | speed-up | moves | accepted | served slice-hours | vs no moves | served before the last arrival, vs no moves | moves per 1,000 requests | least notice |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for pods in ("default", "gpushare100"):
    for speedup in (1, 2, 4, 8, 16):
        by_seed = mig_bench.run(bin, traces, pods, gpus, speedup, seeds, advance)
        by = {p: list(rs.values()) for p, rs in by_seed.items()}  # means need no order
        base, moving = by["gpuslice"], by["gpuslice + moves"]
        b = mean([r["served_slice_hours"] for r in base])
        m = mean([r["served_slice_hours"] for r in moving])
        gained = mig_bench.gain(by_seed, "gpuslice + moves", "gpuslice")
        gained_before = mig_bench.gain(by_seed, "gpuslice + moves", "gpuslice", W)
        notices = [r["least_notice_s"] for r in moving if r["least_notice_s"] is not None]
        print("| %s | %d | no | %.2f %% | %s | — | — | — | — |" % (pods, speedup, mean([r["acceptance_pct"] for r in base]), format(round(b), ",")))
        print("| %s | %d | yes | %.2f %% | %s | %+.2f %% (%d of %d seeds ≥) | %+.2f %% (%d of %d seeds ≥) | %.1f | %s |" % (pods, speedup,
              mean([r["acceptance_pct"] for r in moving]), format(round(m), ","), *gained, *gained_before,
              1000 * mean([r["moves"] / r["requests"] for r in moving]),
              ("%d min" % (min(notices) // 60)) if notices else "—"), flush=True)
EOF
