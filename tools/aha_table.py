"""
The commands behind docs/experiments.md's tables for configs/demo_aha.py (the aha demo): three warm starts (seeds
1337, 2, 3: data and initialisation), GRPO with two RL seeds from each, the baselines and controls from the same
warm starts, and the final models sampled at T=1.

    python tools/aha_table.py                      # runs what out/aha_table lacks (2 jobs at a time), then the tables
    python tools/aha_table.py --summary            # the tables of the runs already there

Per warm start s: `python train.py configs/demo_aha.py --seed=s` (the warm start, then GRPO with RL seed s); then
from its sft.pt, with --data_seed=s: GRPO with RL seed s+1, PPO with a learned critic with RL seeds s and s+1
(configs/demo_ppo.py: one completion of each of 64 questions a step, GRPO's 64), the random-reward control with RL
seeds s and s+1
(--random_reward at GRPO's training accuracy over its first 10 steps from that warm start), and with RL seed s RFT
(--method=rft) and REINFORCE (--adv_baseline=none --adv_scale=none, no baseline). And per seed s a warm start
without any re-check (cue_share and reflect_share 0: the same carry slips, no reflection to amplify), then GRPO.
Each final model and each warm start is then sampled 8 times per held-out question at T=1 (eval.py --n 8 --k 1,8).
Every run uses one thread (two run side by side); each run's wall seconds and peak resident memory are kept beside it
(OUT_DIR.time, by GNU time where /usr/bin/time is).
"""
import json
import os
import runpy
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from demo_table import ROOT, cell, cost, early_accuracy, finished, read, run, table_main  # noqa: E402  (shared)
from records import trailing_mean  # noqa: E402  (demo_table put the repo root on the path)

CONFIG = "configs/demo_aha.py"
SETTINGS = runpy.run_path(os.path.join(ROOT, CONFIG))  # the config's variables
STEPS = SETTINGS["max_steps"]
METHODS = {"grpo": [], "ppo": ["configs/demo_ppo.py"], "rft": ["--method=rft"],
           "reinforce": ["--adv_baseline=none", "--adv_scale=none"], "random": None,
           "no_reflection": []}  # random: --random_reward=rate, per warm start


def no_reflection_args() -> str:
    """configs/demo_aha.py's synthetic_args with no re-check in the warm start (the carry slips stay)."""
    return repr({**SETTINGS["synthetic_args"], "cue_share": 0.0, "reflect_share": 0.0})


def runs(out: str, seeds: list[int]) -> list[tuple[str, int, int, str]]:
    """(method, warm seed, RL seed, out_dir) of every run of the tables, those that train a warm start first."""
    plan = [("grpo", s, s) for s in seeds] + [("no_reflection", s, s) for s in seeds]
    for s in seeds:
        plan += [("grpo", s, s + 1), ("ppo", s, s), ("ppo", s, s + 1), ("random", s, s), ("random", s, s + 1)]
    plan += [(m, s, s) for s in seeds for m in ("rft", "reinforce")]
    return [(m, s, r, os.path.join(out, f"w{s}_{m}_{r}")) for m, s, r in plan]


def trains_warm_start(method: str, s: int, r: int) -> bool:
    """True for the runs that train their own warm start (then GRPO with RL seed s); the others start from one."""
    return s == r and method in ("grpo", "no_reflection")


def run_all(out: str, seeds: list[int], jobs: int, methods: tuple = tuple(METHODS)):
    """Every run of the plan (of `methods` only, the warm starts always), jobs at a time (the warm starts first; a run
    from a warm start waits for it), then the sampled evaluations."""
    os.makedirs(out, exist_ok=True)
    plan = [(m, s, r, d) for m, s, r, d in runs(out, seeds) if m in methods or trains_warm_start(m, s, r)
            and m == "grpo"]

    def job(method, s, r, out_dir):
        if trains_warm_start(method, s, r):
            extra = [f"--synthetic_args={no_reflection_args()}"] if method == "no_reflection" else []
            return run([f"--seed={s}"] + extra, out_dir, config=CONFIG, steps=STEPS)
        warm = os.path.join(out, f"w{s}_grpo_{s}")
        while not finished(warm, STEPS):  # its warm start (and the GRPO run the random control's rate comes from)
            time.sleep(10)
        start = [f"--init_from={os.path.join(warm, 'sft.pt')}", f"--data_seed={s}", f"--seed={r}"]
        extra = [f"--random_reward={round(early_accuracy(warm), 3)}"] if method == "random" else METHODS[method]
        run(start + extra, out_dir, config=CONFIG, steps=STEPS)
    with ThreadPoolExecutor(jobs) as pool:  # runs() lists the warm starts first
        list(pool.map(lambda p: job(*p), plan))
    models = [os.path.join(d, "ckpt.pt") for _, _, _, d in plan] + [  # and the warm starts
        os.path.join(d, "sft.pt") for m, s, r, d in plan if trains_warm_start(m, s, r)]
    with ThreadPoolExecutor(jobs) as pool:  # every final model at T=1, 8 samples per held-out question
        list(pool.map(sample_final, models))


def sample_final(model: str):
    """eval.py at T=1, 8 samples per held-out question, of a run's ckpt.pt or sft.pt (into ckpt_eval/ or sft_eval/)."""
    out_dir, eval_dir = os.path.dirname(model), os.path.splitext(model)[0] + "_eval"  # eval.py's own output dir
    if os.path.exists(os.path.join(eval_dir, "summary.json")):
        return
    with open(eval_dir + ".log", "w") as log:
        code = subprocess.run([sys.executable, "eval.py", "--model", model, "--data",
                               os.path.join(out_dir, "heldout.jsonl"), "--n", "8", "--k", "1,8", "--device", "cpu"],
                              cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}
                              ).returncode
    if code:
        raise RuntimeError(f"eval.py of {model} exited {code}; see {eval_dir}.log")


def take_off(log: list[dict]) -> int | None:
    """The first step at which reflect_rate's mean over the last 10 steps passes 0.5 (None: never)."""
    means = trailing_mean([r["reflect_rate"] for r in log], 10)  # whole windows from the 10th step on
    return next((i + 1 for i in range(9, len(means)) if means[i] > 0.5), None)


def figures(out_dir: str) -> dict | None:
    """A run's figures: held-out greedy pass@1 at each evaluation; reflect_rate, entropy and response length over its
    first and last 10 steps, the length's ratio (last 10 over first 10) and the take-off step; and from the T=1
    sampling of the final model pass@1, pass@8 and the accuracy of reflective and other completions."""
    evals, log = read(os.path.join(out_dir, "eval.jsonl")), read(os.path.join(out_dir, "log.jsonl"))
    if not evals or evals[-1]["step"] != STEPS:
        return None
    mean = statistics.fmean
    out = {"pass@1": [e["pass@1"] for e in evals], "gain": evals[-1]["pass@1"] - evals[0]["pass@1"],
           "take_off": take_off(log),
           **{f"{key}_{part}": mean(r[key] for r in rows) if all(r.get(key) is not None for r in rows) else None
              for key in ("reflect_rate", "entropy", "response_length")  # RFT's supervised update logs no entropy
              for part, rows in (("first", log[:10]), ("last", log[-10:]))}}
    out["length_ratio"] = out["response_length_last"] / out["response_length_first"]
    out["cost"] = cost(out_dir)  # (wall seconds, peak MB)
    for name, prefix in (("ckpt", "T1_"), ("sft", "warm_T1_")):
        path = os.path.join(out_dir, f"{name}_eval", "summary.json")
        if os.path.exists(path):
            with open(path) as f:
                t1 = json.load(f)
            out.update({prefix + key: t1[key] for key in ("pass@1", "pass@8", "reflect_rate", "accuracy_reflect",
                                                           "accuracy_unreflect", "response_length")})
    return out


def summary(out: str, seeds: list[int]) -> str:
    """Per method: mean ± standard error (min..max) over its runs; then one line per run."""
    per_run = [(m, s, r, figures(d)) for m, s, r, d in runs(out, seeds)]
    rows = ["| method | runs | held-out pass@1 (%), first eval -> last | gain (points) | reflect_rate, first 10 "
            f"steps -> last 10 | take-off by step {STEPS} (runs) | length, last 10 steps / first 10 | entropy, first 10 -> "
            "last 10 | T=1 pass@1 (%) | T=1 pass@8 (%) | run seconds, peak MB (from sft.pt) |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for method in METHODS:
        done = [f for m, _, _, f in per_run if m == method and f]
        if not done:
            continue
        get = lambda key: [f[key] for f in done]  # noqa: E731
        t1 = all("T1_pass@1" in f for f in done)
        costs = [f["cost"] for m, s, r, f in per_run if m == method and f and f["cost"]
                 and not trains_warm_start(m, s, r)]
        spent = (f" {cell([c[0] for c in costs], digits=0)}, {cell([c[1] for c in costs], digits=0)} |" if costs
                 else " |")
        rows.append(f"| {method} | {len(done)} | {cell([f['pass@1'][0] for f in done], 100)} -> "
                    f"{cell([f['pass@1'][-1] for f in done], 100)} | {cell(get('gain'), 100)} | "
                    f"{cell(get('reflect_rate_first'), digits=3)} -> {cell(get('reflect_rate_last'), digits=3)} | "
                    f"{sum(t is not None for t in get('take_off'))} of {len(done)} | "
                    f"{cell(get('length_ratio'), digits=2)} | "
                    + (f"{cell(get('entropy_first'), digits=3)} -> {cell(get('entropy_last'), digits=3)} | "
                       if None not in get('entropy_first') else "not logged | ")
                    + (f"{cell(get('T1_pass@1'), 100)} | {cell(get('T1_pass@8'), 100)} |" if t1 else "| |")
                    + spent)

    def accuracy(value):
        return "n/a" if value is None else f"{100 * value:.1f}"
    rows += ["", "| method | warm start | RL seed | held-out pass@1 (%) at each eval | reflect_rate first 10 -> last 10 "
             "| take-off step | length ratio | T=1: reflect_rate, accuracy reflective / other (%) |",
             "|---|---|---|---|---|---|---|---|"]
    for m, s, r, f in per_run:
        if f:
            rows.append(f"| {m} | {s} | {r} | {', '.join(f'{100 * p:.1f}' for p in f['pass@1'])} | "
                        f"{f['reflect_rate_first']:.3f} -> {f['reflect_rate_last']:.3f} | {f['take_off'] or 'never'} | "
                        f"{f['length_ratio']:.2f} | "
                        + (f"{f['T1_reflect_rate']:.3f}, {accuracy(f['T1_accuracy_reflect'])} / "
                           f"{accuracy(f['T1_accuracy_unreflect'])} |" if "T1_pass@1" in f else " |"))
    rows += ["", "| warm start | model | T=1 pass@1 (%) | pass@8 (%) | reflect_rate | accuracy reflective / other (%) "
             "| length |", "|---|---|---|---|---|---|---|"]
    for m, s, r, f in per_run:
        warm = "warm start (sft.pt)" if m == "grpo" else f"its warm start, {m} (sft.pt)"
        for prefix, model in (("warm_T1_", warm), ("T1_", m)):
            if f and prefix + "pass@1" in f and (prefix == "T1_" or s == r):
                rows.append(f"| {s} | {model}{'' if prefix != 'T1_' else f' (RL seed {r})'} | "
                            f"{100 * f[prefix + 'pass@1']:.1f} | {100 * f[prefix + 'pass@8']:.1f} | "
                            f"{f[prefix + 'reflect_rate']:.3f} | {accuracy(f[prefix + 'accuracy_reflect'])} / "
                            f"{accuracy(f[prefix + 'accuracy_unreflect'])} | {f[prefix + 'response_length']:.0f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    table_main(__doc__, "aha_table", run_all, summary)
