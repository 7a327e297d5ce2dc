"""
Held-out evaluation: pass@1 (greedy, or the mean over n samples) with its standard error, and
unbiased pass@k.

    python eval.py --model Qwen/Qwen2.5-0.5B --data data/gsm8k/test.jsonl
    python eval.py --model out/demo/ckpt.pt --data out/demo/heldout.jsonl --n 8 --k 1,4,8
    # MATH-500, by subject and level
    python eval.py --model out/math/ckpt.pt --data data/math500/test.jsonl

--model takes a Hugging Face name or directory, or a train.py checkpoint (.pt: its saved config
gives the model shape, tokenizer, template and max_new_tokens; train.py writes the run's held-out
questions to OUT_DIR/heldout.jsonl). Every completion is written with its verdict to
OUT/completions.jsonl and the figures to OUT/summary.json. Completions are sampled and scored by
rollout.sample_and_score, as in training; train.py's held-out evaluations run held_out_eval. --data
is in GSM8K's format or MATH's ({"problem", "answer", "subject", "level", ...}: MATH-500 ships in
data/math500); MATH rows are scored with the MATH answer checker (answers.ANSWER_CHECKERS,
--answer_checker to choose another) and pass@1 is also given per subject and per level.
"""
import argparse
import dataclasses
import json
import math
import os

import torch
from tqdm import tqdm

from answers import ANSWER_CHECKERS, final_answer
from checkpoint import load_model
from data import load_problem_file
from distributed import from_every_rank, rank, world_size
from model import resolve_device, set_attention_backends
from rewards import REFLECTION_MARKERS
from records import completion_flags
from rollout import Sampling, Scoring, rollout_seed, sample_and_score, sampling_of
from run_management import check_reachable, command_line, hub_names, refusals
from template import encode_prompt, template_of


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021), 1 - C(n-c, k) / C(n, k), for c correct out of n
    samples. Computed as 1 - prod_{i=n-c+1..n} (1 - k/i): no huge binomials, no overflow."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0  # every k-subset contains a correct sample
    all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        all_wrong *= 1.0 - k / i
    return 1.0 - all_wrong


def mean_and_stderr(values: list[float]) -> tuple[float, float]:
    """Mean and its standard error (sample std / sqrt(count)) over questions."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, float("nan")
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))


@torch.no_grad()
def evaluate(model, tokenizer, rows: list[dict], sampling: Sampling, scoring: Scoring, n: int = 1,
             ks: tuple[int, ...] = (1,), batch_size: int = 64, seed: int = 0,
             out_path: str | None = None,
             desc: str = "eval", progress: bool = True,
             reflection_markers: tuple = REFLECTION_MARKERS, math_verify=None) -> dict:
    """Sample n completions per row ({"question", "gold"}) as sampling says (rollout.sampling_of;
    temperature 0 is greedy) and score them as scoring says (rollout.Scoring: its template and
    answer checker). Returns {"pass@1", "pass@1_stderr" (over questions), "pass@k" for each k <= n,
    "format_rate", for each of records.completion_flags (worked, reflect) e.g. "worked_rate",
    "accuracy_worked" and "accuracy_unworked" (of those completions and of the others; None if there
    are none), "response_length", "truncation_rate", "questions", "n", "temperature"}, and when
    every row has a "subject" and a "level" (MATH) "by_subject" and "by_level" (breakdown).
    out_path: one JSON line per completion. math_verify (math_verify_grader()): each completion
    graded by Math-Verify too, its figures beside the checker's ("pass@1_math_verify",
    "graders_agree": grader_summary)."""
    if not rows:
        raise ValueError("no questions to evaluate")
    if n > 1 and sampling.temperature == 0:
        raise ValueError("n > 1 samples at temperature 0 are n copies of the greedy answer: set "
                         "--temperature")
    records = score_questions(model, tokenizer, rows, n, sampling, scoring, batch_size, seed, desc,
                              progress, reflection_markers, math_verify)
    if out_path:
        write_completions(records, out_path)
    return summarize(records, n, ks, sampling.temperature)


@torch.no_grad()
def score_questions(model, tokenizer, rows: list[dict], n: int, sampling: Sampling,
                    scoring: Scoring,
                    batch_size: int, seed: int = 0, desc: str = "eval", progress: bool = True,
                    reflection_markers: tuple = REFLECTION_MARKERS, math_verify=None) -> list[dict]:
    """evaluate()'s sampling: one record {"question", "gold", "samples": [n verdicts]} per row, in
    row order (with the row's "subject" and "level", where it has them). A model with LoRA adapters
    samples on merged weights, as train.py's rollouts do."""
    flags = completion_flags(scoring.template, reflection_markers)
    prompts = [encode_prompt(tokenizer, row["question"], scoring.template) for row in rows]
    # similar lengths per batch: less padding
    order = sorted(range(len(rows)), key=lambda i: len(prompts[i]))
    per_batch = max(1, batch_size // n)
    records = [None] * len(rows)
    was_training = model.training
    model.eval()
    with model.lora_merged():
        for start in tqdm(range(0, len(order), per_batch), desc=desc, disable=not progress,
                          leave=False, dynamic_ncols=True):
            chunk = order[start:start + per_batch]
            # sampled: a seed per (question, sample), so the result does not depend on batch_size;
            # greedy needs none
            seeds = seed
            if sampling.temperature > 0:
                seeds = [rollout_seed(seed, i * n + s) for i in chunk for s in range(n)]
            samples = sample_and_score(model, tokenizer,
                                       [prompts[i] for i in chunk for _ in range(n)],
                                       [rows[i]["gold"] for i in chunk for _ in range(n)], seeds,
                                       sampling, scoring)
            for j, i in enumerate(chunk):
                verdicts = [verdict(samples, s, scoring, flags, rows[i]["gold"], math_verify)
                            for s in range(j * n, (j + 1) * n)]
                records[i] = {"question": rows[i]["question"], "gold": rows[i]["gold"],
                              **{key: rows[i][key] for key in BREAKDOWNS if key in rows[i]},
                              "samples": verdicts}
    model.train(was_training)
    return records


def verdict(samples, s: int, scoring: Scoring, flags: dict, gold: str, math_verify=None) -> dict:
    """Row s of samples (rollout.Samples) as eval.py writes it: the completion, the answer read,
    whether it is correct and well formatted, each completion flag, its length and whether it was
    truncated; with math_verify, Math-Verify's verdict too ("correct_math_verify")."""
    text = samples.texts[s]
    response = scoring.template.prefix + text
    graded = {}
    if math_verify:
        graded["correct_math_verify"] = math_verify(response, gold, scoring.template)
    return {"completion": text,
            "answer": final_answer(response, scoring.template, scoring.answer_checker),
            "correct": samples.components["correctness"][s] == 1.0, **graded,
            "format": samples.components["format"][s] == 1.0,
            **{name: flag(text) for name, flag in flags.items()},
            "length": len(samples.completions[s]), "truncated": not samples.stopped[s]}


def math_verify_grader():
    """Math-Verify (Hugging Face's grader, which SimpleRL-Zoo and Oat-Zero report with) as a
    function (response, gold, template) -> bool. The gold is parsed as LaTeX in $...$. A response in
    the template's answer tags is graded on the last tag's content, parsed as LaTeX in $...$, as
    Oat-Zero grades its R1 template (Math-Verify's own extraction on the whole text would take a
    number from the think block: "<answer>73</answer>" after "3*24=72" reads as 72); any other
    response whole, with Math-Verify's default extraction (its last boxed, LaTeX or plain answer),
    as SimpleRL-Zoo's boxed answers are. Then verify(gold, answer). No truncation rule: a response
    cut at max_new_tokens is graded on what it wrote. A RuntimeError naming the package when
    math_verify is not installed (training and the tests never need it)."""
    try:
        from math_verify import parse, verify
    except ImportError:
        raise RuntimeError("--grader math_verify needs the math-verify package: pip install "
                           "math-verify (optional; training and the tests never need "
                           "it)") from None

    def grade(response: str, gold: str, template) -> bool:
        opening, closing = template.answer
        tagged = (response.rpartition(opening)[2].partition(closing)[0] if opening in response
                  else None)
        return bool(verify(parse(f"${gold}$"),
                           parse(response if tagged is None else f"${tagged}$")))
    return grade


def summarize(records: list[dict], n: int, ks: tuple[int, ...], temperature: float) -> dict:
    """evaluate()'s figures from score_questions() records (train.py gathers them from every rank
    first)."""
    correct = [sum(s["correct"] for s in r["samples"]) for r in records]
    flat = [s for r in records for s in r["samples"]]
    # the flags' names
    flags = [name for name in completion_flags(template=None) if all(name in s for s in flat)]
    pass1, pass1_stderr = pass_at_1(records, n, "correct")
    return {"pass@1": pass1, "pass@1_stderr": pass1_stderr,
            **{f"pass@{k}": sum(pass_at_k(n, c, k) for c in correct) / len(records)
               for k in ks if 1 < k <= n},
            "format_rate": sum(s["format"] for s in flat) / len(flat),
            **{key: value for name in flags for key, value in flag_summary(flat, name).items()},
            "response_length": sum(s["length"] for s in flat) / len(flat),
            "truncation_rate": sum(s["truncated"] for s in flat) / len(flat),
            "questions": len(records), "n": n, "temperature": temperature,
            **{f"by_{key}": breakdown(records, n, key)
               for key in BREAKDOWNS if all(key in r for r in records)},
            **(grader_summary(records, n) if all("correct_math_verify" in s for s in flat) else {})}


def pass_at_1(records: list[dict], n: int, verdict: str) -> tuple[float, float]:
    """pass@1 over questions and its standard error, by each sample's verdict ("correct",
    "correct_math_verify")."""
    return mean_and_stderr([pass_at_k(n, sum(s[verdict] for s in r["samples"]), 1)
                            for r in records])


def grader_summary(records: list[dict], n: int) -> dict:
    """Math-Verify's figures beside the checker's: pass@1 and its standard error by its verdicts,
    and the share of completions on which the two graders agree."""
    flat = [s for r in records for s in r["samples"]]
    pass1, stderr = pass_at_1(records, n, "correct_math_verify")
    return {"pass@1_math_verify": pass1, "pass@1_math_verify_stderr": stderr,
            "graders_agree": sum(s["correct"] == s["correct_math_verify"]
                                 for s in flat) / len(flat)}


GRADERS = ("checker", "math_verify", "both")
# MATH's: pass@1 per subject and per level (summary["by_subject"], ["by_level"])
BREAKDOWNS = ("subject", "level")


def breakdown(records: list[dict], n: int, key: str) -> dict:
    """pass@1 per value of a record key (a MATH subject or level): {value as text: {"pass@1",
    "pass@1_stderr", "questions"}}, the values in order (levels by number; an unknown level, None,
    last as "?")."""
    groups = {}
    for record in records:
        correct = sum(s["correct"] for s in record["samples"])
        groups.setdefault(record[key], []).append(pass_at_k(n, correct, 1))
    in_order = sorted(groups.items(),
                      key=lambda item: (item[0] is None, item[0] if item[0] is not None else 0))
    breakdown = {}
    for value, values in in_order:
        mean, stderr = mean_and_stderr(values)
        name = "?" if value is None else str(value)
        breakdown[name] = {"pass@1": mean, "pass@1_stderr": stderr, "questions": len(values)}
    return breakdown


def breakdown_lines(summary: dict) -> list[str]:
    """The printed table of summary's breakdowns (by level, then by subject), one line per value."""
    lines = []
    for key in reversed(BREAKDOWNS):
        if f"by_{key}" not in summary:
            continue
        lines.append(f"pass@1 by {key}:")
        for value, figures in summary[f"by_{key}"].items():
            name = f"level {value}" if key == "level" else value
            lines.append(f"  {name:<24} {figures['pass@1']:.4f} ± {figures['pass@1_stderr']:.4f}  "
                         f"({figures['questions']} questions)")
    return lines


def flag_summary(flat: list[dict], name: str) -> dict:
    """For a completion flag (records.completion_flags), e.g. worked: worked_rate, and
    accuracy_worked and accuracy_unworked, the accuracy of the completions with it and of the others
    (None if there are none): did the worked answers get better, or more frequent?"""
    yes, no = [s for s in flat if s[name]], [s for s in flat if not s[name]]
    return {f"{name}_rate": len(yes) / len(flat),
            **{f"accuracy_{kind}": sum(s["correct"] for s in part) / len(part) if part else None
               for kind, part in ((name, yes), ("un" + name, no))}}


def write_completions(records: list[dict], path: str):
    """One JSON line per completion: its question, gold answer and verdict."""
    with open(path, "w") as f:
        f.writelines(json.dumps({"question": r["question"], "gold": r["gold"],
                                 **{key: r[key] for key in BREAKDOWNS if key in r}, **s}) + "\n"
                     for r in records for s in r["samples"])


def held_out_eval(run, cfg, tracker) -> float:
    """train.py's evaluation: greedy pass@1 on run.heldout, written to out_dir/eval_NNNNN.jsonl and
    logged to eval.jsonl (tracker); under torchrun each rank scores a slice and all see every
    record."""
    n = len(run.heldout)
    world = world_size()
    mine = run.heldout[rank() * n // world:(rank() + 1) * n // world]
    greedy = dataclasses.replace(run.sampling, temperature=0.0)
    # the rules alone: correctness and format
    scoring = Scoring(run.template, {}, cfg.answer_checker)
    records = score_questions(run.sampler, run.tokenizer, mine, 1, greedy, scoring,
                              cfg.eval_batch_size,
                              desc=f"eval@{run.step}", progress=rank() == 0,
                              reflection_markers=cfg.reflection_markers)
    records = [record for part in from_every_rank(records) for record in part]
    result = summarize(records, n=1, ks=(1,), temperature=0.0)
    if rank() != 0:
        return result["pass@1"]
    write_completions(records, os.path.join(cfg.out_dir, f"eval_{run.step:05d}.jsonl"))
    tracker.log({"step": run.step, **result}, "eval.jsonl")
    tqdm.write(f"step {run.step}: held-out pass@1 {result['pass@1']:.3f} ± "
               f"{result['pass@1_stderr']:.3f} "
               f"({len(run.heldout)} questions, greedy)" + ("; by level: " + ", ".join(
                   f"L{level} {figures['pass@1']:.3f}"
                   for level, figures in result["by_level"].items())
                   if "by_level" in result else ""))
    return result["pass@1"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True,
                        help="Hugging Face name or dir, or a train.py checkpoint (.pt)")
    parser.add_argument("--data", required=True,
                        help="JSONL in GSM8K's format ({question, answer ending '#### N'}) "
                        "or MATH's ({problem, answer, subject, level, ...}, e.g. "
                        "data/math500/test.jsonl)")
    parser.add_argument("--n", type=int, default=1, help="samples per question")
    parser.add_argument("--k", default="1", help="comma-separated k for pass@k (each <= n)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="default: 0 (greedy) if n == 1, else 1")
    parser.add_argument("--top_p", type=float, default=1.0, help="nucleus sampling (1 = off)")
    parser.add_argument("--top_k", type=int, default=0, help="top-k sampling (0 = off)")
    parser.add_argument("--max_new_tokens", type=int, default=0,
                        help="default: the checkpoint's, or 512")
    parser.add_argument("--template", default="",
                        help="prompt template (default: the checkpoint's, or r1_zero)")
    parser.add_argument("--tokenizer", default="",
                        help="default: the checkpoint's, or the model's own")
    parser.add_argument("--answer_checker", default="auto", choices=("auto", *ANSWER_CHECKERS),
                        help="how answers are read and compared; auto: 'math' for MATH-format "
                             "data, else the "
                        "checkpoint's, else 'gsm8k'")
    parser.add_argument("--grader", default="checker", choices=GRADERS,
                        help="who grades the answers: the run's hand-"
                        "written answer checker (the reward's), Math-Verify (pip install "
                        "math-verify; SimpleRL-Zoo's "
                        "and Oat-Zero's grader), or both, side by side with their agreement")
    parser.add_argument("--reflection_markers", default="",
                        help="comma-separated re-check phrases for reflect_rate "
                        "(default: the checkpoint's, or rewards.REFLECTION_MARKERS)")
    parser.add_argument("--gguf_file", default="",
                        help="a GGUF file inside --model (a dir or hub repo) to load")
    parser.add_argument("--limit", type=int, default=0,
                        help="evaluate only the first L questions (0 = all)")
    parser.add_argument("--batch_size", type=int, default=0,
                        help="completions per generate call (default: the "
                        "checkpoint's eval_batch_size, as its run's evaluations batched them, or "
                        "64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto (cuda if available) | cuda | cpu")
    parser.add_argument("--no_cuda_graphs", action="store_true",
                        help="decode with the plain eager loop on CUDA")
    parser.add_argument("--no_fused_sampling", action="store_true",
                        help="sample with torch ops, not the fused Triton " "kernel, on CUDA")
    parser.add_argument("--no_fused_decode", action="store_true",
                        help="decode with the model's torch forward, not the fused Triton kernels, "
                        "on CUDA")
    parser.add_argument("--out", default="",
                        help="output dir (default: CKPT_eval/ beside a .pt, else out/eval/NAME)")
    args = parser.parse_args(argv)

    if not all(k.strip().isdecimal() for k in args.k.split(",")):
        parser.error(f"--k takes comma-separated whole numbers, got {args.k!r}")
    ks = tuple(int(k) for k in args.k.split(","))
    if args.n < 1 or any(k < 1 or k > args.n for k in ks):
        parser.error(f"need n >= 1 and every k between 1 and n={args.n}, got --n {args.n} --k "
                     f"{args.k}")
    if args.limit < 0 or args.batch_size < 0:
        parser.error("need --limit >= 0 and --batch_size >= 0 (0: the checkpoint's), got "
                     f"{args.limit} and {args.batch_size}")
    if not os.path.isfile(args.data):
        parser.error(f"--data {args.data}: no such file")
    temperature = (args.temperature if args.temperature is not None
                   else (0.0 if args.n == 1 else 1.0))
    # a malformed data file, no network for a model not in the cache, ...: refused in a few lines
    with refusals():
        math_verify = math_verify_grader() if args.grader != "checker" else None
        rows = load_problem_file(args.data)[:args.limit or None]
        device, dtype = resolve_device(args.device)
        # as train.py computes, so that a checkpoint scores as its run's evaluations
        set_attention_backends(device)
        check_reachable(hub_names(argparse.Namespace(model=args.model, tokenizer=args.tokenizer,
                                                     gguf_file=args.gguf_file, reward_weights={})),
                        "eval.py")
        model, tokenizer, run_config = load_model(args.model, dtype, args.tokenizer, args.gguf_file)
        # a checkpoint holds its own
        template = template_of(args.template or run_config.get("template", "r1_zero"))
    model.to(device)
    if device.type == "cuda":  # one matrix product per projection group (kernels.decode_step)
        model.fuse_projections()
    max_new_tokens = args.max_new_tokens or run_config.get("max_new_tokens", 512)
    batch_size = args.batch_size or run_config.get("eval_batch_size", 64)
    answer_checker = args.answer_checker if args.answer_checker != "auto" else \
        "math" if rows and "level" in rows[0] else run_config.get("answer_checker", "gsm8k")
    markers = (tuple(m.strip() for m in args.reflection_markers.split(",") if m.strip())
               if args.reflection_markers
               else tuple(run_config.get("reflection_markers", REFLECTION_MARKERS)))
    # out/demo/ckpt.pt -> out/demo/ckpt_eval: beside the run it scores
    if args.model.endswith(".pt"):
        out_dir = args.out or os.path.splitext(args.model)[0] + "_eval"
    else:
        out_dir = args.out or os.path.join("out", "eval",
                                           os.path.basename(os.path.normpath(args.model)))
    os.makedirs(out_dir, exist_ok=True)
    sampling = sampling_of(tokenizer, template, max_new_tokens, temperature, top_p=args.top_p,
                           top_k=args.top_k,
                           cuda_graphs=not args.no_cuda_graphs,
                           fused_sampling=not args.no_fused_sampling,
                           fused_decode=not args.no_fused_decode)
    summary = evaluate(model, tokenizer, rows, sampling, Scoring(template, {}, answer_checker),
                       n=args.n, ks=ks,
                       batch_size=batch_size, seed=args.seed,
                       out_path=os.path.join(out_dir, "completions.jsonl"),
                       reflection_markers=markers, math_verify=math_verify)
    summary.update(model=args.model, data=args.data,
                   template=template.name or dataclasses.asdict(template),
                   answer_checker=answer_checker, reflection_markers=markers, grader=args.grader,
                   max_new_tokens=max_new_tokens)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if args.grader != "math_verify":
        print(f"pass@1: {summary['pass@1']:.4f} ± {summary['pass@1_stderr']:.4f} (standard error, "
              f"{summary['questions']} questions; answer checker {answer_checker})")
    if math_verify:
        print(f"pass@1: {summary['pass@1_math_verify']:.4f} ± "
              f"{summary['pass@1_math_verify_stderr']:.4f} (standard "
              f"error, {summary['questions']} questions; Math-Verify)" + (
                  f"; the graders agree on {summary['graders_agree']:.1%} of completions"
                  if args.grader == "both" else ""))
    for line in breakdown_lines(summary):
        print(line)
    for k in ks:
        if k > 1:
            print(f"pass@{k}: {summary[f'pass@{k}']:.4f}")
    # worked, reflect: records.completion_flags says what each means
    for name in completion_flags(template=None):
        accuracy = {kind: ("n/a" if summary[f"accuracy_{kind}"] is None
                           else f"{summary[f'accuracy_{kind}']:.3f}")
                    for kind in (name, "un" + name)}
        print(f"{name}_rate: {summary[f'{name}_rate']:.3f} of the completions; "
              f"accuracy {accuracy[name]}, without it {accuracy['un' + name]}")
    print(f"completions: {os.path.join(out_dir, 'completions.jsonl')}; summary: "
          f"{os.path.join(out_dir, 'summary.json')}")
    return summary


if __name__ == "__main__":
    command_line("eval.py", main)  # a refusal prints its message, without a traceback
