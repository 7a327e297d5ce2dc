"""
Curves of a train.py run: reward, held-out pass@1, response length and KL against step, as one PNG.

    python plot.py out/demo            # writes out/demo/curves.png

Reads OUT_DIR/log.jsonl (one line per step) and OUT_DIR/eval.jsonl (one line per held-out evaluation).
Needs matplotlib (`pip install matplotlib`); train.py calls this at the end of a run when it is installed.
"""
import os
import sys

from data import load_jsonl


def read_log(path: str) -> list[dict]:
    """The records of a run's JSONL log, [] if the run has not written it."""
    return load_jsonl(path, required_keys=("step",)) if os.path.isfile(path) else []


def trailing_mean(values: list[float], window: int) -> list[float]:
    """values[i] -> mean of values[i - window + 1 .. i] (fewer at the start)."""
    chunks = (values[max(0, i + 1 - window):i + 1] for i in range(len(values)))
    return [sum(chunk) / len(chunk) for chunk in chunks]


def plot_run(out_dir: str, path: str = "") -> str:
    """Draw the run in out_dir to path (default out_dir/curves.png); returns the path."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plot.py needs matplotlib: pip install matplotlib") from None
    log = read_log(os.path.join(out_dir, "log.jsonl"))
    evals = read_log(os.path.join(out_dir, "eval.jsonl"))
    if not log and not evals:
        raise FileNotFoundError(f"no log.jsonl or eval.jsonl in {out_dir}: is it a train.py out_dir?")

    def series(rows, key):
        points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        return [s for s, _ in points], [v for _, v in points]

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    panels = [(axes[0, 0], "train reward", [(log, "reward", "total"), (log, "accuracy", "correctness")]),
              (axes[0, 1], "held-out pass@1 (greedy)", [(evals, "pass@1", "pass@1")]),
              (axes[1, 0], "response length (tokens)", [(log, "response_length", "mean"),
                                                        (log, "response_length_max", "max")]),
              (axes[1, 1], "KL to reference (k3)", [(log, "kl", "kl")])]
    for ax, title, lines in panels:
        for rows, key, label in lines:
            steps, values = series(rows, key)
            if not steps:
                continue
            if rows is evals:
                ax.plot(steps, values, marker="o", markersize=4, label=label)
                continue
            # one step is one small batch: draw it faint, and a trailing mean over ~1/20 of the run on top
            line, = ax.plot(steps, values, alpha=0.25)
            window = max(1, len(values) // 20)
            ax.plot(steps, trailing_mean(values, window), color=line.get_color(), label=f"{label} (mean of {window})")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if not ax.lines:  # e.g. no KL when beta = 0, no reward for a supervised baseline
            ax.text(0.5, 0.5, "not in this run's logs", ha="center", va="center", transform=ax.transAxes)
        elif len(lines) > 1:
            ax.legend()
    for ax in axes[1]:
        ax.set_xlabel("step")
    fig.suptitle(os.path.normpath(out_dir))
    fig.tight_layout()
    path = path or os.path.join(out_dir, "curves.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python plot.py OUT_DIR")
    print(plot_run(sys.argv[1]))
