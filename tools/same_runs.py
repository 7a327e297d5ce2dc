"""
A refactor changes no computation: a set of short runs, each a different path through the code (GRPO's loss
variants, the reference, mu > 1, process supervision, LoRA, the baselines, DAPO's shaping and filter, GSPO, the aha
demo's data), run with one checkout's train.py; then the same set with another checkout's, and compared bit for bit
(chaos.same_run: every JSONL log, timing aside; the checkpoints' weights, reference, AdamW state and data order).

    python tools/same_runs.py --repo /tmp/before --out /tmp/runs_before     # the set, with another checkout's code
    python tools/same_runs.py --out /tmp/runs_after                          # the set, with this checkout's code
    python tools/same_runs.py --compare /tmp/runs_before /tmp/runs_after     # run by run: the same, or what differs

Every run is one thread (--threads=1, OMP_NUM_THREADS=1); two run at a time (--jobs). The warm start is run once
(the first run, "warm") and every other run starts from its sft.pt (init_from), so the set takes a few minutes.
"""
import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--eval_size=40", "--synthetic_eval_size=40", "--eval_every=3", "--checkpoint_every=3", "--sample_every=2",
         "--max_steps=6", "--threads=1"]
WARM = "{out}/warm/sft.pt"
FROM_WARM = ["--init_from=" + WARM, "--data_seed=1337"]
# name -> train.py arguments after configs/demo.py (the baselines' overlays come first where named)
RUNS = {
    "warm": ["--sft_steps=300", "--max_steps=4", "--eval_every=2", "--eval_size=40", "--synthetic_eval_size=40",
             "--checkpoint_every=2", "--sample_every=2", "--threads=1"],
    "k3": FROM_WARM + SMALL + ["--beta=0.04"],
    "mu2_both": FROM_WARM + SMALL + ["--beta=0.04", "--mu=2", "--supervision=both"],
    "process": FROM_WARM + SMALL + ["--supervision=process", "--micro_batch_size=16"],
    "lora": FROM_WARM + SMALL + ["--lora_rank=4", "--beta=0.1", "--lr=1e-3"],
    "k3_is": FROM_WARM + SMALL + ["--beta=0.04", "--kl_estimator=k3_is", "--loss_agg=token_mean",
                                  "--clip_eps_high=0.28", "--mu=2"],
    "k1_reward": FROM_WARM + SMALL + ["--beta=0.04", "--kl_estimator=k1_reward", "--adv_scale=none",
                                      "--adv_baseline=rloo"],
    "k2_iterative": FROM_WARM + SMALL + ["--beta=0.04", "--kl_estimator=k2", "--ref_reset_every=2"],
    "gspo": FROM_WARM + SMALL + ["--importance_sampling_level=sequence", "--clip_eps=3e-4", "--clip_eps_high=4e-4",
                                 "--mu=2", "--loss_agg=constant", "--adv_scale=none"],
    "dapo": FROM_WARM + SMALL + ["--dynamic_sampling", "--max_num_gen_batches=3", "--overlong_buffer_len=32",
                                 "--loss_agg=token_mean"],
    "reinforce": FROM_WARM + SMALL + ["--adv_baseline=none", "--adv_scale=none"],
    "tis": FROM_WARM + SMALL + ["--beta=0.04", "--tis_cap=1.0", "--mu=2"],
    "rft": ["configs/demo_rft.py"] + FROM_WARM + SMALL,
    "sft_answers": ["configs/demo_sft_answers.py"] + FROM_WARM + SMALL,
    "sft_more": ["configs/demo_sft_more.py"] + FROM_WARM + SMALL,
    "random": ["configs/demo_random.py"] + FROM_WARM + SMALL,
    "aha": ["--config=configs/demo_aha.py", "--sft_steps=200", "--max_steps=4", "--eval_every=2", "--eval_size=40",
            "--synthetic_eval_size=40", "--checkpoint_every=2", "--sample_every=2", "--threads=1"],
}


def command(repo: str, name: str, out: str) -> list[str]:
    args = [a.format(out=out) for a in RUNS[name]]
    configs = ["configs/demo.py"]
    if args and args[0].startswith("--config="):
        configs, args = [args[0].partition("=")[2]], args[1:]
    elif args and args[0].endswith(".py"):
        configs, args = configs + [args[0]], args[1:]
    return [sys.executable, "train.py", *configs, *args, f"--out_dir={os.path.join(out, name)}"]


def run(repo: str, name: str, out: str) -> str:
    done = subprocess.run(command(repo, name, out), cwd=repo, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    with open(os.path.join(out, f"{name}.txt"), "w") as f:
        f.write(done.stdout + done.stderr)
    return f"{name}: {'ok' if done.returncode == 0 else f'FAILED (exit {done.returncode}, see {name}.txt)'}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", default=ROOT, help="the checkout whose train.py runs the set (default: this one)")
    parser.add_argument("--out", help="where the runs go, one out_dir per run")
    parser.add_argument("--only", default="", help="comma-separated run names (default: all)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--compare", nargs=2, metavar=("DIR_A", "DIR_B"))
    parser.add_argument("--new_keys", action="store_true", help="with --compare: DIR_B may log keys DIR_A does not")
    parser.add_argument("--nulls_dropped", action="store_true",
                        help="with --compare: DIR_B may leave out a key DIR_A logs as null (code that logs numbers only)")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(RUNS)
    if args.compare:
        sys.path.insert(0, os.path.join(ROOT, "tools"))
        sys.path.insert(0, ROOT)
        from chaos import same_run
        failed = 0
        for name in names:
            a, b = (os.path.join(d, name) for d in args.compare)
            differ = same_run(a, b, new_keys=args.new_keys, nulls_dropped=args.nulls_dropped) if os.path.isdir(a) and os.path.isdir(b) else ["missing"]
            failed += bool(differ)
            print(f"{name:12s} " + ("the same, bit for bit" if not differ else f"DIFFERENT: {', '.join(differ)}"))
        sys.exit(1 if failed else 0)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    if "warm" in names:
        print(run(args.repo, "warm", out), flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        for line in pool.map(lambda n: run(args.repo, n, out), [n for n in names if n != "warm"]):
            print(line, flush=True)


if __name__ == "__main__":
    main()
