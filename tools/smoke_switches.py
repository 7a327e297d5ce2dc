"""
Each loss switch on the smoke config (configs/demo.py configs/smoke.py: a short warm start, then 4 GRPO steps of
two updates each) beside the default: its wall seconds, whether every step's loss was finite, and the metric where
its effect shows, averaged over the steps, against the same metric without it (the default run's, or the value the
switch-off loss would log: 1 for policy_token_frac and sapo_gate_mean, 0 for the masked and capped fractions).

    python tools/smoke_switches.py                  # every switch, two runs at a time, then the table
    python tools/smoke_switches.py --only sapo,entropy_coef

The sampler correction's caps are set at 1.0 here: on the CPU the sampler and the trainer compute the same numbers
to ~1e-7 (logprob_gap), so at TRL's cap of 3 nothing would be capped; a bound of 1 shows the mechanism (about half
the tokens lie above it by rounding), not the size of a real correction (a bf16 sampler on a GPU: docs/guide.md).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = ["configs/demo.py", "configs/smoke.py"]
CORRECTION = ["--importance_sampling_correction", "--importance_sampling_clip_max=1.0"]
# name -> (train.py arguments, the metric where its effect shows, the value without it: None for the default run's,
# a name for that switch's run)
SWITCHES = {
    "policy_loss=cispo": (["--policy_loss=cispo"], "clip_frac_high", None),
    "policy_loss=sapo": (["--policy_loss=sapo"], "sapo_gate_mean", 1.0),
    "delta": (["--delta=1.21"], "delta_capped_frac", 0.0),
    "token_truncate": (CORRECTION + ["--importance_sampling_mode=token_truncate"], "tis_capped_frac", 0.0),
    "token_mask": (CORRECTION + ["--importance_sampling_mode=token_mask"], "tis_capped_frac", 0.0),
    "sequence_truncate": (CORRECTION + ["--importance_sampling_mode=sequence_truncate"], "tis_capped_frac", 0.0),
    "sequence_mask": (CORRECTION + ["--importance_sampling_mode=sequence_mask"], "tis_capped_frac", 0.0),
    "off_policy_mask_threshold": (["--off_policy_mask_threshold=0.001"], "off_policy_masked_frac", 0.0),
    "top_entropy_quantile": (["--top_entropy_quantile=0.2"], "policy_token_frac", 1.0),
    "mask_truncated_completions": (["--mask_truncated_completions"], "policy_token_frac", 1.0),
    "entropy_coef": (["--entropy_coef=0.05"], "entropy", None),
    "scale_rewards=batch": (["--scale_rewards=batch"], "grad_norm", None),
    "scale_rewards=none": (["--scale_rewards=none"], "grad_norm", None),
    "policy_loss=vespo": (["--policy_loss=vespo", "--loss_agg=token_mean"], "vespo_phi_mean", 1.0),
    "loss_agg=luspo": (["--importance_sampling_level=sequence", "--loss_agg=luspo"], "grad_norm", None),
    "multi_objective_aggregation=normalize_then_sum": (["--multi_objective_aggregation=normalize_then_sum"],
                                                       "adv_abs_mean", None),
    # a target above the smoke run's entropy (~4 nats): the coefficient climbs from 0 after each update
    "use_adaptive_entropy": (["--use_adaptive_entropy", "--entropy_target=10"], "entropy_coef", 0.0),
    # the reference pulled halfway to the policy after every step: the KL to it stays below a fixed reference's
    "beta=0.04": (["--beta=0.04"], "kl", 0.0),
    "sync_ref_model": (["--beta=0.04", "--sync_ref_model", "--ref_model_sync_steps=1", "--ref_model_mixup_alpha=0.5"],
                       "kl", "beta=0.04"),
}


def run(name: str, args: list[str], out: str) -> dict:
    """train.py on the smoke config with args, into out/name: its log's records and its wall seconds."""
    out_dir = os.path.join(out, name)
    start = time.perf_counter()
    with open(out_dir + ".log", "w") as log:
        code = subprocess.run([sys.executable, "train.py", *CONFIG, *args, f"--out_dir={out_dir}", "--overwrite",
                               "--threads=1"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    if code:
        raise RuntimeError(f"{name}: train.py exited {code}; see {out_dir}.log")
    records = [json.loads(line) for line in open(os.path.join(out_dir, "log.jsonl"))]
    return {"records": records, "seconds": time.perf_counter() - start}


def mean(records: list[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in records)


def table(results: dict) -> str:
    """One row per switch: its arguments, seconds, finite loss, metric, value, the value without it, moved."""
    default = results["default"]["records"]
    rows = ["| switch | arguments | seconds | loss finite | metric | with it | without it | moved |",
            "|---|---|---|---|---|---|---|---|",
            f"| default | | {results['default']['seconds']:.0f} | "
            f"{all(math.isfinite(r['loss']) for r in default)} | | | | |"]
    for name, (args, metric, off) in SWITCHES.items():
        if name not in results:
            continue
        records = results[name]["records"]
        value = mean(records, metric)
        without = mean(default, metric) if off is None else mean(results[off]["records"], metric) \
            if isinstance(off, str) else off
        finite = all(math.isfinite(r["loss"]) for r in records)
        rows.append(f"| {name} | `{' '.join(args)}` | {results[name]['seconds']:.0f} | {finite} | {metric} | "
                    f"{value:.4g} | {without:.4g} | {abs(value - without) > 1e-6} |")
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--only", default="", help="comma-separated switch names (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(SWITCHES)
    unknown = sorted(set(names) - set(SWITCHES))
    if unknown:
        raise SystemExit(f"unknown switch(es) {unknown}; known: {list(SWITCHES)}")
    out = args.out or tempfile.mkdtemp(prefix="smoke_switches_")
    os.makedirs(out, exist_ok=True)
    names += [SWITCHES[n][2] for n in names if isinstance(SWITCHES[n][2], str) and SWITCHES[n][2] not in names]
    jobs = [("default", [])] + [(name, SWITCHES[name][0]) for name in names]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = dict(zip([n for n, _ in jobs], pool.map(lambda job: run(*job, out), jobs)))
    print(table(results))
    return results


if __name__ == "__main__":
    main()
