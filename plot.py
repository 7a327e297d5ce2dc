"""
Curves of a train.py run against step, as one PNG: training reward and accuracy, held-out pass@1, response length,
KL to the reference, the shares of worked answers (rewards.shows_work) and of re-checking ones (rewards.reflects,
reflect_rate) and entropy.

    python plot.py out/demo                                        # writes out/demo/curves.png
    python plot.py out/demo_grpo out/demo_rft --out compare.png    # several runs on one figure, a colour each

Reads OUT_DIR/log.jsonl (one line per step) and OUT_DIR/eval.jsonl (one line per held-out evaluation).
Needs matplotlib (`pip install matplotlib`); train.py calls this at the end of a run when it is installed.
"""
import argparse
import os

from data import load_jsonl


def read_log(path: str) -> list[dict]:
    """The records of a run's JSONL log, [] if the run has not written it."""
    return load_jsonl(path, required_keys=("step",)) if os.path.isfile(path) else []


def trailing_mean(values: list[float], window: int) -> list[float]:
    """values[i] -> mean of values[i - window + 1 .. i] (fewer at the start)."""
    chunks = (values[max(0, i + 1 - window):i + 1] for i in range(len(values)))
    return [sum(chunk) / len(chunk) for chunk in chunks]


def plot_runs(out_dirs: list[str], path: str = "") -> str:
    """Draw the runs in out_dirs on one figure at path (default: the one run's out_dir/curves.png); returns the path.
    One run draws every series; several draw each panel's first series per run, labelled by the run's directory."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plot.py needs matplotlib: pip install matplotlib") from None
    if not out_dirs or (len(out_dirs) > 1 and not path):
        raise ValueError("give one run's out_dir, or several and the path of the figure (--out PATH)")
    runs = []
    for out_dir in out_dirs:
        log, evals = read_log(os.path.join(out_dir, "log.jsonl")), read_log(os.path.join(out_dir, "eval.jsonl"))
        if not log and not evals:
            raise FileNotFoundError(f"no log.jsonl or eval.jsonl in {out_dir}: is it a train.py out_dir?")
        runs.append((os.path.normpath(out_dir), log, evals))

    def series(rows, key):
        points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        return [s for s, _ in points], [v for _, v in points]

    fig, axes = plt.subplots(2, 4, figsize=(20, 7), sharex=True)
    panels = [(axes[0, 0], "train reward", [("log", "accuracy", "correctness"), ("log", "reward", "total")]),
              (axes[0, 1], "held-out pass@1 (greedy)", [("evals", "pass@1", "pass@1")]),
              (axes[0, 2], "response length (tokens)", [("log", "response_length", "mean"),
                                                        ("log", "response_length_max", "max")]),
              (axes[0, 3], "KL to reference (k3)", [("log", "kl", "kl")]),
              (axes[1, 0], "share of worked answers", [("log", "worked_rate", "sampled"),
                                                       ("evals", "worked_rate", "held-out, greedy")]),
              (axes[1, 1], "share re-checking (reflect_rate)", [("log", "reflect_rate", "sampled"),
                                                                ("evals", "reflect_rate", "held-out, greedy")]),
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
                # one step is one small batch: draw it faint, and a trailing mean over ~1/20 of the run on top
                line, = ax.plot(steps, values, alpha=0.25, **style)
                window = max(1, len(values) // 20)
                ax.plot(steps, trailing_mean(values, window), color=line.get_color(),
                        label=label if several else f"{label} (mean of {window})")
        ax.set_title(title + (f" ({lines[0][2]})" if several and len(lines) > 1 else ""))
        ax.grid(alpha=0.3)
        if not ax.lines:  # e.g. no KL when beta = 0, no reward for a supervised baseline
            ax.text(0.5, 0.5, "not in this run's logs", ha="center", va="center", transform=ax.transAxes)
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
    """Draw the run in out_dir to path (default out_dir/curves.png); returns the path, or "" for a run that has
    logged nothing yet (no figure)."""
    if not any(read_log(os.path.join(out_dir, name)) for name in ("log.jsonl", "eval.jsonl")):
        return ""
    return plot_runs([out_dir], path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dirs", nargs="+", help="train.py out_dir(s)")
    parser.add_argument("--out", default="", help="the figure's path (needed for several runs)")
    args = parser.parse_args()
    try:
        print(plot_runs(args.out_dirs, args.out))
    except ValueError as error:  # several runs without --out
        parser.error(str(error))
