"""
Held-out evaluation: pass@1 (greedy, or the mean over n samples) and unbiased pass@k.

    python eval.py --model Qwen/Qwen2.5-0.5B --data data/gsm8k/test.jsonl
    python eval.py --model out/demo/ckpt.pt --data out/demo/heldout.jsonl --n 8 --k 1,4,8

--model takes a Hugging Face name or directory, or a train.py checkpoint (.pt: its saved config gives the model
shape, tokenizer, template and max_new_tokens; train.py writes the run's held-out questions to
OUT_DIR/heldout.jsonl). Every completion is written with its verdict to OUT/completions.jsonl and the figures to
OUT/summary.json.
"""
import argparse
import json
import os

import torch
from tqdm import tqdm

from data import format_prompt, load_gsm8k_file, load_tokenizer, response_prefix, stop_token_ids
from model import ModelConfig, Transformer
from rewards import correctness_reward, extract_answer, format_reward
from sample import generate


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


@torch.no_grad()
def evaluate(model, tokenizer, rows: list[dict], template: str = "r1_zero", n: int = 1, temperature: float = 0.0,
             ks: tuple[int, ...] = (1,), max_new_tokens: int = 512, batch_size: int = 64, seed: int = 0,
             out_path: str | None = None, desc: str = "eval", progress: bool = True) -> dict:
    """Sample n completions per row ({"question", "gold"}) and score them.
    Returns {"pass@1", "pass@k" for each k <= n, "format_rate", "response_length", "truncation_rate",
    "questions", "n", "temperature"}; temperature 0 is greedy. out_path: one JSON line per completion."""
    if n > 1 and temperature == 0:
        raise ValueError("n > 1 samples at temperature 0 are n copies of the greedy answer: set --temperature")
    prefix, stop, pad = response_prefix(template), stop_token_ids(tokenizer), tokenizer.pad_token_id
    prompts = [tokenizer.encode(format_prompt(row["question"], template)) for row in rows]
    order = sorted(range(len(rows)), key=lambda i: len(prompts[i]))  # similar lengths per batch: less padding
    per_batch = max(1, batch_size // n)
    records = [None] * len(rows)
    was_training = model.training
    model.eval()
    for start in tqdm(range(0, len(order), per_batch), desc=desc, disable=not progress, leave=False,
                      dynamic_ncols=True):
        chunk = order[start:start + per_batch]
        rollout = generate(model, [prompts[i] for i in chunk for _ in range(n)], max_new_tokens,
                           temperature=temperature, stop_ids=stop, seed=seed + start, pad_id=pad)
        tokens, lengths, stopped = rollout.tokens.tolist(), rollout.lengths.tolist(), rollout.stopped.tolist()
        for j, i in enumerate(chunk):
            samples = []
            for s in range(j * n, (j + 1) * n):
                text = tokenizer.decode(tokens[s][:lengths[s] - int(stopped[s])])  # without the stop token
                samples.append({"completion": text, "answer": extract_answer(prefix + text),
                                "correct": correctness_reward(prefix + text, rows[i]["gold"], not stopped[s]) == 1.0,
                                "format": format_reward(prefix + text, rows[i]["gold"]) == 1.0,
                                "length": lengths[s], "truncated": not stopped[s]})
            records[i] = {"question": rows[i]["question"], "gold": rows[i]["gold"], "samples": samples}
    model.train(was_training)

    correct = [sum(s["correct"] for s in r["samples"]) for r in records]
    flat = [s for r in records for s in r["samples"]]
    summary = {"pass@1": sum(pass_at_k(n, c, 1) for c in correct) / len(rows),
               **{f"pass@{k}": sum(pass_at_k(n, c, k) for c in correct) / len(rows) for k in ks if 1 < k <= n},
               "format_rate": sum(s["format"] for s in flat) / len(flat),
               "response_length": sum(s["length"] for s in flat) / len(flat),
               "truncation_rate": sum(s["truncated"] for s in flat) / len(flat),
               "questions": len(rows), "n": n, "temperature": temperature}
    if out_path:
        with open(out_path, "w") as f:
            f.writelines(json.dumps({"question": r["question"], "gold": r["gold"], **s}) + "\n"
                         for r in records for s in r["samples"])
    return summary


def load_model(name: str, device, tokenizer_name: str = ""):
    """(model, tokenizer, run config) from a train.py checkpoint (.pt) or a Hugging Face name/directory; the run
    config is the checkpoint's TrainConfig as a dict ({} for Hugging Face models): it supplies eval defaults."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if name.endswith(".pt"):
        if not os.path.isfile(name):
            raise FileNotFoundError(f"checkpoint {name} not found")
        state = torch.load(name, map_location="cpu", weights_only=True)
        model = Transformer(ModelConfig(**state["model_config"]))
        model.load_state_dict(state["model"])
        run_config = state["config"]
        tokenizer_name = tokenizer_name or run_config["tokenizer"] or run_config["model"]
    else:
        model = Transformer.from_pretrained(name, dtype=dtype)
        run_config = {}
        tokenizer_name = tokenizer_name or name
    return model.to(device=device, dtype=dtype), load_tokenizer(tokenizer_name), run_config


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="Hugging Face name or dir, or a train.py checkpoint (.pt)")
    parser.add_argument("--data", required=True, help="GSM8K-format JSONL: {question, answer ending '#### N'}")
    parser.add_argument("--n", type=int, default=1, help="samples per question")
    parser.add_argument("--k", default="1", help="comma-separated k for pass@k (each <= n)")
    parser.add_argument("--temperature", type=float, default=None, help="default: 0 (greedy) if n == 1, else 1")
    parser.add_argument("--max_new_tokens", type=int, default=0, help="default: the checkpoint's, or 512")
    parser.add_argument("--template", default="", help="prompt template (default: the checkpoint's, or r1_zero)")
    parser.add_argument("--tokenizer", default="", help="default: the checkpoint's, or the model's own")
    parser.add_argument("--limit", type=int, default=0, help="evaluate only the first L questions")
    parser.add_argument("--batch_size", type=int, default=64, help="completions per generate call")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="", help="output dir (default: CKPT_eval/ beside a .pt, else out/eval/NAME)")
    args = parser.parse_args(argv)

    ks = tuple(int(k) for k in args.k.split(","))
    if any(k < 1 or k > args.n for k in ks):
        parser.error(f"every k must be between 1 and n={args.n}, got --k {args.k}")
    temperature = args.temperature if args.temperature is not None else (0.0 if args.n == 1 else 1.0)
    rows = load_gsm8k_file(args.data)[:args.limit or None]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer, run_config = load_model(args.model, device, args.tokenizer)
    template = args.template or run_config.get("template", "r1_zero")
    max_new_tokens = args.max_new_tokens or run_config.get("max_new_tokens", 512)
    if args.model.endswith(".pt"):  # out/demo/ckpt.pt -> out/demo/ckpt_eval: beside the run it scores
        out_dir = args.out or os.path.splitext(args.model)[0] + "_eval"
    else:
        out_dir = args.out or os.path.join("out", "eval", os.path.basename(os.path.normpath(args.model)))
    os.makedirs(out_dir, exist_ok=True)
    summary = evaluate(model, tokenizer, rows, template=template, n=args.n, temperature=temperature, ks=ks,
                       max_new_tokens=max_new_tokens, batch_size=args.batch_size, seed=args.seed,
                       out_path=os.path.join(out_dir, "completions.jsonl"))
    summary.update(model=args.model, data=args.data, template=template)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    for key, value in summary.items():
        if key.startswith("pass@"):
            print(f"{key}: {value:.4f}")
    print(f"completions: {os.path.join(out_dir, 'completions.jsonl')}; summary: {os.path.join(out_dir, 'summary.json')}")
    return summary


if __name__ == "__main__":
    main()
