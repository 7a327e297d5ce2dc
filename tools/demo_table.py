"""
The commands behind docs/experiments.md's table for configs/demo.py: three warm starts (seeds 1337, 2, 3: data and
initialisation), and from each two RL seeds of GRPO and of every baseline, at the same samples per step.

    python tools/demo_table.py                      # runs what out/demo_table lacks (2 jobs at a time), then the table
    python tools/demo_table.py --summary            # the table of the runs already there

Per warm start s: `python train.py configs/demo.py --seed=s` (the default command: warm start, then GRPO with RL seed
s); then from its sft.pt, with --data_seed=s, GRPO with RL seed s+1 and each baseline with RL seeds s and s+1:
configs/demo_rft.py (RFT), demo_sft_answers.py (answers-only SFT), demo_sft_more.py (more warm start) and
demo_random.py (GRPO on a coin, its rate GRPO's training accuracy over its first 10 steps from that warm start) and
demo_ppo.py (PPO with a learned critic, one completion of each of 64 questions a step: GRPO's 64 completions), and
again with GRPO's very questions, 8 completions of each of 8 (ppo_group: no group baseline, the critic's values).
Every run uses one thread (two run side by side); the demo's result is the same on one or two. Each run's wall seconds
and peak resident memory are kept beside it (OUT_DIR.time, by GNU time where /usr/bin/time is).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from records import read_log as read  # noqa: E402  (the library's modules, from tools/)
BASELINES = {"rft": "demo_rft.py", "sft_answers": "demo_sft_answers.py", "sft_more": "demo_sft_more.py",
             "random": "demo_random.py", "ppo": "demo_ppo.py", "ppo_group": "demo_ppo.py"}
# ppo_group: PPO's critic on GRPO's very questions, 8 completions of each of 8, with no group baseline
EXTRA = {"ppo_group": ["--group_size=8", "--prompts_per_step=8"]}
METHODS = ("grpo", "ppo", "ppo_group", "rft", "sft_answers", "sft_more", "random")
TIME = shutil.which("time") and "/usr/bin/time"  # GNU time: a run's wall seconds and peak resident memory


def finished(out_dir: str, steps: int) -> bool:
    evals = read(os.path.join(out_dir, "eval.jsonl"))
    return bool(evals) and evals[-1]["step"] == steps


def run(command: list[str], out_dir: str, config: str = "configs/demo.py", steps: int = 60):
    """train.py config *command into out_dir on one thread (its output in out_dir.log), unless a finished run of
    `steps` steps is there."""
    if finished(out_dir, steps):
        return
    timed = [TIME, "-f", "%e %M", "-o", out_dir + ".time"] if TIME and os.path.exists(TIME) else []
    with open(out_dir + ".log", "w") as log:
        code = subprocess.run(timed + [sys.executable, "train.py", config, *command, "--threads=1",
                                       f"--out_dir={out_dir}", "--overwrite"], cwd=ROOT, stdout=log,
                              stderr=subprocess.STDOUT).returncode
    if code:
        raise RuntimeError(f"{' '.join(command)} exited {code}; see {out_dir}.log")


def cost(out_dir: str) -> tuple[float, float] | None:
    """A run's wall seconds and peak resident memory in MB (OUT_DIR.time, from GNU time), or None
    (no such file, or an empty one: a run stopped before GNU time wrote it)."""
    path = out_dir + ".time"
    words = open(path).read().split() if os.path.exists(path) else []
    if len(words) < 2:
        return None
    return float(words[-2]), float(words[-1]) / 1024


def cell(values, scale=1.0, digits=1) -> str:
    """mean ± standard error (min..max) of values, times scale."""
    values = [v * scale for v in values]
    stderr = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{digits}f} ± {stderr:.{digits}f} ({min(values):.{digits}f}..{max(values):.{digits}f})"


def early_accuracy(out_dir: str) -> float:
    """GRPO's mean training accuracy over its first 10 steps: the random-reward control's rate."""
    return statistics.fmean(r["accuracy"] for r in read(os.path.join(out_dir, "log.jsonl"))[:10])


def run_all(out: str, seeds: list[int], jobs: int, methods: tuple = METHODS):
    """Every run of the table (of `methods` only, the warm starts always), jobs at a time."""
    os.makedirs(out, exist_ok=True)
    with ThreadPoolExecutor(jobs) as pool:  # the warm starts (each followed by GRPO with RL seed s)
        list(pool.map(lambda s: run([f"--seed={s}"], os.path.join(out, f"w{s}_grpo_{s}")), seeds))
    work = []
    for s in seeds:
        warm = [f"--init_from={os.path.join(out, f'w{s}_grpo_{s}', 'sft.pt')}", f"--data_seed={s}"]
        if "grpo" in methods:
            work.append((warm + [f"--seed={s + 1}"], os.path.join(out, f"w{s}_grpo_{s + 1}")))
        rate = round(early_accuracy(os.path.join(out, f"w{s}_grpo_{s}")), 3)
        for method, overlay in [(m, o) for m, o in BASELINES.items() if m in methods]:
            extra = ([f"--random_reward={rate}"] if method == "random" else []) + EXTRA.get(method, [])
            for rl_seed in (s, s + 1):
                work.append(([os.path.join("configs", overlay)] + warm + [f"--seed={rl_seed}"] + extra,
                             os.path.join(out, f"w{s}_{method}_{rl_seed}")))
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda job: run(*job), work))


def summary(out: str, seeds: list[int]) -> str:
    """Per method over every (warm start, RL seed): held-out pass@1 at the first and last evaluation and its gain,
    the mean response length and worked share of the first and last 10 steps (sampled methods), mean ± standard
    error over the runs, and min..max."""
    rows = ["| method | runs | held-out pass@1 at step 0 (%) | at step 60 (%) | gain (points) | response length, first 10 steps -> last 10 | ratio | worked share, first 10 -> last 10 | run seconds, peak MB (from sft.pt) |",
            "|---|---|---|---|---|---|---|---|---|"]
    per_run = []
    for method in METHODS:
        first, last, gain, length0, length1, ratio, worked0, worked1, costs = ([] for _ in range(9))
        for s in seeds:
            for rl_seed in (s, s + 1):
                out_dir = os.path.join(out, f"w{s}_{method}_{rl_seed}")
                if not finished(out_dir, 60):  # absent, or stopped before its last evaluation
                    continue
                evals, log = read(os.path.join(out_dir, "eval.jsonl")), read(os.path.join(out_dir, "log.jsonl"))
                if cost(out_dir) and (method, rl_seed) != ("grpo", s):  # that one trains its warm start too
                    costs.append(cost(out_dir))
                first.append(evals[0]["pass@1"])
                last.append(evals[-1]["pass@1"])
                gain.append(evals[-1]["pass@1"] - evals[0]["pass@1"])
                row = {"method": method, "warm": s, "rl_seed": rl_seed, "pass@1": [e["pass@1"] for e in evals]}
                if log and "response_length" in log[0]:
                    length0.append(statistics.fmean(r["response_length"] for r in log[:10]))
                    length1.append(statistics.fmean(r["response_length"] for r in log[-10:]))
                    ratio.append(length1[-1] / length0[-1])
                    worked0.append(statistics.fmean(r["worked_rate"] for r in log[:10]))
                    worked1.append(statistics.fmean(r["worked_rate"] for r in log[-10:]))
                    row.update(length=(round(length0[-1], 1), round(length1[-1], 1)))
                per_run.append(row)
        if not first:
            continue
        sampled = bool(length0)
        spent = (f" {cell([c[0] for c in costs], digits=0)}, {cell([c[1] for c in costs], digits=0)} |" if costs
                 else " |")
        rows.append(f"| {method} | {len(first)} | {cell(first, 100)} | {cell(last, 100)} | {cell(gain, 100)} | "
                    + (f"{cell(length0)} -> {cell(length1)} | {cell(ratio, digits=2)} | "
                       f"{cell(worked0, digits=2)} -> {cell(worked1, digits=2)} |" if sampled else "no samples | | |")
                    + spent)
    runs = ["", "| method | warm start | RL seed | held-out pass@1 (%) at steps 0, 20, 40, 60 | response length first 10 -> last 10 |",
            "|---|---|---|---|---|"] + [
        f"| {r['method']} | {r['warm']} | {r['rl_seed']} | {', '.join(f'{100 * p:.1f}' for p in r['pass@1'])} | "
        f"{' -> '.join(map(str, r['length'])) if 'length' in r else ''} |" for r in per_run]
    return "\n".join(rows + runs)


def table_main(doc: str, out_name: str, run_all, summary):
    """A table script's command line: run_all(out, seeds, jobs) unless --summary, then print summary(out, seeds)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(ROOT, "out", out_name))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1337, 2, 3], help="warm-start seeds")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    parser.add_argument("--summary", action="store_true", help="only print the tables of the runs already there")
    parser.add_argument("--methods", default="", help="comma-separated: run only these methods' runs (default: all)")
    args = parser.parse_args()
    if not args.summary:
        methods = tuple(m for m in args.methods.split(",") if m)
        run_all(args.out, args.seeds, args.jobs, *([methods] if methods else []))
    print(summary(args.out, args.seeds))


if __name__ == "__main__":
    table_main(__doc__, "demo_table", run_all, summary)
