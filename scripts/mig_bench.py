"""What the MIG benchmarks share (scripts/bench-mig.sh,
scripts/bench-mig-fleets.sh, scripts/bench-mig-expect.sh): one run of
`gpuslice bench mig`, and one policy's gain over another across its seeds,
with its confidence interval where the seeds are independent streams."""
import json
import math
import subprocess


def run(bin, traces, pods, gpus, speedup, seeds, advance=0, mix="recent", resample=False, jitter_s=0, key=None, causes=False, admit=None):
    """{policy: {seed: result}} for one pod list, fleet size and load;
    `seeds` as `bench mig --seeds` takes it (42 or 42..51), `mix` as
    `bench mig --mix` (recent or stream); `resample` replays a bootstrap
    of the trace per seed (`bench mig --resample`), `jitter_s` moves each
    arrival up to that many seconds later (`bench mig --jitter-s`); `key`
    replays first-fit and that order of ranking terms only (`bench mig
    --key`, named "key ORDER"); `causes` splits refusals by cause
    (`bench mig --causes`); `admit` replays first-fit and the default
    behind that admission rule only (`bench mig --admit`, named
    "gpuslice admit RULE")."""
    out = json.loads(subprocess.check_output([bin, "bench", "mig", "--pods",
        "%s/openb_pod_list_%s.csv" % (traces, pods), "--gpus", str(gpus),
        "--speedup", str(speedup), "--advance", str(advance), "--mix", mix, "--seeds", str(seeds), "--json"]
        + (["--resample"] if resample else [])
        + (["--jitter-s", str(jitter_s)] if jitter_s else [])
        + (["--key", key] if key else [])
        + (["--causes"] if causes else [])
        + (["--admit", admit] if admit else [])))
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
    """`gain`, seed by seed (the same stream for both) and with the
    half-width of its 95 % confidence interval (normal approximation, 1.96
    standard errors) in percent of `base`'s mean, after the gain."""
    pct, wins, n = gain(by, policy, base, key)
    d = [r[key] - by[base][s][key] for s, r in by[policy].items()]
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / max(1, n - 1)
    base_mean = sum(r[key] for r in by[base].values()) / n
    return pct, 100 * 1.96 * math.sqrt(var / n) / base_mean, wins, n
