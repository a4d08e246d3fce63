"""What the MIG benchmarks share (scripts/bench-mig.sh,
scripts/bench-mig-fleets.sh): one run of `gpuslice bench mig`, and one
policy's gain over another across its seeds."""
import json
import math
import subprocess


def run(bin, traces, pods, gpus, speedup, seeds, advance=0, mix="recent", resample=False):
    """{policy: {seed: result}} for one pod list, fleet size and load;
    `seeds` as `bench mig --seeds` takes it (42 or 42..51), `mix` as
    `bench mig --mix` (recent or stream); `resample` replays a bootstrap
    of the trace per seed (`bench mig --resample`)."""
    out = json.loads(subprocess.check_output([bin, "bench", "mig", "--pods",
        "%s/openb_pod_list_%s.csv" % (traces, pods), "--gpus", str(gpus),
        "--speedup", str(speedup), "--advance", str(advance), "--mix", mix, "--seeds", str(seeds), "--json"]
        + (["--resample"] if resample else [])))
    by = {}
    for r in out:
        by.setdefault(r["result"]["policy"], {})[r["seed"]] = r["result"]
    return by


def gain(by, policy, base, key="served_slice_hours"):
    """`policy` against `base` over the seeds of `by`: the mean of `key`
    (served slice-hours unless told) in percent above `base`'s, the seeds
    on which it was at least `base`'s, and the number of seeds."""
    mean = lambda p: sum(r[key] for r in by[p].values()) / len(by[p])
    wins = sum(1 for s, r in by[policy].items() if r[key] >= by[base][s][key])
    return 100 * (mean(policy) / mean(base) - 1), wins, len(by[policy])


def paired(by, policy, base, key="served_slice_hours"):
    """`policy` against `base`, seed by seed (the same stream for both):
    the mean difference in percent of `base`'s mean, the half-width of its
    95 % confidence interval (normal approximation, 1.96 standard errors),
    and the seeds on which `policy` was at least `base`'s, of how many."""
    seeds = sorted(by[base])
    d = [by[policy][s][key] - by[base][s][key] for s in seeds]
    m = sum(by[base][s][key] for s in seeds) / len(seeds)
    mean = sum(d) / len(d)
    var = sum((x - mean) ** 2 for x in d) / max(1, len(d) - 1)
    half = 1.96 * math.sqrt(var / len(d))
    return 100 * mean / m, 100 * half / m, sum(1 for x in d if x >= 0), len(d)
