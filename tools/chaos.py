"""
Preemption anywhere: stop a small run at random moments in every phase (warm start, rollout, update, evaluation,
checkpoint write, export), alternately by SIGTERM and SIGKILL, restart it with the same command each time, and
check that its final weights and logs (timing fields aside) equal an uninterrupted run's.

    python tools/chaos.py                     # 24 stops, 4 in each phase, on a small demo-shaped run (about 5 min)
    python tools/chaos.py --stops 6 --seed 1  # fewer stops (tests/test_chaos.py runs a tiny version in the suite)
    python tools/chaos.py --same out/a out/b  # only compare two finished runs, as it compares its own

Every attempt runs `python train.py CONFIG --resume --out_dir=DIR` in a child process (`python tools/chaos.py --child
PLAN ...` runs train.py's main with the plan's stop installed): the run's own command, the same each time. A plan
names a phase, which of its entries to stop in (the n-th call of the function that does it), a delay after that
entry and a signal. A stop during a checkpoint write lands between torch.save's writing and the rename; with
SIGKILL the temporary file is cut in half first, as a kill mid-write leaves it.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the library's modules, from tools/
PHASES = ("warm start", "rollout", "update", "evaluation", "checkpoint write", "export")
TIMING = ("time_", "tokens_per_s", "memory_gb")
# the run stopped: a small demo-shaped config (the warm start, GRPO with evaluations and checkpoints, the export)
CONFIG = ["configs/demo.py", "--sft_steps=200", "--sft_checkpoint_every=40", "--max_steps=24", "--eval_every=4",
          "--eval_size=40", "--synthetic_eval_size=40", "--checkpoint_every=4", "--sample_every=4", "--threads=1"]


def install(plan: dict):
    """In the child: stop the run per plan {"phase", "nth", "delay", "signal"} (the n-th entry of the phase's
    function, then after delay seconds, from a timer thread)."""
    import checkpoint
    import eval as evaluation
    import rollout
    import sft
    import torch
    import train
    import update
    number = signal.Signals[plan["signal"]].value
    entries = {phase: 0 for phase in PHASES}

    def later():
        timer = threading.Timer(plan["delay"], os.kill, (os.getpid(), number))
        timer.daemon = True  # a run that ends first is not held up
        timer.start()

    def wrap(module, name, phase):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            entries[phase] += 1
            if phase == plan["phase"] and entries[phase] == plan["nth"]:
                later()
            return real(*args, **kwargs)
        setattr(module, name, wrapper)
    wrap(sft, "sft_loss_backward", "warm start")
    wrap(rollout, "sample_and_score", "rollout")
    wrap(update, "policy_gradient", "update")
    wrap(evaluation, "score_questions", "evaluation")
    wrap(train, "export_hf", "export")
    real_save = torch.save

    def save(obj, path, *args, **kwargs):  # between writing the temporary file and renaming it
        real_save(obj, path, *args, **kwargs)
        entries["checkpoint write"] += 1
        if plan["phase"] == "checkpoint write" and entries["checkpoint write"] == plan["nth"]:
            if number == signal.SIGKILL:
                os.truncate(path, os.path.getsize(path) // 2)
            os.kill(os.getpid(), number)
    checkpoint.torch.save = save


def attempt(args: list, out_dir: str, plan: dict | None) -> tuple[int, bool]:
    """One launch of the run's command (with a stop plan, or none): its exit status (negative: killed), and whether
    a stop reached it (a SIGTERM after the last step stops nothing, but is still handled)."""
    command = [sys.executable, "tools/chaos.py", "--child", json.dumps(plan)] if plan else \
        [sys.executable, "train.py"]
    done = subprocess.run(command + args + ["--resume", f"--out_dir={out_dir}"], cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=1800)
    if done.returncode not in (0, -signal.SIGKILL, -signal.SIGTERM, 128 + signal.SIGTERM):
        raise RuntimeError(f"the run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return done.returncode, done.returncode != 0 or "stopping after the current step" in done.stdout


def records(path: str, keys=None) -> list[dict]:
    """A JSONL log's records, timing fields aside (and, given keys, those keys alone)."""
    with open(path) as f:
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMING) and (keys is None or k in keys)}
                for line in f]


def same_tensors(x, y) -> bool:
    """Whether x and y (nested dicts of tensors, or values) hold the same keys and the same values bit for bit: a model
    of another size or an optimizer over other parameters differs, it does not fail."""
    import torch
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(same_tensors(x[k], y[k]) for k in x)
    if torch.is_tensor(x):
        return torch.is_tensor(y) and x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
    return x == y


def same_run(a: str, b: str, new_keys: bool = False, nulls_dropped: bool = False) -> list[str]:
    """What differs between two finished runs in out_dirs a and b: every JSONL log (the step logs, the evaluations'
    completions, the samples; timing fields aside; new_keys: b may log keys a does not, as newer code does;
    nulls_dropped: a key logged as null counts as left out, in either, as code that logs numbers only leaves it out), the checkpoint's
    weights, reference, AdamW state, data order and step, the warm start's weights, the export."""
    import torch
    differ = []
    for name in sorted(n for n in os.listdir(a) if n.endswith(".jsonl")):
        mine = records(os.path.join(a, name))
        theirs = records(os.path.join(b, name), {k for r in mine for k in r} if new_keys else None) \
            if os.path.exists(os.path.join(b, name)) else None
        if nulls_dropped and theirs is not None:
            mine, theirs = ([{k: v for k, v in r.items() if v is not None} for r in log] for log in (mine, theirs))
        if mine != theirs:
            differ.append(name)
    for name in ("ckpt.pt", "sft.pt"):
        if not os.path.exists(os.path.join(a, name)):
            continue
        if not os.path.exists(os.path.join(b, name)):
            differ.append(name)
            continue
        x, y = (torch.load(os.path.join(d, name), weights_only=True) for d in (a, b))
        parts = [(x.get(part), y.get(part)) for part in ("model", "reference", "stream", "step")] + \
            [(x.get("optimizer", {}).get("state"), y.get("optimizer", {}).get("state"))]
        if not all(same_tensors(mine, theirs) for mine, theirs in parts):
            differ.append(name)
    if os.path.isdir(os.path.join(a, "hf")) and not os.path.isfile(os.path.join(b, "hf", "model.safetensors")):
        differ.append("hf/")
    return differ


def remaining(args: list, out_dir: str) -> dict:
    """How many times each phase's function runs in the next launch of the run, from what it saved so far."""
    import torch
    from config import load_config
    cfg = load_config(args + [f"--out_dir={out_dir}"])
    path = os.path.join(out_dir, "ckpt.pt")
    state = torch.load(path, weights_only=True) if os.path.exists(path) else {"phase": "warm_start", "warm_step": 0,
                                                                               "step": 0}
    warm = cfg.sft_steps - state["warm_step"] if state.get("phase") == "warm_start" else 0
    step, every = state["step"], cfg.checkpoint_every or cfg.max_steps
    evals = sum(s % cfg.eval_every == 0 or s == cfg.max_steps for s in range(step + 1, cfg.max_steps + 1))
    saves = (sum(s % cfg.sft_checkpoint_every == 0 for s in range(cfg.sft_steps - warm + 1, cfg.sft_steps + 1))
             + 2 * (warm > 0) + sum(s % every == 0 or s == cfg.max_steps for s in range(step + 1, cfg.max_steps + 1)))
    return {"warm start": warm, "rollout": cfg.max_steps - step, "update": cfg.max_steps - step,
            "evaluation": evals + (step == 0), "checkpoint write": saves, "export": 1}


def schedule(stops: int) -> list[tuple[str, int]]:
    """The phases of `stops` stops, in the order the run meets them: the warm start's, then the RL steps' phases in
    turn (rollout, update, evaluation, checkpoint write), then the export's, an equal share each; with each its
    group's number of stops still to come after it (a stop in the warm start cannot come after it has ended)."""
    each = max(stops // len(PHASES), 1)
    groups = [["warm start"] * each, [p for _ in range(each) for p in PHASES[1:5]], ["export"] * each]
    return [(phase, len(group) - 1 - i) for group in groups for i, phase in enumerate(group)]


def chaos(args: list, stops: int, seed: int, work: str, seconds: dict) -> dict:
    """An uninterrupted run, then the same run stopped `stops` times (schedule: every phase, signals alternating)
    and restarted until it finishes. Each stop comes at a random one of the phase's entries left to the run
    (remaining), drawn from its first share (those left over the stops still to come in its group, so the run does
    not end first), and a random delay after it, up to seconds[phase] (about one entry's length). Returns
    {"stops": [(phase, signal, exit status, whether the stop reached the run)], "launches", "differ": what differs
    from the uninterrupted run}."""
    rng = random.Random(seed)
    attempt(args, os.path.join(work, "straight"), None)
    tried, launches = [], 0
    for phase, later in schedule(stops):
        left = remaining(args, os.path.join(work, "stopped"))[phase]
        turn = sum(p == phase for p, *_ in tried) + PHASES.index(phase)  # each phase alternates its signals
        plan = {"phase": phase, "nth": rng.randint(1, max(left // (later + 1), 1)),
                "delay": rng.uniform(0, seconds[phase]), "signal": ("SIGTERM", "SIGKILL")[turn % 2]}
        tried.append((phase, plan["signal"], *attempt(args, os.path.join(work, "stopped"), plan)))
        launches += 1
    while attempt(args, os.path.join(work, "stopped"), None)[0] != 0:  # then to the end, unstopped
        launches += 1
    return {"stops": tried, "launches": launches + 1,
            "differ": same_run(os.path.join(work, "straight"), os.path.join(work, "stopped"))}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stops", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--same", nargs=2, metavar=("DIR_A", "DIR_B"), help="only compare two finished runs (e.g. "
                        "the same command before and after a change of code) and say what differs")
    parser.add_argument("--new_keys", action="store_true", help="with --same: DIR_B may log keys DIR_A does not")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.same:
        differ = same_run(*args.same, new_keys=args.new_keys)
        print("the same run: every log (timing aside), the checkpoints' weights, AdamW state and data order" if not
              differ else f"different: {', '.join(differ)}")
        sys.exit(1 if differ else 0)
    if args.child:  # a launch of the run: train.py's main (as `python train.py` runs it), with a stop installed
        install(json.loads(args.child))
        import train
        from run_management import command_line
        result = command_line("train.py", lambda: train.main(rest))
        sys.exit(128 + signal.Signals[result["interrupted"]].value if result["interrupted"] else 0)
    work = tempfile.mkdtemp(prefix="chaos_")
    # about how long one call of each phase's function takes in CONFIG's run, seconds
    seconds = {"warm start": 0.05, "rollout": 0.3, "update": 0.2, "evaluation": 1.0, "checkpoint write": 0.0,
               "export": 0.1}
    start = time.perf_counter()
    result = chaos(CONFIG, args.stops, args.seed, work, seconds)
    for phase in PHASES:
        mine = [(signal_name, status, reached) for p, signal_name, status, reached in result["stops"] if p == phase]
        print(f"{phase:17s} {len(mine)} stops: " + ", ".join(
            f"{name} {'killed' if status < 0 else f'exit {status}'}{'' if reached else ' (came after the end)'}"
            for name, status, reached in mine))
    print(f"{result['launches']} launches of the same command in {time.perf_counter() - start:.0f} s; "
          + ("final weights, data order and logs equal the uninterrupted run's" if not result["differ"] else
             f"DIFFERENT from the uninterrupted run: {result['differ']}"))
    shutil.rmtree(work)
    sys.exit(1 if result["differ"] else 0)


if __name__ == "__main__":
    main()
