"""What the replay benchmarks share (scripts/bench-replay-all.sh,
scripts/bench-replay-draws.sh): FGD's published means and one run of
`gpuslice bench replay`."""
import csv
import json
import os
import subprocess


def published_means(traces):
    """{(workload, policy): mean GPU allocation at 130 % over seeds 42..51}
    from fgd-expected/analysis_allo_discrete.csv; workload without the
    `openb_pod_list_` prefix, policy without its `NN-` order prefix."""
    runs = {}
    with open(os.path.join(traces, "fgd-expected", "analysis_allo_discrete.csv")) as f:
        for r in csv.DictReader(f):
            if 42 <= int(r["seed"]) <= 51:
                key = (r["workload"].replace("openb_pod_list_", ""), r["sc_policy"][3:])
                runs.setdefault(key, []).append(float(r["130"]))
    return {k: sum(v) / len(v) for k, v in runs.items()}


def replay(binary, traces, pods, policies, seeds):
    """{policy: mean allocation at 130 %} of `pods` on the GPU nodes."""
    out = json.loads(subprocess.check_output([binary, "bench", "replay", "--nodes", os.path.join(traces, "openb_node_list_gpu_node.csv"),
                                              "--pods", pods, "--policy", ",".join(policies), "--seeds", seeds, "--json"]))
    return {p["policy"]: p["allocation_pct_at_130"] for p in (out if isinstance(out, list) else [out])}
