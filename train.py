"""
R1-Zero-style reinforcement learning: GRPO (DeepSeekMath, arXiv:2402.03300) on math word problems with
rule-based rewards only (DeepSeek-R1-Zero, arXiv:2501.12948), on one device.

    python train.py configs/gsm8k.py                  # Qwen2.5 on GSM8K, one GPU
    python train.py configs/demo.py                   # a tiny model on synthetic problems, a laptop CPU
    python train.py configs/demo.py --lr=1e-3         # --key=value overrides any TrainConfig field
    python train.py configs/demo.py --resume          # continue from out_dir/ckpt.pt exactly where it stopped

One step: draw prompts_per_step questions; sample group_size completions of each; score them with the
rule-based rewards; turn the rewards into group-relative advantages; take mu optimizer steps on the
clipped-ratio objective, with a k3 KL penalty towards a frozen reference model when beta > 0.
"""
import ast
import contextlib
import copy
import dataclasses
import difflib
import json
import math
import os
import random
import runpy
import shutil
import sys
import time
import types
import typing
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from tqdm import tqdm

from data import (format_prompt, load_gsm8k, load_tokenizer, response_prefix, stop_token_ids,
                  synthetic_problems, write_jsonl)
from eval import evaluate
from grpo import group_advantages, grpo_loss, zero_std_group_fraction
from model import ModelConfig, Transformer
from rewards import score_completions
from sample import generate


@dataclass
class TrainConfig:
    # model, tokenizer, prompt
    model: str = "Qwen/Qwen2.5-0.5B"  # Hugging Face name or local dir, or "scratch": a new model of shape model_args
    model_args: dict = field(default_factory=dict)  # ModelConfig fields for model="scratch" (vocab_size defaults to the tokenizer's)
    tokenizer: str = ""  # "" = the model's own; "char" = data.CharTokenizer
    template: str = "r1_zero"  # data.TEMPLATES; every template ends the prompt with "<think>"
    # data
    dataset: str = "gsm8k"  # "gsm8k": data_dir/{train_split,eval_split}.jsonl; "synthetic": data.synthetic_problems
    data_dir: str = "data/gsm8k"
    train_split: str = "train"
    eval_split: str = "test"
    synthetic_train_size: int = 5000
    synthetic_eval_size: int = 200
    synthetic_args: dict = field(default_factory=dict)  # extra keyword arguments of data.synthetic_problems
    # sampling
    group_size: int = 8  # G completions per question
    prompts_per_step: int = 32
    max_new_tokens: int = 512
    temperature: float = 1.0  # log-probs for the ratio use the same temperature (no top-p/top-k: stay on-policy)
    # objective
    reward_weights: dict = field(default_factory=lambda: {"correctness": 1.0, "format": 0.1})
    adv_baseline: str = "mean"  # "mean" (GRPO) | "rloo" | "none" (REINFORCE)
    adv_scale: str = "std"  # "std" (GRPO) | "none" (Dr. GRPO)
    loss_agg: str = "seq_mean"  # "seq_mean" (GRPO) | "token_mean" (DAPO) | "constant" (Dr. GRPO, / max_new_tokens)
    beta: float = 0.04  # KL weight; 0 = no reference model at all
    clip_eps: float = 0.2
    clip_eps_high: float | None = None  # None = clip_eps; larger for DAPO's clip-higher
    mu: int = 1  # optimizer steps per batch of samples; > 1 computes old log-probs once before the first
    ref_reset_every: int = 0  # iterative GRPO: copy the policy into the reference every N steps (0 = never)
    # optimization
    max_steps: int = 200
    lr: float = 1e-6
    warmup_steps: int = 10
    weight_decay: float = 0.0
    adam_betas: tuple = (0.9, 0.99)
    grad_clip: float = 1.0  # max global grad norm; 0 = no clipping
    micro_batch_size: int = 16  # completions per forward/backward; the loss normalisers are whole-batch
    logprob_chunk: int = 2048  # completion tokens per lm_head + log_softmax chunk (bounds the logits memory)
    grad_checkpointing: bool = False
    # supervised warm start (the SFT stage of the R1 pipeline): worked solutions as "...</think> <answer>N</answer>"
    sft_steps: int = 0
    sft_batch_size: int = 32
    sft_lr: float = 1e-4
    # evaluation, logging, checkpoints
    eval_every: int = 25  # held-out pass@1 (greedy) before step 1, every N steps and at the end; 0 = never
    eval_size: int = 500  # held-out questions used (the first N)
    eval_batch_size: int = 64
    sample_every: int = 10  # print and save a few completions every N steps; 0 = never
    checkpoint_every: int = 50  # and at the end
    out_dir: str = "out/gsm8k"
    resume: bool = False
    # system
    seed: int = 1337
    device: str = "auto"  # "auto" (cuda if available) | "cuda" | "cpu"
    dtype: str = "auto"  # compute dtype of forward passes: "auto" (bfloat16 on cuda, float32 on cpu) | "bfloat16" | "float32"

    def __post_init__(self):
        choices = {"dataset": ("gsm8k", "synthetic"), "adv_baseline": ("mean", "rloo", "none"),
                   "adv_scale": ("std", "none"), "loss_agg": ("seq_mean", "token_mean", "constant"),
                   "device": ("auto", "cuda", "cpu"), "dtype": ("auto", "bfloat16", "float32")}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"config key {key!r} must be one of {allowed}, got {getattr(self, key)!r}")
        for key in ("group_size", "prompts_per_step", "max_new_tokens", "mu", "micro_batch_size", "logprob_chunk",
                    "eval_batch_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"config key {key!r} must be >= 1, got {getattr(self, key)}")

# -----------------------------------------------------------------------------
# config: a plain-Python file (nanoGPT style), then --key=value overrides


def _type_name(hint) -> str:
    return " or ".join("None" if t is type(None) else t.__name__ for t in (typing.get_args(hint) or (hint,)))


def _coerce(key: str, value, hint, source: str):
    """Check (and for command-line text, convert) one value against its field's type; clear error otherwise."""
    allowed = typing.get_args(hint) or (hint,)
    if isinstance(value, str) and source == "command line" and str not in allowed:
        text = value.strip()
        if type(None) in allowed and text.lower() in ("none", "null"):
            return None
        if bool in allowed and text.lower() in ("true", "false", "1", "0", "yes", "no"):
            return text.lower() in ("true", "1", "yes")
        try:
            value = ast.literal_eval(text)  # numbers, dicts, tuples, lists
        except (ValueError, SyntaxError):
            pass
    for kind in allowed:
        if kind is type(None) and value is None:
            return None
        if kind is bool and isinstance(value, bool):
            return value
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if kind is tuple and isinstance(value, (tuple, list)):
            return tuple(value)
        if kind in (str, dict) and isinstance(value, kind):
            return value
    raise ValueError(f"config key {key!r} expects {_type_name(hint)}, got {value!r} ({source})")


def load_config(argv: list[str]) -> TrainConfig:
    """`[CONFIG.py] [--key=value ...]` -> TrainConfig. A bare `--flag` sets a bool key to true.
    The config file is Python assigning variables; names starting with "_", modules and functions are ignored."""
    hints = typing.get_type_hints(TrainConfig)
    values = {}

    def put(key, value, source):
        if key not in hints:
            close = difflib.get_close_matches(key, hints, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown config key {key!r} ({source}){hint}")
        values[key] = _coerce(key, value, hints[key], source)

    for arg in argv:
        if arg.startswith("--"):
            key, has_value, text = arg[2:].partition("=")
            if not has_value and hints.get(key) is not bool:
                raise ValueError(f"{arg}: write --{key}=VALUE (only bool keys may be given bare)")
            put(key, text if has_value else "true", "command line")
        else:
            if not os.path.isfile(arg):
                raise FileNotFoundError(f"config file {arg} not found")
            for key, value in runpy.run_path(arg).items():
                if not (key.startswith("_") or isinstance(value, (types.ModuleType, types.FunctionType, type))):
                    put(key, value, arg)
    return TrainConfig(**values)

# -----------------------------------------------------------------------------
# data


def load_problems(cfg: TrainConfig) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows) with keys "question", "solution", "gold"."""
    if cfg.dataset == "gsm8k":
        # a missing file raises FileNotFoundError naming the path and the download command
        return load_gsm8k(cfg.data_dir, cfg.train_split), load_gsm8k(cfg.data_dir, cfg.eval_split)[:cfg.eval_size]
    # different seeds for the two sets; a held-out question that happens to occur in training is dropped
    train = synthetic_problems(cfg.synthetic_train_size, seed=cfg.seed, **cfg.synthetic_args)
    seen = {row["question"] for row in train}
    heldout = [row for row in synthetic_problems(cfg.synthetic_eval_size, seed=cfg.seed + 1, **cfg.synthetic_args)
               if row["question"] not in seen]
    assert seen.isdisjoint(row["question"] for row in heldout)
    return train, heldout[:cfg.eval_size]


class QuestionStream:
    """Question indices in shuffled epochs from a seeded RNG; its whole state goes into the checkpoint."""

    def __init__(self, n: int, seed: int):
        self.n, self.rng, self.order, self.cursor = n, random.Random(seed), [], 0

    def next(self, k: int) -> list[int]:
        picked = []
        while len(picked) < k:
            if self.cursor == len(self.order):
                self.order, self.cursor = list(range(self.n)), 0
                self.rng.shuffle(self.order)
            take = min(k - len(picked), len(self.order) - self.cursor)
            picked += self.order[self.cursor:self.cursor + take]
            self.cursor += take
        return picked

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), "order": self.order, "cursor": self.cursor}

    def load_state_dict(self, state: dict):
        self.rng.setstate(state["rng"])
        self.order, self.cursor = list(state["order"]), state["cursor"]


def check_context(prompts: list[list[int]], max_new_tokens: int, context: int):
    """A prompt plus its completion must fit the model's positions; say which lengths do not."""
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
    if len(prompts[longest]) + max_new_tokens > context:
        raise ValueError(f"prompt #{longest} is {len(prompts[longest])} tokens; with max_new_tokens={max_new_tokens} "
                         f"that is {len(prompts[longest]) + max_new_tokens}, longer than the model's context of "
                         f"{context} tokens: lower max_new_tokens or use shorter prompts")


def sft_text(row: dict) -> str:
    """The warm-start target after the prompt's "<think>": the worked solution, then the tagged answer.
    GSM8K's calculator annotations <<a*b=c>> and its final "#### N" line are dropped."""
    lines = [line for line in row["solution"].splitlines() if not line.lstrip().startswith("####")]
    reasoning = "\n".join(lines)
    while "<<" in reasoning and ">>" in reasoning.split("<<", 1)[1]:
        before, rest = reasoning.split("<<", 1)
        reasoning = before + rest.split(">>", 1)[1]
    return f"{reasoning.strip()}</think> <answer>{row['gold']}</answer>"

# -----------------------------------------------------------------------------
# sequences and per-token log-probs


@dataclass
class MicroBatch:
    ids: torch.Tensor  # [b, P + N] left-padded prompt, then completion
    attention_mask: torch.Tensor  # [b, P + N] bool, real tokens
    mask: torch.Tensor  # [b, N] bool, completion tokens (stop token included)
    prompt_width: int  # P
    advantages: torch.Tensor  # [b] float32
    rows: list[int]  # which rows of the step's batch
    old_logp: torch.Tensor | None = None  # [b, N] under the sampling policy (mu > 1 only)
    ref_logp: torch.Tensor | None = None  # [b, N] under the reference model (beta > 0 only)


def pack(prompts: list[list[int]], completions: list[list[int]], pad_id: int):
    """Left-pad prompts, append completions: -> ids [b, P+N], attention_mask [b, P+N], mask [b, N], P.
    The completion mask comes from the lengths, never from token values (Qwen's pad token is its EOS)."""
    width, n_new = max(map(len, prompts)), max(map(len, completions))
    ids = torch.full((len(prompts), width + n_new), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(ids, dtype=torch.bool)
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        ids[i, width - len(prompt):width + len(completion)] = torch.tensor(prompt + completion)
        attention_mask[i, width - len(prompt):width + len(completion)] = True
    return ids, attention_mask, attention_mask[:, width:].clone(), width


def _chunk_logprobs(lm_head, hidden, targets, temperature):
    """hidden [M, dim], targets [M] -> (log-prob of each target [M] fp32, summed entropy 0-d, no grad)."""
    logits = lm_head(hidden).float() / temperature
    log_z = logits.logsumexp(dim=-1)
    chosen = logits.gather(-1, targets[:, None]).squeeze(-1) - log_z
    with torch.no_grad():
        entropy = (log_z - (logits.softmax(dim=-1) * logits).sum(dim=-1)).sum()
    return chosen, entropy


def completion_logprobs(model, batch: MicroBatch, temperature: float, chunk: int):
    """Log-probs [b, N] fp32 (zero off the mask) of the completion tokens, and their summed entropy (0-d, no grad).
    Logits at position t score token t+1. Only masked positions go through lm_head, chunk tokens at a time; under
    autograd each chunk is recomputed in backward, so the full-vocab logits of the micro-batch never coexist."""
    hidden = model(batch.ids, attention_mask=batch.attention_mask, return_hidden=True)
    hidden = hidden[:, batch.prompt_width - 1:-1][batch.mask]  # [M, dim]: the positions that predict completions
    targets = batch.ids[:, batch.prompt_width:][batch.mask]  # [M]
    pieces, entropy = [], torch.zeros((), device=hidden.device)
    for start in range(0, targets.numel(), chunk):
        args = (model.lm_head, hidden[start:start + chunk], targets[start:start + chunk], temperature)
        if torch.is_grad_enabled():
            logp, ent = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            logp, ent = _chunk_logprobs(*args)
        pieces.append(logp)
        entropy = entropy + ent
    values = torch.cat(pieces) if pieces else hidden.new_zeros(0, dtype=torch.float32)
    return torch.zeros(batch.mask.shape, device=values.device).masked_scatter(batch.mask, values), entropy


def make_micro_batches(prompts, completions, advantages, size: int, pad_id: int, device) -> list[MicroBatch]:
    """Split the step's rows into micro-batches of similar total length (less padding); any split is exact
    because the loss normalisers are whole-batch."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(completions[i]))
    batches = []
    for start in range(0, len(order), size):
        rows = order[start:start + size]
        ids, attention_mask, mask, width = pack([prompts[i] for i in rows], [completions[i] for i in rows], pad_id)
        batches.append(MicroBatch(ids.to(device), attention_mask.to(device), mask.to(device), width,
                                  advantages[rows].to(device), rows))
    return batches


def accumulate_gradients(policy, batches: list[MicroBatch], cfg: TrainConfig, autocast) -> dict:
    """One pass of forward/backward over the micro-batches (gradients add up to the whole batch's).
    Returns summed stats as 0-d tensors: loss, entropy and token-weighted grpo_loss stats (no host sync)."""
    n_seq = sum(b.mask.shape[0] for b in batches)
    n_tok = sum(b.mask.sum() for b in batches)
    totals = {}
    for batch in batches:
        with autocast:
            logp, entropy = completion_logprobs(policy, batch, cfg.temperature, cfg.logprob_chunk)
        loss, stats = grpo_loss(logp, batch.old_logp, batch.ref_logp, batch.advantages, batch.mask,
                                clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high, beta=cfg.beta,
                                loss_agg=cfg.loss_agg, num_sequences=n_seq, num_tokens=n_tok,
                                constant_norm=cfg.max_new_tokens)
        loss.backward()
        tokens = batch.mask.sum()
        for key, value in [("loss", loss.detach()), ("entropy", entropy)] + [(k, v * tokens) for k, v in stats.items()]:
            totals[key] = totals.get(key, 0) + value
    return totals


@torch.no_grad()
def attach_logprobs(model, batches: list[MicroBatch], attr: str, cfg: TrainConfig, autocast):
    """Fill batch.<attr> ("old_logp" or "ref_logp") with the completion log-probs under `model`."""
    for batch in batches:
        with autocast:
            setattr(batch, attr, completion_logprobs(model, batch, cfg.temperature, cfg.logprob_chunk)[0])

# -----------------------------------------------------------------------------
# warm start, one GRPO step


def supervised_warm_start(model, rows, prompts, tokenizer, cfg: TrainConfig, device, autocast, log_path):
    """Next-token cross-entropy on the completion part of sft_text(row) + stop token (the R1 pipeline's SFT stage)."""
    stop = stop_token_ids(tokenizer)[0]
    targets = [tokenizer.encode(sft_text(row)) + [stop] for row in rows]
    optimizer = make_optimizer(model, cfg.sft_lr, cfg, device)
    rng = random.Random(cfg.seed)
    bar = tqdm(range(1, cfg.sft_steps + 1), desc="sft", dynamic_ncols=True)
    with open(log_path, "w") as log:
        for step in bar:
            picked = rng.sample(range(len(rows)), min(cfg.sft_batch_size, len(rows)))
            ones = torch.ones(len(picked))
            batches = make_micro_batches([prompts[i] for i in picked], [targets[i] for i in picked], ones,
                                         cfg.micro_batch_size, tokenizer.pad_token_id, device)
            n_tok = sum(b.mask.sum() for b in batches)
            for group in optimizer.param_groups:
                group["lr"] = cfg.sft_lr * min(1.0, step / max(1, cfg.warmup_steps))
            loss = 0
            for batch in batches:
                with autocast:
                    logp, _ = completion_logprobs(model, batch, 1.0, cfg.logprob_chunk)
                micro_loss = -(logp * batch.mask).sum() / n_tok
                micro_loss.backward()
                loss += micro_loss.detach()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss = loss.item()
            bar.set_postfix(loss=f"{loss:.3f}")
            log.write(json.dumps({"step": step, "loss": loss}) + "\n")


def _step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step) % 2 ** 31  # distinct per (seed, step): a resumed run draws the same samples


def grpo_step(step, policy, sampler, reference, optimizer, rows, prompts, stream, tokenizer, cfg, device, autocast):
    """Sample, score, and update once; returns (log record, sample texts). One host sync for the stats."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    G = cfg.group_size
    picked = stream.next(cfg.prompts_per_step)
    batch_prompts = [prompts[i] for i in picked for _ in range(G)]  # each group is G consecutive rows
    golds = [rows[i]["gold"] for i in picked for _ in range(G)]

    t0 = time.perf_counter()
    rollout = generate(sampler, batch_prompts, cfg.max_new_tokens, temperature=cfg.temperature,
                       stop_ids=stop_token_ids(tokenizer), seed=_step_seed(cfg.seed, step),
                       pad_id=tokenizer.pad_token_id)
    tokens, lengths, stopped = rollout.tokens.tolist(), rollout.lengths.tolist(), rollout.stopped.tolist()
    completions = [tokens[i][:lengths[i]] for i in range(len(tokens))]
    texts = [tokenizer.decode(c[:len(c) - int(s)]) for c, s in zip(completions, stopped)]  # text without the stop token
    t1 = time.perf_counter()

    prefix = response_prefix(cfg.template)  # the prompt's "<think>": format_reward judges the whole response
    totals, components = score_completions([prefix + t for t in texts], golds, [not s for s in stopped],
                                           cfg.reward_weights)
    rewards = torch.tensor(totals)
    advantages = group_advantages(rewards, G, baseline=cfg.adv_baseline, scale=cfg.adv_scale)
    batches = make_micro_batches(batch_prompts, completions, advantages, cfg.micro_batch_size,
                                 tokenizer.pad_token_id, device)
    if reference is not None:
        attach_logprobs(reference, batches, "ref_logp", cfg, autocast)
    if cfg.mu > 1:
        attach_logprobs(policy, batches, "old_logp", cfg, autocast)
    sync()
    t2 = time.perf_counter()

    lr = cfg.lr * min(1.0, step / max(1, cfg.warmup_steps))
    for group in optimizer.param_groups:
        group["lr"] = lr
    sums, grad_norms = {}, []
    for _ in range(cfg.mu):
        stats = accumulate_gradients(policy, batches, cfg, autocast)
        for key, value in stats.items():
            sums[key] = sums.get(key, 0) + value / cfg.mu
        grad_norms.append(torch.nn.utils.clip_grad_norm_(policy.parameters(),
                                                         cfg.grad_clip if cfg.grad_clip > 0 else math.inf))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if sampler is not policy:
        sampler.load_state_dict(policy.state_dict())  # the bf16 sampling copy follows the fp32 master weights
    n_tok = sum(lengths)
    names = list(sums) + ["grad_norm"]
    values = torch.stack([torch.as_tensor(sums[k], dtype=torch.float32, device=device) for k in sums]
                         + [torch.stack(grad_norms).float().mean()]).tolist()  # the one host sync of the stats
    stat = dict(zip(names, values))
    t3 = time.perf_counter()

    record = {"step": step, "reward": sum(totals) / len(totals),
              **{f"reward_{name}": sum(v) / len(v) for name, v in components.items()},
              "accuracy": sum(components["correctness"]) / len(totals) if "correctness" in components else None,
              "response_length": n_tok / len(lengths), "response_length_max": max(lengths),
              "truncation_rate": 1 - sum(stopped) / len(stopped),
              "zero_std_frac": zero_std_group_fraction(rewards, G).item(),
              "loss": stat["loss"], "kl": stat["kl"] / n_tok, "clip_frac_low": stat["clip_frac_low"] / n_tok,
              "clip_frac_high": stat["clip_frac_high"] / n_tok, "ratio_mean": stat["ratio_mean"] / n_tok,
              "entropy": stat["entropy"] / n_tok, "grad_norm": stat["grad_norm"], "lr": lr,
              "tokens_per_s": n_tok / (t1 - t0), "time_sample": t1 - t0, "time_reference": t2 - t1,
              "time_update": t3 - t2}
    record = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in record.items()}
    samples = [{"step": step, "question": rows[picked[q]]["question"], "gold": golds[q * G],
                "completion": texts[q * G], "reward": totals[q * G]} for q in range(min(2, len(picked)))]
    return record, samples

# -----------------------------------------------------------------------------
# model, optimizer, checkpoints


def make_optimizer(model, lr: float, cfg: TrainConfig, device) -> torch.optim.AdamW:
    """AdamW on fp32 parameters; weight decay on matrices only (not norms, biases)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=cfg.adam_betas, fused=device.type == "cuda")


def frozen_copy(model, dtype) -> Transformer:
    return copy.deepcopy(model).to(dtype=dtype).eval().requires_grad_(False)


def build_policy(cfg: TrainConfig, tokenizer, device, model_config: dict | None = None) -> Transformer:
    """fp32 policy: from model_config (a checkpoint's, weights to be loaded), from scratch, or pretrained."""
    if model_config is not None:
        model = Transformer(ModelConfig(**model_config))
    elif cfg.model == "scratch":
        torch.manual_seed(cfg.seed)
        model = Transformer(ModelConfig(**{"vocab_size": len(tokenizer), **cfg.model_args}))
    else:
        model = Transformer.from_pretrained(cfg.model, dtype=torch.float32)
    if model.config.vocab_size < len(tokenizer):
        raise ValueError(f"the model's vocab_size {model.config.vocab_size} is smaller than the tokenizer's "
                         f"{len(tokenizer)} tokens")
    model.grad_checkpointing = cfg.grad_checkpointing
    return model.to(device)


def save_checkpoint(path: str, state: dict):
    """Write to a temporary file, then rename: a crash mid-write leaves the previous checkpoint intact."""
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def keep_lines_up_to(path: str, step: int):
    """On resume, drop log lines written after the checkpoint (the steps are about to be redone)."""
    if os.path.isfile(path):
        with open(path) as f:
            lines = [line for line in f if json.loads(line)["step"] <= step]
        with open(path, "w") as f:
            f.writelines(lines)

# -----------------------------------------------------------------------------
# the run


def train(cfg: TrainConfig) -> dict:
    """Run (or resume) training; returns {"pass@1_start": ..., "pass@1_end": ..., "step": ...}."""
    device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                          cfg.device if cfg.device != "auto" else "cpu")
    dtype = {"auto": torch.bfloat16 if device.type == "cuda" else torch.float32,
             "bfloat16": torch.bfloat16, "float32": torch.float32}[cfg.dtype]
    # fp32 master weights and optimizer state; bf16 forward passes via autocast (plain bf16 AdamW rounds lr 1e-6 away)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()
    os.makedirs(cfg.out_dir, exist_ok=True)
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    log_path, eval_path, samples_path = (os.path.join(cfg.out_dir, name)
                                         for name in ("log.jsonl", "eval.jsonl", "samples.jsonl"))

    tokenizer = load_tokenizer(cfg.tokenizer or cfg.model)
    rows, heldout = load_problems(cfg)
    write_jsonl(heldout, os.path.join(cfg.out_dir, "heldout.jsonl"))  # what `python eval.py --data` can re-score
    prompts = [tokenizer.encode(format_prompt(row["question"], cfg.template)) for row in rows]
    state = None
    if cfg.resume:
        if not os.path.isfile(ckpt_path):
            raise FileNotFoundError(f"resume=True but there is no checkpoint at {ckpt_path}")
        state = torch.load(ckpt_path, map_location=device, weights_only=True)
    policy = build_policy(cfg, tokenizer, device, state and state["model_config"])
    heldout_prompts = [tokenizer.encode(format_prompt(row["question"], cfg.template)) for row in heldout]
    check_context(prompts + heldout_prompts, cfg.max_new_tokens, policy.config.max_seq_len)
    with open(os.path.join(cfg.out_dir, "config.json"), "w") as f:
        json.dump(dataclasses.asdict(cfg), f, indent=2)

    stream = QuestionStream(len(rows), cfg.seed)
    if state is not None:
        policy.load_state_dict(state["model"])
        stream.load_state_dict(state["stream"])
        random.setstate(state["python_rng"])
        torch.set_rng_state(state["torch_rng"].cpu())
        for path in (log_path, eval_path, samples_path):
            keep_lines_up_to(path, state["step"])
    else:
        for path in (log_path, eval_path, samples_path):
            open(path, "w").close()
        if cfg.sft_steps > 0:
            supervised_warm_start(policy, rows, prompts, tokenizer, cfg, device, autocast,
                                  os.path.join(cfg.out_dir, "sft_log.jsonl"))
    start = state["step"] if state else 0

    reference = None
    if cfg.beta > 0:
        reference = frozen_copy(policy, dtype)
        if state is not None and "reference" in state:
            reference.load_state_dict(state["reference"])
        elif state is not None and cfg.model != "scratch":
            reference.load_state_dict(Transformer.from_pretrained(cfg.model).state_dict())
    sampler = frozen_copy(policy, dtype) if device.type == "cuda" else policy
    optimizer = make_optimizer(policy, cfg.lr, cfg, device)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
    # the reference must be saved unless it is exactly the pretrained checkpoint that cfg.model names
    save_reference = reference is not None and (cfg.model == "scratch" or cfg.sft_steps > 0 or cfg.ref_reset_every > 0)

    def checkpoint_now(step):
        save_checkpoint(ckpt_path, {
            "model": policy.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
            "config": dataclasses.asdict(cfg), "model_config": dataclasses.asdict(policy.config),
            "stream": stream.state_dict(), "python_rng": random.getstate(), "torch_rng": torch.get_rng_state(),
            **({"reference": reference.state_dict()} if save_reference else {})})

    def held_out_eval(step):
        result = evaluate(sampler, tokenizer, heldout, template=cfg.template, max_new_tokens=cfg.max_new_tokens,
                          batch_size=cfg.eval_batch_size, out_path=os.path.join(cfg.out_dir, f"eval_{step:05d}.jsonl"),
                          desc=f"eval@{step}")
        with open(eval_path, "a") as f:
            f.write(json.dumps({"step": step, **result}) + "\n")
        tqdm.write(f"step {step}: held-out pass@1 {result['pass@1']:.3f} ({len(heldout)} questions, greedy)")
        return result["pass@1"]

    summary = {"pass@1_start": None, "pass@1_end": None}
    if state is None:
        if cfg.eval_every > 0:
            summary["pass@1_start"] = held_out_eval(0)
        checkpoint_now(0)  # a resume point after the warm start
        if cfg.sft_steps > 0:  # kept after ckpt.pt moves on: eval.py can score the warm start alone
            shutil.copyfile(ckpt_path, os.path.join(cfg.out_dir, "sft.pt"))
    bar = tqdm(range(start + 1, cfg.max_steps + 1), initial=start, total=cfg.max_steps, desc="grpo",
               dynamic_ncols=True)
    for step in bar:
        policy.train()
        record, samples = grpo_step(step, policy, sampler, reference, optimizer, rows, prompts, stream, tokenizer,
                                    cfg, device, autocast)
        with open(log_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        bar.set_postfix(reward=f"{record['reward']:.3f}", acc=f"{record['accuracy']:.3f}",
                        len=f"{record['response_length']:.0f}", kl=f"{record['kl'] or 0:.4f}")
        if cfg.sample_every and step % cfg.sample_every == 0:
            with open(samples_path, "a") as f:
                f.writelines(json.dumps(s) + "\n" for s in samples)
            tqdm.write(f"step {step} sample (reward {samples[0]['reward']:.2f}, gold {samples[0]['gold']}): "
                       f"{samples[0]['completion'][:300]!r}")
        if reference is not None and cfg.ref_reset_every and step % cfg.ref_reset_every == 0:
            reference.load_state_dict(policy.state_dict())  # iterative GRPO
        if cfg.eval_every > 0 and (step % cfg.eval_every == 0 or step == cfg.max_steps):
            summary["pass@1_end"] = held_out_eval(step)
        if step % cfg.checkpoint_every == 0 or step == cfg.max_steps:
            checkpoint_now(step)
    bar.close()
    summary["step"] = cfg.max_steps
    try:
        import matplotlib  # noqa: F401  (optional: the plot is a bonus)
    except ImportError:
        pass
    else:
        from plot import plot_run
        tqdm.write(f"curves: {plot_run(cfg.out_dir)}")
    return summary


if __name__ == "__main__":
    result = train(load_config(sys.argv[1:]))
    print(json.dumps(result))
