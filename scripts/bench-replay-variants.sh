#!/usr/bin/env bash
# Checks that gpuslice's replay policy generalises: FGD and gpuslice on
# fleets and seeds the policy was not chosen on (other seeds, the cluster
# with its CPU-only nodes, and three sub-fleets of the GPU nodes), for each
# of the four pod lists of ../shared/bench/traces and the heaviest built list
# of the CPU, sharing and multi-GPU families (scripts/build-fgd-variants.py:
# cpu250, gpushare80, multigpu40). Prints one line per case: fgd, gpuslice,
# difference.
set -euo pipefail
cd "$(dirname "$0")/.."
T=../shared/bench/traces
cargo build --release --quiet
bin=./target/release/gpuslice
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nodes=$T/openb_node_list_gpu_node.csv
# Sub-fleets: every other node (two halves) and every fifth node, in list order.
awk -F, 'NR==1 || NR%2==0' "$nodes" >"$work/half-a.csv"
awk -F, 'NR==1 || NR%2==1' "$nodes" >"$work/half-b.csv"
awk -F, 'NR==1 || NR%5==0' "$nodes" >"$work/fifth.csv"
python3 scripts/build-fgd-variants.py "$T" "$work" >/dev/null
alloc() { # policy nodes pods seeds -> mean allocation at 130 %
    "$bin" bench replay --nodes "$2" --pods "$3" --policy "$1" --seeds "$4" --json |
        python3 -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["allocation_pct_at_130"])'
}
printf '%-12s %-14s %-7s %7s %9s %6s\n' pods fleet seeds fgd gpuslice diff
for pods in default gpushare100 multigpu50 gpuspec33 cpu250 gpushare80 multigpu40; do
    p=$T/openb_pod_list_$pods.csv
    [ -f "$p" ] || p=$work/openb_pod_list_$pods.csv
    for case in "gpu-nodes:$nodes:52..71" "all-nodes:$T/openb_node_list_all_node.csv:42..51" \
        "half-a:$work/half-a.csv:42..51" "half-b:$work/half-b.csv:42..51" "fifth:$work/fifth.csv:42..51"; do
        IFS=: read -r name file seeds <<<"$case"
        f=$(alloc fgd "$file" "$p" "$seeds")
        g=$(alloc gpuslice "$file" "$p" "$seeds")
        printf '%-12s %-14s %-7s %7s %9s %+6.2f\n' "$pods" "$name" "$seeds" "$f" "$g" "$(echo "$g - $f" | bc)"
    done
done
