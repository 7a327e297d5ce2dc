"""
What a run records, and where: the step's metrics, computed by the loop from what a step returns
(step_record: every function of METRICS over the step's samples, then the step's own figures), the
sample completions it shows, the progress bar's figures; the Tracker that writes them
(out_dir/log.jsonl, eval.jsonl, samples.jsonl, Weights & Biases and TensorBoard when a config asks);
and the curves drawn from the logs (plot_runs, out_dir/curves.png at a run's end). Nothing here runs
inside a step.

    python records.py out/demo                                        # writes out/demo/curves.png
    python records.py out/demo_grpo out/demo_rft --out compare.png    # several runs, a colour each

The curves need matplotlib (`pip install matplotlib`); train.py draws them at the end of a run when
it is installed. Where to add a logged metric: a function in METRICS; a yes/no property of a
completion, logged as its rate: an entry of completion_flags.
"""
import argparse
import json
import math
import numbers
import os
import statistics

import torch
from tqdm import tqdm

from config import installed
from data import load_jsonl
from distributed import all_samples, rank
from grpo import zero_std_group_fraction
from rewards import REFLECTION_MARKERS, reflects, reward_log_name, shows_work
from rollout import Samples

# -----------------------------------------------------------------------------
# the step's metrics: step_record runs every function of METRICS on the step's samples (every rank's
# rows), then adds what the post-sampling stage reported and the step's own figures; GRPO and the
# baselines log through it


def completion_flags(template, reflection_markers: tuple = REFLECTION_MARKERS) -> dict:
    """{name: flag(text) -> bool} for a template.Template: worked (rewards.shows_work: an arithmetic
    claim before the think close tag) and reflect (rewards.reflects: a re-check phrase of
    reflection_markers there). Each is logged as <name>_rate, and eval.py reports the accuracy of
    the completions with and without it."""
    return {"worked": lambda text: shows_work(text, template),
            "reflect": lambda text: reflects(text, template, reflection_markers)}


def reward_metrics(samples: Samples, cfg, template) -> dict:
    """The mean reward, and of each component: the rewards cfg weighs (by their log names) and the
    shaping terms."""
    means = {"reward": statistics.fmean(samples.rewards)}
    for name, values in samples.components.items():
        if name in cfg.reward_weights:
            means[f"reward_{reward_log_name(name)}"] = statistics.fmean(values)
    # the rules are measured at weight 0 too: not logged then
    for name, values in samples.components.items():
        if name not in cfg.reward_weights and name not in ("correctness", "format"):
            means[f"reward_{name}"] = statistics.fmean(values)
    if samples.claims:
        means["process_reward"] = statistics.fmean(r for claims in samples.claims
                                                   for _, r in claims)
    return means


def accuracy_metrics(samples: Samples, cfg, template) -> dict:
    """The share of correct completions, and of each completion flag (completion_flags) as
    <name>_rate."""
    flags = completion_flags(template, cfg.reflection_markers)
    rates = {f"{name}_rate": statistics.fmean(map(flag, samples.texts))
             for name, flag in flags.items()}
    return {"accuracy": statistics.fmean(samples.components["correctness"]), **rates}


def length_metrics(samples: Samples, cfg, template) -> dict:
    """Response lengths in tokens (mean, max) and the share cut at max_new_tokens."""
    lengths = samples.lengths
    return {"response_length": statistics.fmean(lengths), "response_length_max": max(lengths),
            "truncation_rate": 1 - statistics.fmean(samples.stopped)}


def speed_metrics(samples: Samples, cfg, template) -> dict:
    """Sampling speed, the seconds spent sampling and scoring, and on a GPU whether each fast path
    asked for decoded the rollout (<key>_ran 1) or not (0: it fell back, sample.py said why, or it
    does not apply)."""
    ran = {f"{key}_ran": int(used) for key, used in samples.fast_paths.items()}
    return {"tokens_per_s": sum(samples.lengths) / samples.seconds_sampling,
            "time_sample": samples.seconds_sampling, "time_reward": samples.seconds_scoring, **ran}


def group_metrics(samples: Samples, cfg, template) -> dict:
    """The share of groups whose rewards are all equal (they carry no signal); none for groups of
    one (classic PPO)."""
    if cfg.group_size == 1:
        return {}
    rewards = torch.tensor(samples.rewards)
    return {"zero_std_frac": zero_std_group_fraction(rewards, cfg.group_size).item()}


METRICS = (reward_metrics, accuracy_metrics, length_metrics, speed_metrics, group_metrics)


def step_record(step: int, samples: Samples | None, stats: dict, cfg, template) -> dict:
    """The log record of a step: {"step"}, then METRICS of every rank's samples (a collective under
    torchrun; None: a step that sampled nothing, the SFT baselines), samples.stats, and the step's
    own stats. A value that is not a finite number (a reward function's nan, say) is a
    FloatingPointError naming it: the log holds numbers only. template: the run's
    template.Template (completion_flags reads its tags)."""
    record = {"step": step}
    if samples is not None:
        samples = all_samples(samples)
        for metric in METRICS:
            record.update(metric(samples, cfg, template))
        record.update(samples.stats)
    record.update(stats)
    bad = {key: value for key, value in record.items()
           if isinstance(value, float) and not math.isfinite(value)}
    if bad:
        raise FloatingPointError(f"the step's {', '.join(f'{k} is {v}' for k, v in bad.items())}")
    return record


def progress(record: dict, keys: tuple) -> dict:
    """The progress bar's figures: the keys (cfg.progress_keys) that the record holds, each to 4
    significant digits."""
    return {key: f"{record[key]:.4g}" for key in keys if record.get(key) is not None}


def shown_samples(problems: list[dict], step: int, samples: Samples | None, G: int) -> list[dict]:
    """The first completion of the step's first two groups, for samples.jsonl (none for a step that
    sampled none)."""
    if samples is None:
        return []
    return [{"step": step, "question": problems[samples.problems[row]]["question"],
             "gold": problems[samples.problems[row]]["gold"], "completion": samples.texts[row],
             "reward": samples.rewards[row]} for row in range(0, min(2 * G, len(samples.texts)), G)]


# -----------------------------------------------------------------------------
# where the records go


class Tracker:
    """Where a run's records go: out_dir/log.jsonl (a line per step), eval.jsonl (a line per
    held-out evaluation) and samples.jsonl (a few completions every sample_every steps), and, when a
    config asks, Weights & Biases (wandb_project = "NAME"; WANDB_MODE=offline logs with no network)
    and TensorBoard (tensorboard = True, out_dir/tb); at a clean end, out_dir/curves.png (plot_run,
    when matplotlib is installed). Only rank 0 writes."""

    def __init__(self, cfg, run_id: str, step: int = 0):
        """run_id: the run's own id (kept in its checkpoints), so a resumed run goes on in the same
        wandb run; step: the step it resumes from. TensorBoard drops its points after that step
        (they are about to be redone); wandb keeps them and ignores the redone steps, so after a
        crash between checkpoints its curves show the abandoned attempt there (log.jsonl, eval.jsonl
        and TensorBoard show the redone steps)."""
        self.out_dir = cfg.out_dir
        self.wandb = None
        self.tensorboard = None
        if rank() != 0:
            return
        if cfg.wandb_project:
            import wandb
            self.wandb = wandb.init(project=cfg.wandb_project,
                                    name=os.path.basename(os.path.normpath(cfg.out_dir)),
                                    id=run_id, resume="allow", config=vars(cfg), dir=cfg.out_dir)
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.tensorboard = SummaryWriter(os.path.join(cfg.out_dir, "tb"),
                                             purge_step=step + 1 if step else None)

    def log(self, record: dict, file: str = "log.jsonl"):
        """Append record ({"step": N, ...}) to out_dir/file, and its numbers to the trackers, under
        "train/" for log.jsonl and "eval/" for eval.jsonl."""
        if rank() != 0:
            return
        with open(os.path.join(self.out_dir, file), "a") as f:
            f.write(json.dumps(record) + "\n")
        prefix = "eval/" if file == "eval.jsonl" else "train/"
        numbers_only = {prefix + k: v for k, v in record.items()
                        if k != "step" and isinstance(v, numbers.Real)}
        if self.wandb is not None:
            self.wandb.log(numbers_only, step=record["step"])
        if self.tensorboard is not None:
            for key, value in numbers_only.items():
                self.tensorboard.add_scalar(key, value, record["step"])

    def samples(self, shown: list[dict]):
        """Append a step's sample completions ({"step", "question", "gold", "completion", "reward"})
        to out_dir/samples.jsonl and print the first."""
        if rank() != 0 or not shown:
            return
        with open(os.path.join(self.out_dir, "samples.jsonl"), "a") as f:
            f.writelines(json.dumps(s) + "\n" for s in shown)
        tqdm.write(f"step {shown[0]['step']} sample (reward {shown[0]['reward']:.2f}, gold "
                   f"{shown[0]['gold']}): {shown[0]['completion'][:300]!r}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.wandb is not None:
            # a crashed run shows as failed
            self.wandb.finish(exit_code=1 if exc[0] is not None else 0)
        if self.tensorboard is not None:
            self.tensorboard.close()
        # the curves: optional, a bonus
        if exc[0] is None and rank() == 0 and installed("matplotlib"):
            if path := plot_run(self.out_dir):
                tqdm.write(f"curves: {path}")


# -----------------------------------------------------------------------------
# the curves


def read_log(path: str) -> list[dict]:
    """The records of a run's JSONL log, [] if the run has not written it."""
    return load_jsonl(path, required_keys=("step",)) if os.path.isfile(path) else []


def trailing_mean(values: list[float], window: int) -> list[float]:
    """values[i] -> mean of values[i - window + 1 .. i] (fewer at the start)."""
    chunks = (values[max(0, i + 1 - window):i + 1] for i in range(len(values)))
    return [sum(chunk) / len(chunk) for chunk in chunks]


def plot_runs(out_dirs: list[str], path: str = "") -> str:
    """Draw the runs in out_dirs on one figure at path (default: the one run's out_dir/curves.png);
    returns the path. One run draws every series; several draw each panel's first series per run,
    labelled by the run's directory."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("the curves need matplotlib: pip install matplotlib") from None
    if not out_dirs or (len(out_dirs) > 1 and not path):
        raise ValueError("give one run's out_dir, or several and the path of the figure (--out "
                         "PATH)")
    runs = []
    for out_dir in out_dirs:
        log = read_log(os.path.join(out_dir, "log.jsonl"))
        evals = read_log(os.path.join(out_dir, "eval.jsonl"))
        if not log and not evals:
            raise FileNotFoundError(f"no log.jsonl or eval.jsonl in {out_dir}: is it a train.py "
                                    "out_dir?")
        runs.append((os.path.normpath(out_dir), log, evals))

    def series(rows, key):
        points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        return [s for s, _ in points], [v for _, v in points]

    fig, axes = plt.subplots(2, 4, figsize=(20, 7), sharex=True)
    panels = [  # (axes, title, [(log or evals, key, label), ...])
        (axes[0, 0], "train reward", [("log", "accuracy", "correctness"),
                                      ("log", "reward", "total")]),
        (axes[0, 1], "held-out pass@1 (greedy)", [("evals", "pass@1", "pass@1")]),
        (axes[0, 2], "response length (tokens)", [("log", "response_length", "mean"),
                                                  ("log", "response_length_max", "max")]),
        (axes[0, 3], "KL to reference (k3)", [("log", "kl", "kl")]),
        (axes[1, 0], "share of worked answers", [("log", "worked_rate", "sampled"),
                                                 ("evals", "worked_rate", "held-out, greedy")]),
        (axes[1, 1], "share re-checking (reflect_rate)",
         [("log", "reflect_rate", "sampled"), ("evals", "reflect_rate", "held-out, greedy")]),
        (axes[1, 2], "entropy (nats / token)", [("log", "entropy", "entropy")])]
    axes[1, 3].axis("off")
    several = len(runs) > 1
    for ax, title, lines in panels:
        for colour, (name, log, evals) in enumerate(runs):
            for source, key, label in lines[:1] if several else lines:
                steps, values = series(evals if source == "evals" else log, key)
                if not steps:
                    continue
                label, style = (name, {"color": f"C{colour}"}) if several else (label, {})
                if source == "evals":
                    ax.plot(steps, values, marker="o", markersize=4, label=label, **style)
                    continue
                # one step is one small batch: draw it faint, and a trailing mean over ~1/20 of the
                # run on top
                line, = ax.plot(steps, values, alpha=0.25, **style)
                window = max(1, len(values) // 20)
                ax.plot(steps, trailing_mean(values, window), color=line.get_color(),
                        label=label if several else f"{label} (mean of {window})")
        ax.set_title(title + (f" ({lines[0][2]})" if several and len(lines) > 1 else ""))
        ax.grid(alpha=0.3)
        if not ax.lines:  # e.g. no KL when beta = 0, no reward for a supervised baseline
            ax.text(0.5, 0.5, "not in this run's logs", ha="center", va="center",
                    transform=ax.transAxes)
        elif len(lines) > 1 or several:
            ax.legend(fontsize="small")
    for ax in axes[1]:
        ax.set_xlabel("step")
    fig.suptitle(runs[0][0] if not several else "")
    fig.tight_layout()
    path = path or os.path.join(out_dirs[0], "curves.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_run(out_dir: str, path: str = "") -> str:
    """Draw the run in out_dir to path (default out_dir/curves.png); returns the path, or "" for a
    run that has logged nothing yet (no figure)."""
    if not any(read_log(os.path.join(out_dir, name)) for name in ("log.jsonl", "eval.jsonl")):
        return ""
    return plot_runs([out_dir], path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dirs", nargs="+", help="train.py out_dir(s)")
    parser.add_argument("--out", default="", help="the figure's path (needed for several runs)")
    args = parser.parse_args()
    try:
        print(plot_runs(args.out_dirs, args.out))
    except ValueError as error:  # several runs without --out
        parser.error(str(error))
