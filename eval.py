"""
Held-out evaluation: pass@1 (greedy, or the mean over n samples) with its standard error, and unbiased pass@k.

    python eval.py --model Qwen/Qwen2.5-0.5B --data data/gsm8k/test.jsonl
    python eval.py --model out/demo/ckpt.pt --data out/demo/heldout.jsonl --n 8 --k 1,4,8

--model takes a Hugging Face name or directory, or a train.py checkpoint (.pt: its saved config gives the model
shape, tokenizer, template and max_new_tokens; train.py writes the run's held-out questions to
OUT_DIR/heldout.jsonl). Every completion is written with its verdict to OUT/completions.jsonl and the figures to
OUT/summary.json. sample_and_score() is also the rollout of train.py: one path from tokens to rewards.
"""
import argparse
import json
import math
import os
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from data import encode_prompt, load_gsm8k_file, load_tokenizer, response_prefix, stop_sequences, stop_token_ids
from model import ModelConfig, Transformer, resolve_device
from rewards import extract_answer, score_completions, step_rewards
from sample import generate


@dataclass
class Samples:
    """Completions of a batch of prompts, decoded and scored; row i answers prompts[i]."""
    completions: list[list[int]]  # generated token ids, stop token included
    texts: list[str]  # decoded completions, without a final end-of-text token (a final "</answer>" is kept)
    stopped: list[bool]  # False: cut at max_new_tokens
    rewards: list[float]  # weighted sum of the reward components
    components: dict[str, list[float]]  # each reward, unweighted; "correctness" and "format" always present
    seconds_sampling: float  # generate, to the tokens on the host
    seconds_scoring: float  # decoding and rewards
    steps: list[list[tuple[int, float]]] | None = None  # process=True: (token index of a step's end, reward) per step


def sample_and_score(model, tokenizer, prompts: list[list[int]], golds: list[str], template: str,
                     max_new_tokens: int, temperature: float, seed: int | list[int], weights: dict[str, float],
                     top_p: float = 1.0, top_k: int = 0, questions: list[str] | None = None, functions=None,
                     process: bool = False) -> Samples:
    """Sample one completion per prompt, ending at an end-of-text token or "</answer>", decode it and score it against
    its gold answer: weights names the rewards, functions holds the loaded ones (reward_models.load_rewards),
    questions the problems' text they may read. process: also the step rewards of process supervision."""
    end_of_text, start = set(stop_token_ids(tokenizer)), time.perf_counter()
    rollout = generate(model, prompts, max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                       stop_sequences=stop_sequences(tokenizer, template), seed=seed, pad_id=tokenizer.pad_token_id)
    tokens, lengths, stopped = rollout.tokens.tolist(), rollout.lengths.tolist(), rollout.stopped.tolist()
    completions, sampled = [row[:n] for row, n in zip(tokens, lengths)], time.perf_counter()
    texts = [tokenizer.decode(c[:-1] if c[-1] in end_of_text else c) for c in completions]  # "</answer>" is kept
    prefix = response_prefix(template)  # the prompt ends in "<think>": the format reward judges the whole response
    # accuracy and format are measured whatever the weights; a 0 weight keeps them out of the reward
    rewards, components = score_completions([prefix + t for t in texts], golds, [not s for s in stopped],
                                            {"correctness": 0.0, "format": 0.0, **weights}, questions, functions)
    steps = [step_rewards(text, ids, tokenizer.decode, truncated=not stop)
             for text, ids, stop in zip(texts, completions, stopped)] if process else None
    return Samples(completions, texts, stopped, rewards, components, sampled - start, time.perf_counter() - sampled,
                   steps)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021), 1 - C(n-c, k) / C(n, k), for c correct out of n samples.
    Computed as 1 - prod_{i=n-c+1..n} (1 - k/i): no huge binomials, no overflow."""
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
def evaluate(model, tokenizer, rows: list[dict], template: str = "r1_zero", n: int = 1, temperature: float = 0.0,
             ks: tuple[int, ...] = (1,), max_new_tokens: int = 512, batch_size: int = 64, seed: int = 0,
             top_p: float = 1.0, top_k: int = 0, out_path: str | None = None, desc: str = "eval",
             progress: bool = True) -> dict:
    """Sample n completions per row ({"question", "gold"}) and score them.
    Returns {"pass@1", "pass@1_stderr" (over questions), "pass@k" for each k <= n, "format_rate",
    "response_length", "truncation_rate", "questions", "n", "temperature"}; temperature 0 is greedy.
    out_path: one JSON line per completion."""
    if not rows:
        raise ValueError("no questions to evaluate")
    if n > 1 and temperature == 0:
        raise ValueError("n > 1 samples at temperature 0 are n copies of the greedy answer: set --temperature")
    records = score_questions(model, tokenizer, rows, template, n, temperature, max_new_tokens, batch_size, seed,
                              top_p, top_k, desc, progress)
    if out_path:
        write_completions(records, out_path)
    return summarize(records, n, ks, temperature)


@torch.no_grad()
def score_questions(model, tokenizer, rows: list[dict], template: str, n: int, temperature: float,
                    max_new_tokens: int, batch_size: int, seed: int = 0, top_p: float = 1.0, top_k: int = 0,
                    desc: str = "eval", progress: bool = True) -> list[dict]:
    """evaluate()'s sampling: one record {"question", "gold", "samples": [n verdicts]} per row, in row order."""
    prompts = [encode_prompt(tokenizer, row["question"], template) for row in rows]
    order = sorted(range(len(rows)), key=lambda i: len(prompts[i]))  # similar lengths per batch: less padding
    per_batch = max(1, batch_size // n)
    records, prefix = [None] * len(rows), response_prefix(template)
    was_training = model.training
    model.eval()
    for start in tqdm(range(0, len(order), per_batch), desc=desc, disable=not progress, leave=False,
                      dynamic_ncols=True):
        chunk = order[start:start + per_batch]
        # sampled: a seed per (question, sample), so the result does not depend on batch_size; greedy needs none
        seeds = [(seed * 1_000_003 + i * n + s) % 2 ** 31 for i in chunk for s in range(n)] if temperature > 0 \
            else seed
        samples = sample_and_score(model, tokenizer, [prompts[i] for i in chunk for _ in range(n)],
                                   [rows[i]["gold"] for i in chunk for _ in range(n)], template, max_new_tokens,
                                   temperature, seeds, weights={}, top_p=top_p, top_k=top_k)
        for j, i in enumerate(chunk):
            records[i] = {"question": rows[i]["question"], "gold": rows[i]["gold"], "samples": [
                {"completion": samples.texts[s], "answer": extract_answer(prefix + samples.texts[s]),
                 "correct": samples.components["correctness"][s] == 1.0,
                 "format": samples.components["format"][s] == 1.0,
                 "length": len(samples.completions[s]), "truncated": not samples.stopped[s]}
                for s in range(j * n, (j + 1) * n)]}
    model.train(was_training)
    return records


def summarize(records: list[dict], n: int, ks: tuple[int, ...], temperature: float) -> dict:
    """evaluate()'s figures from score_questions() records (train.py gathers them from every rank first)."""
    correct = [sum(s["correct"] for s in r["samples"]) for r in records]
    flat = [s for r in records for s in r["samples"]]
    pass1, pass1_stderr = mean_and_stderr([pass_at_k(n, c, 1) for c in correct])
    return {"pass@1": pass1, "pass@1_stderr": pass1_stderr,
            **{f"pass@{k}": sum(pass_at_k(n, c, k) for c in correct) / len(records) for k in ks if 1 < k <= n},
            "format_rate": sum(s["format"] for s in flat) / len(flat),
            "response_length": sum(s["length"] for s in flat) / len(flat),
            "truncation_rate": sum(s["truncated"] for s in flat) / len(flat),
            "questions": len(records), "n": n, "temperature": temperature}


def write_completions(records: list[dict], path: str):
    """One JSON line per completion: its question, gold answer and verdict."""
    with open(path, "w") as f:
        f.writelines(json.dumps({"question": r["question"], "gold": r["gold"], **s}) + "\n"
                     for r in records for s in r["samples"])


def read_checkpoint(path: str, device="cpu") -> dict:
    """A train.py checkpoint as a dict, or an error that names the file and what is wrong with it."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path} not found")
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as error:  # torch raises EOFError, UnpicklingError, RuntimeError... for damaged files
        raise ValueError(f"checkpoint {path} cannot be read ({type(error).__name__}: {error}); it is damaged or "
                         "not a train.py checkpoint") from None
    missing = {"model", "model_config", "config", "step"} - (set(state) if isinstance(state, dict) else set())
    if missing:
        raise ValueError(f"checkpoint {path} is not a train.py checkpoint: it lacks {sorted(missing)}")
    return state


def model_from_checkpoint(state: dict) -> Transformer:
    """The fp32 model saved in a train.py checkpoint dict, with its LoRA adapters if the run had them."""
    model, run = Transformer(ModelConfig(**state["model_config"])), state["config"]
    if run.get("lora_rank", 0) > 0:
        model.add_lora(run["lora_rank"], run["lora_alpha"], run["lora_dropout"], tuple(run["lora_targets"]))
    model.load_state_dict(state["model"])
    return model


def load_model(name: str, device, dtype, tokenizer_name: str = "", gguf_file: str = ""):
    """(model, tokenizer, run config) from a train.py checkpoint (.pt) or a Hugging Face name/directory (with
    gguf_file: a GGUF file in it); the run config is the checkpoint's TrainConfig as a dict ({} for Hugging Face
    models): it supplies eval defaults."""
    if name.endswith(".pt"):
        state = read_checkpoint(name)
        model, run_config = model_from_checkpoint(state), state["config"]
        name, gguf_file, tokenizer_name = run_config["model"], run_config["gguf_file"], tokenizer_name or run_config["tokenizer"]
    else:
        model, run_config = Transformer.from_pretrained(name, dtype=dtype, gguf_file=gguf_file or None), {}
    # the model's own tokenizer unless one is named (a GGUF file carries its own)
    tokenizer = load_tokenizer(tokenizer_name) if tokenizer_name else load_tokenizer(name, gguf_file=gguf_file or None)
    return model.to(device=device, dtype=dtype), tokenizer, run_config


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="Hugging Face name or dir, or a train.py checkpoint (.pt)")
    parser.add_argument("--data", required=True, help="GSM8K-format JSONL: {question, answer ending '#### N'}")
    parser.add_argument("--n", type=int, default=1, help="samples per question")
    parser.add_argument("--k", default="1", help="comma-separated k for pass@k (each <= n)")
    parser.add_argument("--temperature", type=float, default=None, help="default: 0 (greedy) if n == 1, else 1")
    parser.add_argument("--top_p", type=float, default=1.0, help="nucleus sampling (1 = off)")
    parser.add_argument("--top_k", type=int, default=0, help="top-k sampling (0 = off)")
    parser.add_argument("--max_new_tokens", type=int, default=0, help="default: the checkpoint's, or 512")
    parser.add_argument("--template", default="", help="prompt template (default: the checkpoint's, or r1_zero)")
    parser.add_argument("--tokenizer", default="", help="default: the checkpoint's, or the model's own")
    parser.add_argument("--gguf_file", default="", help="a GGUF file inside --model (a dir or hub repo) to load")
    parser.add_argument("--limit", type=int, default=0, help="evaluate only the first L questions (0 = all)")
    parser.add_argument("--batch_size", type=int, default=64, help="completions per generate call")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto (cuda if available) | cuda | cpu")
    parser.add_argument("--out", default="", help="output dir (default: CKPT_eval/ beside a .pt, else out/eval/NAME)")
    args = parser.parse_args(argv)

    if not all(k.strip().isdecimal() for k in args.k.split(",")):
        parser.error(f"--k takes comma-separated whole numbers, got {args.k!r}")
    ks = tuple(int(k) for k in args.k.split(","))
    if args.n < 1 or any(k < 1 or k > args.n for k in ks):
        parser.error(f"need n >= 1 and every k between 1 and n={args.n}, got --n {args.n} --k {args.k}")
    if args.limit < 0 or args.batch_size < 1:
        parser.error(f"need --limit >= 0 and --batch_size >= 1, got {args.limit} and {args.batch_size}")
    if not os.path.isfile(args.data):
        parser.error(f"--data {args.data}: no such file")
    temperature = args.temperature if args.temperature is not None else (0.0 if args.n == 1 else 1.0)
    rows = load_gsm8k_file(args.data)[:args.limit or None]
    device, dtype = resolve_device(args.device)
    model, tokenizer, run_config = load_model(args.model, device, dtype, args.tokenizer, args.gguf_file)
    template = args.template or run_config.get("template", "r1_zero")
    max_new_tokens = args.max_new_tokens or run_config.get("max_new_tokens", 512)
    if args.model.endswith(".pt"):  # out/demo/ckpt.pt -> out/demo/ckpt_eval: beside the run it scores
        out_dir = args.out or os.path.splitext(args.model)[0] + "_eval"
    else:
        out_dir = args.out or os.path.join("out", "eval", os.path.basename(os.path.normpath(args.model)))
    os.makedirs(out_dir, exist_ok=True)
    summary = evaluate(model, tokenizer, rows, template=template, n=args.n, temperature=temperature, ks=ks,
                       max_new_tokens=max_new_tokens, batch_size=args.batch_size, seed=args.seed, top_p=args.top_p,
                       top_k=args.top_k, out_path=os.path.join(out_dir, "completions.jsonl"))
    summary.update(model=args.model, data=args.data, template=template)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"pass@1: {summary['pass@1']:.4f} ± {summary['pass@1_stderr']:.4f} (standard error, "
          f"{summary['questions']} questions)")
    for k in ks:
        if k > 1:
            print(f"pass@{k}: {summary[f'pass@{k}']:.4f}")
    print(f"completions: {os.path.join(out_dir, 'completions.jsonl')}; summary: {os.path.join(out_dir, 'summary.json')}")
    return summary


if __name__ == "__main__":
    main()
