#!/usr/bin/env python3
"""Builds the thirteen workload variants of FGD's evaluation that are not in
../shared/bench/traces (cpu050/100/200/250, gpushare40/60/80, gpuspec10/20/25,
multigpu20/30/40) from the four pod lists that are, the way the published
lists were made (Alibaba clusterdata, cluster-trace-gpu-v2023/csv: "sampled
from the default one, emphasizing certain types of workloads").

What is known of each family, read off the published files:
- cpuXXX: the default list's 7,064 GPU pods unchanged and in order, after
  K CPU-only pods drawn with replacement from the default's 1,088 CPU-only
  pods. K read from the published files (row of a known GPU pod minus its
  index): cpu050 375, cpu100 789, cpu200 1,768, cpu250 2,356.
- multigpuXX: the default list with extra multi-GPU pods inserted
  (multigpu50: 909 more, 8-GPU 512 / 4-GPU 191 / 2-GPU 206) until multi-GPU
  pods ask for XX % of the GPU demand (50.3 % in multigpu50).
- gpuspecXX: the default list with a GPU-model constraint on XX % of GPU
  pods (gpuspec33: 33.8 %), spread over pod shapes in proportion, the
  constraints drawn as often as gpuspec33 has them.
- gpushareXX: 1,088 CPU-only pods, then 7,064 GPU pods; gpushare100's are all
  GPU-sharing pods from a larger pool than the default list. Built here as
  that many pods of which sharing pods (drawn from gpushare100's) ask for
  XX % of the GPU demand and whole-GPU pods are the default's.

Only the cpu family is reproduced exactly in kind; the others follow the
description above and are approximations (BENCHMARKS.md says which).
Deterministic: each variant has its own seed; DRAW (default 0) picks
another draw of the same recipe, to measure how much a built list's
results depend on the draw (scripts/bench-replay-draws.sh). Usage:
    scripts/build-fgd-variants.py TRACES_DIR OUT_DIR [DRAW]
"""
import csv
import os
import random
import sys

HEADER = ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"]


def load(path):
    with open(path, newline="") as f:
        return [{k: r.get(k, "") or "" for k in HEADER} for r in csv.DictReader(f)]


def write(path, pods):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(HEADER)
        for i, p in enumerate(pods):
            row = dict(p, name="openb-pod-%04d" % i)
            w.writerow([row[k] for k in HEADER])


def gpu_milli(p):
    n = int(p["num_gpu"])
    return 0 if n == 0 else (int(p["gpu_milli"]) if n == 1 else 1000 * n)


def is_share(p):
    return p["num_gpu"] == "1" and int(p["gpu_milli"]) < 1000


def cpu_variant(default, k, rng):
    cpu_only = [p for p in default if p["num_gpu"] == "0"]
    gpu = [p for p in default if p["num_gpu"] != "0"]
    return [rng.choice(cpu_only) for _ in range(k)] + gpu


def multigpu_variant(default, pool, share, rng):
    pods = list(default)
    total = sum(gpu_milli(p) for p in pods)
    multi = sum(gpu_milli(p) for p in pods if int(p["num_gpu"]) > 1)
    while multi / total < share:
        p = rng.choice(pool)
        pods.insert(rng.randrange(len(pods) + 1), p)
        multi += gpu_milli(p)
        total += gpu_milli(p)
    return pods


def gpuspec_variant(default, specs, share, rng):
    gpu_idx = [i for i, p in enumerate(default) if p["num_gpu"] != "0"]
    chosen = set(rng.sample(gpu_idx, round(share * len(gpu_idx))))
    return [dict(p, gpu_spec=rng.choice(specs)) if i in chosen else p for i, p in enumerate(default)]


def gpushare_variant(default, share_pool, share, rng):
    cpu_only = [p for p in default if p["num_gpu"] == "0"]
    whole = [p for p in default if p["num_gpu"] != "0" and not is_share(p)]
    n_gpu = sum(1 for p in default if p["num_gpu"] != "0")
    mean_share = sum(gpu_milli(p) for p in share_pool) / len(share_pool)
    mean_whole = sum(gpu_milli(p) for p in whole) / len(whole)
    # n_s * mean_share / (n_s * mean_share + (n - n_s) * mean_whole) = share
    n_s = round(share * n_gpu * mean_whole / (mean_share * (1 - share) + share * mean_whole))
    gpu = [rng.choice(share_pool) for _ in range(n_s)] + [rng.choice(whole) for _ in range(n_gpu - n_s)]
    rng.shuffle(gpu)
    return cpu_only + gpu


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: build-fgd-variants.py TRACES_DIR OUT_DIR [DRAW]")
    src, out = sys.argv[1], sys.argv[2]
    draw = int(sys.argv[3]) if len(sys.argv) == 4 else 0
    # Draw 0 keeps the seeds BENCHMARKS.md's replay table was measured with.
    rng = lambda name: random.Random(name if draw == 0 else "%s-draw%d" % (name, draw))
    os.makedirs(out, exist_ok=True)
    default = load(os.path.join(src, "openb_pod_list_default.csv"))
    mg50 = load(os.path.join(src, "openb_pod_list_multigpu50.csv"))
    spec33 = load(os.path.join(src, "openb_pod_list_gpuspec33.csv"))
    gs100 = load(os.path.join(src, "openb_pod_list_gpushare100.csv"))
    multi_pool = [p for p in mg50 if int(p["num_gpu"]) > 1]
    specs = [p["gpu_spec"] for p in spec33 if p["gpu_spec"]]
    share_pool = [p for p in gs100 if is_share(p)]
    built = {}
    for name, k in [("cpu050", 375), ("cpu100", 789), ("cpu200", 1768), ("cpu250", 2356)]:
        built[name] = cpu_variant(default, k, rng("fgd-" + name))
    for pct in (20, 30, 40):
        built["multigpu%d" % pct] = multigpu_variant(default, multi_pool, pct / 100, rng("fgd-multigpu%d" % pct))
    for pct in (10, 20, 25):
        built["gpuspec%02d" % pct] = gpuspec_variant(default, specs, pct / 100, rng("fgd-gpuspec%d" % pct))
    for pct in (40, 60, 80):
        built["gpushare%d" % pct] = gpushare_variant(default, share_pool, pct / 100, rng("fgd-gpushare%d" % pct))
    for name, pods in built.items():
        write(os.path.join(out, "openb_pod_list_%s.csv" % name), pods)
        print("%-12s %5d pods" % (name, len(pods)))


if __name__ == "__main__":
    main()
