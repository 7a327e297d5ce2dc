"""
R1-Zero-style reinforcement learning: GRPO (DeepSeekMath, arXiv:2402.03300) on math word problems with
rule-based rewards only (DeepSeek-R1-Zero, arXiv:2501.12948), on one device, or data-parallel under torchrun.

    python train.py configs/gsm8k.py                  # Qwen2.5 on GSM8K, one GPU
    python train.py configs/demo.py                   # a tiny model on synthetic problems, a laptop CPU
    python train.py configs/demo.py --lr=1e-3         # --key=value overrides any TrainConfig field
    python train.py configs/demo.py --resume          # continue out_dir/ckpt.pt exactly where it stopped
    python train.py configs/demo.py --overwrite       # start again in an out_dir that already holds a run
    torchrun --standalone --nproc_per_node=8 train.py configs/gsm8k.py   # 8 GPUs, DDP (--sharding=fsdp: FSDP2)

One step (grpo_step): draw prompts_per_step questions; sample group_size completions of each; score them with the
rewards reward_weights names; normalise the rewards within each group into advantages (per token with process
supervision: the arithmetic steps' rewards); take mu optimizer steps on the clipped-ratio objective, with a k3 KL penalty toward a frozen reference model when beta > 0.
The novel-split demo's baselines run through the same loop (--algorithm): rft_step (rejection-sampling fine-tuning
on the same samples) and sft_step (supervised steps: answers only, or more of the warm start's family).
"""
import ast
import contextlib
import copy
import dataclasses
import difflib
import glob
import importlib.util
import inspect
import json
import math
import os
import random
import runpy
import shutil
import signal
import statistics
import sys
import threading
import time
import types
import typing
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from data import demo_split, encode_prompt, has_worked_solution, load_gsm8k, load_tokenizer, response_prefix, \
    synthetic_problems, write_jsonl
from distributed import all_samples, copy_weights, from_every_rank, gathered_to_rank0, init_distributed, rank, \
    shard_optimizer_state, spread, summed_over_ranks, whole, world_size
from eval import Samples, model_from_checkpoint, read_checkpoint, sample_and_score, score_questions, summarize, \
    write_completions
from grpo import group_advantages, grpo_loss, process_advantages, zero_std_group_fraction
from logprobs import add_logprobs, completion_logprobs, make_micro_batches
from model import LORA_TARGETS, ModelConfig, Transformer, resolve_device
from reward_models import check_reward_names, load_rewards, reward_log_name
from sample import check_context
from sft import optimizer_step, sft_loss_backward, sft_target, warm_start, warmup_lr


@dataclass
class TrainConfig:
    # model, tokenizer, prompt
    model: str = "Qwen/Qwen2.5-0.5B"  # Hugging Face name or local dir, or "scratch": a new model of shape model_args
    model_args: dict = field(default_factory=dict)  # ModelConfig fields for model="scratch" (vocab_size defaults to the tokenizer's)
    gguf_file: str = ""  # a GGUF file inside `model` (a local dir or hub repo) to load the weights and tokenizer from
    tokenizer: str = ""  # "" = the model's own; "char" = data.CharTokenizer
    template: str = "r1_zero"  # data.TEMPLATES, or "chat": the tokenizer's chat template; the prompt ends in "<think>"
    # data
    # "gsm8k": data_dir/{train_split,eval_split}.jsonl; "synthetic": data.synthetic_problems; "demo": data.demo_split
    # (a warm-start family with worked solutions, an answer-only RL family, a held-out set of novel chains)
    dataset: str = "gsm8k"
    data_dir: str = "data/gsm8k"
    train_split: str = "train"
    eval_split: str = "test"
    synthetic_warm_size: int = 5000  # "demo": warm-start problems (worked solutions)
    synthetic_train_size: int = 5000  # training problems ("demo": the RL family, answer only)
    synthetic_eval_size: int = 200
    synthetic_args: dict = field(default_factory=dict)  # extra keyword arguments of data.synthetic_problems / demo_split
    data_seed: int | None = None  # "demo": the seed of its three sets (None: seed), so seeds can share one split
    # what a step does: "grpo", or a baseline on the same rows and completions per step: "rft" (sample as GRPO does,
    # SFT on the correct samples), "sft_answers" (SFT on the training rows: with dataset="demo" their answers alone,
    # "</think> <answer>N</answer>"), "sft_more" (SFT on the warm-start rows: more warm start)
    algorithm: str = "grpo"
    # sampling
    group_size: int = 8  # G completions per question
    prompts_per_step: int = 32
    max_new_tokens: int = 512
    temperature: float = 1.0  # > 0; log-probs for the ratio use the same temperature (no top-p/top-k: on-policy)
    # objective (grpo.py checks the variant names)
    # {reward: weight}, the total is the weighted sum; a reward is "correctness", "format", "FILE.py:FUNCTION",
    # "model:NAME[:LABEL]" (a reward model) or "judge:NAME" (an LLM judge): see reward_models.py
    reward_weights: dict = field(default_factory=lambda: {"correctness": 1.0, "format": 0.1})
    supervision: str = "outcome"  # "outcome" (an advantage per completion) | "process" (per token, arithmetic) | "both"
    process_weight: float = 1.0  # "both": advantage = outcome advantage + process_weight * process advantage
    adv_baseline: str = "mean"  # "mean" (GRPO) | "rloo" | "none" (REINFORCE)
    adv_scale: str = "std"  # "std" (GRPO) | "none" (Dr. GRPO)
    loss_agg: str = "seq_mean"  # "seq_mean" (GRPO) | "token_mean" (DAPO) | "constant" (Dr. GRPO, / max_new_tokens)
    beta: float = 0.04  # KL weight; 0 = no reference model at all
    clip_eps: float = 0.2
    clip_eps_high: float | None = None  # None = clip_eps; larger for DAPO's clip-higher
    mu: int = 1  # optimizer steps per batch of samples; > 1 computes old log-probs once before the first
    ref_reset_every: int = 0  # iterative GRPO: copy the policy into the reference every N steps (0 = never)
    # LoRA (model.py): only low-rank adapters train; the reference is the same network with its adapters off
    lora_rank: int = 0  # 0 = full fine-tuning
    lora_alpha: float = 16.0  # the update is scaled by lora_alpha / lora_rank
    lora_dropout: float = 0.0
    lora_targets: tuple = ("q_proj", "k_proj", "v_proj", "o_proj")  # any of model.LORA_TARGETS
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
    init_from: str = ""  # a train.py checkpoint (e.g. out/x/sft.pt) to start from instead of running the warm start
    # evaluation, logging, checkpoints
    eval_every: int = 25  # held-out pass@1 (greedy) before step 1, every N steps and at the end; 0 = never
    eval_size: int = 500  # held-out questions used (the first N)
    eval_batch_size: int = 64
    sample_every: int = 10  # print and save a few completions every N steps; 0 = never
    checkpoint_every: int = 50  # and at the end; 0 = only at the end
    out_dir: str = "out/gsm8k"
    resume: bool = False  # continue out_dir/ckpt.pt; its config wins, only RESUMABLE keys may differ
    overwrite: bool = False  # start again in an out_dir that holds a run, deleting that run's files
    # system
    seed: int = 1337
    device: str = "auto"  # "auto" (cuda if available) | "cuda" | "cpu"
    dtype: str = "auto"  # compute dtype of forward passes: "auto" (bfloat16 on cuda, float32 on cpu) | "bfloat16" | "float32"
    sharding: str = "ddp"  # under torchrun: "ddp" (replicas) | "fsdp" (FSDP2 shards weights, gradients, AdamW state)
    threads: int = 0  # CPU threads of torch, 0 = its default; CPU sums depend on it, so pinning it pins the run

    @property
    def warm_starts(self) -> bool:
        """This run begins with the supervised warm start (a new run; init_from starts from a checkpoint instead)."""
        return self.sft_steps > 0 and not self.init_from

    def __post_init__(self):
        hints = typing.get_type_hints(TrainConfig)
        for f in dataclasses.fields(self):
            setattr(self, f.name, checked_type(f.name, getattr(self, f.name), hints[f.name]))
        validate(self)


SUPERVISIONS = ("outcome", "process", "both")
# keys a resumed run may change: they do not change what is computed, only how often or in what pieces
RESUMABLE = ("max_steps", "eval_every", "eval_batch_size", "sample_every", "checkpoint_every", "micro_batch_size",
             "logprob_chunk", "grad_checkpointing", "device", "dtype", "sharding", "resume", "overwrite")
RUN_FILES = ("config.json", "log.jsonl", "eval.jsonl", "samples.jsonl", "sft_log.jsonl", "heldout.jsonl", "ckpt.pt",
             "sft.pt", "curves.png", "hf")

# -----------------------------------------------------------------------------
# config: a plain-Python file (nanoGPT style), then --key=value overrides; every value checked when it loads


def checked_type(key: str, value, hint):
    """value if it has the field's type (an int is a float, a list a tuple), else a ValueError naming the key."""
    kinds = typing.get_args(hint) or (hint,)
    if float in kinds and type(value) is int:
        return float(value)
    if tuple in kinds and type(value) is list:
        return tuple(value)
    if any(type(value) is kind for kind in kinds):
        return value
    names = " or ".join("None" if kind is type(None) else kind.__name__ for kind in kinds)
    raise ValueError(f"config key {key!r} expects {names}, got {value!r}")


def validate(cfg: TrainConfig):
    """Every setting checked before any work: a bad one stops the run here, not after the warm start."""
    def need(ok: bool, message: str):
        if not ok:
            raise ValueError(f"config: {message}")
    for key in ("group_size", "prompts_per_step", "max_new_tokens", "mu", "micro_batch_size", "logprob_chunk",
                "eval_batch_size", "sft_batch_size", "synthetic_train_size", "synthetic_eval_size"):
        need(getattr(cfg, key) >= 1, f"{key} must be >= 1, got {getattr(cfg, key)}")
    for key in ("max_steps", "warmup_steps", "sft_steps", "synthetic_warm_size", "eval_every", "eval_size",
                "sample_every", "checkpoint_every", "ref_reset_every", "beta", "weight_decay", "grad_clip", "threads"):
        need(getattr(cfg, key) >= 0, f"{key} must be >= 0, got {getattr(cfg, key)}")
    need(cfg.temperature > 0, f"temperature must be > 0, got {cfg.temperature}: GRPO needs the log-probs of a "
                              "sampling distribution (temperature 0 is greedy decoding)")
    need(cfg.lr > 0 and cfg.sft_lr > 0, f"lr and sft_lr must be > 0, got {cfg.lr} and {cfg.sft_lr}")
    need(len(cfg.adam_betas) == 2 and all(0 <= b < 1 for b in cfg.adam_betas),
         f"adam_betas must be two numbers in [0, 1), got {cfg.adam_betas}")
    need(cfg.eval_size >= 1 or cfg.eval_every == 0, "eval_size=0 with eval_every > 0: nothing to evaluate")
    need(cfg.dataset in ("gsm8k", "synthetic", "demo"), f"dataset must be 'gsm8k', 'synthetic' or 'demo', got "
                                                         f"{cfg.dataset!r}")
    need(cfg.model != "scratch" or cfg.tokenizer != "", "model='scratch' needs a tokenizer, e.g. tokenizer='char'")
    need(not cfg.model_args or cfg.model == "scratch", "model_args only apply to model='scratch'")
    need(not (cfg.resume and cfg.overwrite), "resume and overwrite exclude each other")
    need(cfg.lora_rank >= 0, f"lora_rank must be >= 0 (0 = no LoRA), got {cfg.lora_rank}")
    need(cfg.lora_rank == 0 or cfg.ref_reset_every == 0, "ref_reset_every with LoRA is not supported: the reference "
                                                         "is the base model with the adapters off")
    need(cfg.lora_rank == 0 or (set(cfg.lora_targets) <= set(LORA_TARGETS) and cfg.lora_targets),
         f"lora_targets must be a non-empty subset of {LORA_TARGETS}, got {cfg.lora_targets}")
    need(cfg.lora_alpha > 0 and 0 <= cfg.lora_dropout < 1, f"need lora_alpha > 0 and 0 <= lora_dropout < 1, got "
                                                           f"{cfg.lora_alpha} and {cfg.lora_dropout}")
    need(cfg.sharding in ("ddp", "fsdp"), f"sharding must be 'ddp' or 'fsdp', got {cfg.sharding!r}")
    need(cfg.prompts_per_step % world_size() == 0,
         f"prompts_per_step={cfg.prompts_per_step} does not split over WORLD_SIZE={world_size()} ranks (each rank "
         f"samples whole groups): make prompts_per_step a multiple of {world_size()}, or run a number of processes "
         f"that divides {cfg.prompts_per_step}")
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    need(set(cfg.model_args) <= known, f"model_args has unknown key(s) {sorted(set(cfg.model_args) - known)}; "
                                       f"ModelConfig has {sorted(known)}")
    maker = demo_split if cfg.dataset == "demo" else synthetic_problems
    known = set(inspect.signature(maker).parameters) - {"n", "seed", "warm_size", "rl_size", "heldout_size"}
    need(set(cfg.synthetic_args) <= known, f"synthetic_args has unknown key(s) "
                                           f"{sorted(set(cfg.synthetic_args) - known)}; data.{maker.__name__} takes {sorted(known)}")
    need(cfg.algorithm == "grpo" or world_size() == 1,
         f"algorithm={cfg.algorithm!r} runs in one process only (its steps do not split over ranks); run it without "
         f"torchrun (WORLD_SIZE={world_size()})")
    need(not cfg.init_from or cfg.resume or os.path.isfile(cfg.init_from),
         f"init_from={cfg.init_from!r}: no such file (a train.py checkpoint, e.g. out/demo_warm/sft.pt)")
    need(all(type(w) in (int, float) and math.isfinite(w) for w in cfg.reward_weights.values()),
         f"reward_weights must be finite numbers, got {cfg.reward_weights}")
    need(cfg.supervision in SUPERVISIONS, f"supervision must be one of {SUPERVISIONS}, got {cfg.supervision!r}")
    need(0 <= cfg.process_weight < math.inf, f"process_weight must be a finite number >= 0, got {cfg.process_weight}")
    try:  # grpo.py, data.py and reward_models.py own the allowed values: a dry run on a tiny batch checks them
        check_reward_names(cfg.reward_weights)
        step_function(cfg.algorithm)
        response_prefix(cfg.template)  # checks the template's name
        resolve_device(cfg.device, cfg.dtype)
        group_advantages(torch.zeros(cfg.group_size), cfg.group_size, cfg.adv_baseline, cfg.adv_scale)
        grpo_loss(torch.zeros(1, 1), None, torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), cfg.clip_eps,
                  cfg.clip_eps_high, cfg.beta, cfg.loss_agg)
    except ValueError as error:
        raise ValueError(f"config: {error}") from None


def load_config(argv: list[str]) -> TrainConfig:
    """`[CONFIG.py] [--key=value ...]` -> TrainConfig. A config file is Python assigning variables (names starting
    with "_", modules, functions and classes are ignored); a value on the command line is a Python literal, or
    plain text for str keys and "true"/"false"; a bare --flag sets a bool key."""
    hints, values = typing.get_type_hints(TrainConfig), {}
    for arg in argv:
        if arg in ("-h", "--help"):
            raise SystemExit(__doc__ + "\nConfig keys and their defaults:\n" + "\n".join(
                f"  --{f.name}={getattr(TrainConfig, f.name, '...')!r}" for f in dataclasses.fields(TrainConfig)))
        if arg.startswith("--"):
            key, has_value, text = arg[2:].partition("=")
            items, source = [(key, parse_value(text, hints.get(key)) if has_value else True)], "command line"
        elif os.path.isfile(arg):
            items, source = [(k, v) for k, v in runpy.run_path(arg).items() if not k.startswith("_") and not
                             isinstance(v, (types.ModuleType, types.FunctionType, type))], arg
        else:
            raise FileNotFoundError(f"config file {arg} not found")
        for key, value in items:
            if key not in hints:
                close = difflib.get_close_matches(key, hints, n=1)
                raise ValueError(f"unknown config key {key!r} ({source})"
                                 + (f"; did you mean {close[0]!r}?" if close else ""))
            values[key] = value
    return TrainConfig(**values)


def parse_value(text: str, hint):
    if hint is str:
        return text
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)  # numbers, None, dicts, tuples, lists
    except (ValueError, SyntaxError):
        return text  # then checked_type names the key and the expected type

# -----------------------------------------------------------------------------
# data


def load_problems(cfg: TrainConfig) -> tuple[list[dict], list[dict], list[dict]]:
    """(warm-start problems, training problems, held-out problems), each a dict {"question", "solution", "gold"}.
    The warm start trains on the training problems, except with dataset="demo" (data.demo_split): there it has
    its own family, and the training and held-out rows are answer only ("#### N")."""
    if cfg.dataset == "gsm8k":  # a missing file raises FileNotFoundError naming the path and the download command
        warm = problems = load_gsm8k(cfg.data_dir, cfg.train_split)
        heldout = load_gsm8k(cfg.data_dir, cfg.eval_split)[:cfg.eval_size]
        names = (os.path.join(cfg.data_dir, f"{cfg.train_split}.jsonl"), os.path.join(cfg.data_dir, f"{cfg.eval_split}.jsonl"))
    elif cfg.dataset == "synthetic":  # different seeds for the two sets; a held-out question also in training is dropped
        warm = problems = synthetic_problems(cfg.synthetic_train_size, seed=cfg.seed, **cfg.synthetic_args)
        seen = {p["question"] for p in problems}
        heldout = [p for p in synthetic_problems(cfg.synthetic_eval_size, seed=cfg.seed + 1, **cfg.synthetic_args)
                   if p["question"] not in seen][:cfg.eval_size]
        names = ("the synthetic training set", "the synthetic held-out set")
    else:  # three families from one seed; no held-out chain occurs in the other two
        split_seed = cfg.seed if cfg.data_seed is None else cfg.data_seed
        warm, problems, heldout = demo_split(split_seed, cfg.synthetic_warm_size, cfg.synthetic_train_size,
                                             cfg.synthetic_eval_size, **cfg.synthetic_args)
        heldout, names = heldout[:cfg.eval_size], ("the demo's RL set", "the demo's held-out set")
    if not problems:
        raise ValueError(f"{names[0]} is empty: nothing to train on")
    if not heldout and cfg.eval_every > 0:
        raise ValueError(f"{names[1]} is empty: nothing to evaluate (set eval_every=0 to train without evaluation)")
    if (cfg.warm_starts or cfg.algorithm == "sft_more") and not (warm and all(map(has_worked_solution, warm))):
        raise ValueError("the warm start needs worked solutions: its set is empty or has a row with only '#### N'")
    return warm, problems, heldout


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

# -----------------------------------------------------------------------------
# one GRPO step


@dataclass
class Run:
    """What a training run holds between steps; save_checkpoint() saves it and setup() rebuilds it."""
    policy: Transformer  # fp32 master weights, trained
    sampler: Transformer  # generates rollouts: the policy itself, or its bf16 copy on CUDA
    reference: Transformer | None  # frozen KL anchor (beta > 0 without LoRA)
    optimizer: torch.optim.Optimizer
    stream: QuestionStream
    tokenizer: typing.Any
    problems: list[dict]  # training problems {"question", "solution", "gold"}
    prompts: list[list[int]]  # their prompt token ids
    heldout: list[dict]
    autocast: typing.Any  # bf16 autocast on CUDA, a null context in fp32
    step: int = 0  # GRPO steps completed
    rewards: dict = field(default_factory=dict)  # the loaded non-rule rewards (reward_models.load_rewards)
    ddp: DistributedDataParallel | None = None  # torchrun, sharding="ddp": the loss runs through this wrapper


def step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step) % 2 ** 31  # distinct per (seed, step): a resumed run draws the same samples


def sample_groups(run: Run, cfg: TrainConfig, step: int) -> tuple[list[int], list[list[int]], Samples]:
    """Draw prompts_per_step questions and sample group_size scored completions of each (a group is group_size
    consecutive rows); under torchrun every rank draws the same questions and keeps its slice of whole groups, with
    its own seed. Returns (this rank's question indices, the prompt ids of each row, the samples)."""
    G, share = cfg.group_size, cfg.prompts_per_step // world_size()
    picked = run.stream.next(cfg.prompts_per_step)[rank() * share:(rank() + 1) * share]
    prompts = [run.prompts[i] for i in picked for _ in range(G)]
    with run.sampler.lora_merged():
        samples = sample_and_score(run.sampler, run.tokenizer, prompts, [run.problems[i]["gold"] for i in picked
                                                                        for _ in range(G)],
                                   cfg.template, cfg.max_new_tokens, cfg.temperature,
                                   step_seed(cfg.seed, step * world_size() + rank()), cfg.reward_weights,
                                   questions=[run.problems[i]["question"] for i in picked for _ in range(G)],
                                   functions=run.rewards, process=cfg.supervision != "outcome")
    return picked, prompts, samples


def shown_samples(run: Run, step: int, picked: list[int], samples: Samples, G: int) -> list[dict]:
    """The first completion of the step's first two questions, for samples.jsonl."""
    return [{"step": step, "question": run.problems[picked[q]]["question"], "gold": run.problems[picked[q]]["gold"],
             "completion": samples.texts[q * G], "reward": samples.rewards[q * G]} for q in range(min(2, len(picked)))]


def rollout_stats(samples: Samples, reward_weights: dict) -> dict:
    """What the log says of a step's samples: the reward and each component, accuracy, response lengths, the
    share cut at max_new_tokens, sampling speed and the seconds spent sampling and scoring."""
    lengths, mean = [len(c) for c in samples.completions], statistics.fmean
    return {"reward": mean(samples.rewards),
            **{f"reward_{reward_log_name(name)}": mean(samples.components[name]) for name in reward_weights},
            **({"process_reward": mean(r for steps in samples.steps for _, r in steps)} if samples.steps else {}),
            "accuracy": mean(samples.components["correctness"]), "response_length": mean(lengths),
            "response_length_max": max(lengths), "truncation_rate": 1 - mean(samples.stopped),
            "tokens_per_s": sum(lengths) / samples.seconds_sampling, "time_sample": samples.seconds_sampling,
            "time_reward": samples.seconds_scoring}


def grpo_step(run: Run, cfg: TrainConfig, step: int) -> tuple[dict, list[dict]]:
    """One step of GRPO on run's weights, in place; returns (the step's log record, two sample completions)."""
    G, device = cfg.group_size, run.policy.lm_head.weight.device
    # 1. sample G completions for each of prompts_per_step questions and score them
    picked, prompts, samples = sample_groups(run, cfg, step)
    t1 = time.perf_counter()
    # 2. normalise the rewards within each group (outcome: [B]) and the step rewards (process: [B, T])
    rewards = torch.tensor(samples.rewards)
    advantages = group_advantages(rewards, G, baseline=cfg.adv_baseline, scale=cfg.adv_scale)
    if cfg.supervision != "outcome":
        step_rewards, step_ends, step_mask = step_tensors(samples.steps)
        process = process_advantages(step_rewards, step_ends, G, max(map(len, samples.completions)), step_mask)
        advantages = process if cfg.supervision == "process" else advantages[:, None] + cfg.process_weight * process
    # 3. the log-probs the loss compares with: the reference's (KL) and, for mu > 1, the sampling policy's (ratio)
    batches = make_micro_batches(prompts, samples.completions, advantages, cfg.micro_batch_size,
                                 run.tokenizer.pad_token_id, device)
    if advantages.dim() == 2:  # per token: each micro-batch keeps its own N completion columns
        for batch in batches:
            batch.advantages = batch.advantages[:, :batch.mask.shape[1]]
    if cfg.beta > 0:  # the reference: a frozen copy, or with LoRA the policy itself with its adapters off
        with run.policy.adapters_disabled() if run.reference is None else contextlib.nullcontext():
            add_logprobs(run.reference or run.policy, batches, "ref_logp", cfg.temperature, cfg.logprob_chunk,
                         run.autocast)
    if cfg.mu > 1:
        add_logprobs(run.policy, batches, "old_logp", cfg.temperature, cfg.logprob_chunk, run.autocast)
    if device.type == "cuda":
        torch.cuda.synchronize()  # so the phase timings below are honest
    t2 = time.perf_counter()
    # 4. mu optimizer steps on the clipped objective
    lr, stats = warmup_lr(cfg.lr, step, cfg.warmup_steps), {}
    for _ in range(cfg.mu):
        epoch = policy_gradient(run.ddp or run.policy, batches, cfg, run.autocast)
        epoch["grad_norm"] = whole(optimizer_step(run.policy, run.optimizer, lr, cfg.grad_clip))
        stats = {key: stats.get(key, 0) + value / cfg.mu for key, value in epoch.items()}
    # 5. the sampler generates the next step with the new weights
    if run.sampler is not run.policy:
        copy_weights(run.sampler, run.policy)
    stats = dict(zip(stats, torch.stack(list(stats.values())).tolist()))  # the one host sync of the stats
    t3 = time.perf_counter()

    everyone = all_samples(samples)  # the log describes the whole step: every rank's rows
    record = {"step": step, **rollout_stats(everyone, cfg.reward_weights),
              "zero_std_frac": zero_std_group_fraction(torch.tensor(everyone.rewards), G).item(), **stats, "lr": lr,
              "time_reference": t2 - t1, "time_update": t3 - t2}
    record = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in record.items()}  # kl when beta=0
    return record, shown_samples(run, step, picked, samples, G)


def step_tensors(steps: list[list[tuple[int, float]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-completion steps [(token index of the step's end, reward)] -> grpo.process_advantages' step_rewards
    [B, S] float, step_ends [B, S] long and step_mask [B, S] bool, right-padded to the most steps S."""
    width = max(map(len, steps))
    padded = [row + [(0, 0.0)] * (width - len(row)) for row in steps]
    return (torch.tensor([[reward for _, reward in row] for row in padded]),
            torch.tensor([[end for end, _ in row] for row in padded]),
            torch.tensor([[True] * len(row) + [False] * (width - len(row)) for row in steps]))


def policy_gradient(policy, batches, cfg: TrainConfig, autocast) -> dict[str, torch.Tensor]:
    """Forward and backward of the GRPO loss over every micro-batch. The loss normalisers are the whole batch's,
    so the gradients add up to the whole batch's gradient, and the returned stats (0-d tensors, no host sync) to
    its means: loss, kl, clip fractions, ratio and entropy per token. Under torchrun the whole batch is every
    rank's rows: the normalisers and the stats are summed over the ranks."""
    n_seq = sum(b.mask.shape[0] for b in batches)
    n_tok = sum(b.mask.sum() for b in batches)
    if dist.is_initialized():
        n_seq, n_tok = summed_over_ranks(torch.stack([torch.tensor(n_seq, device=n_tok.device), n_tok]))
    totals = {}
    for i, batch in enumerate(batches):
        # DDP all-reduces in the last micro-batch's backward only, after the others accumulated their gradients
        last = i == len(batches) - 1
        with policy.no_sync() if isinstance(policy, DistributedDataParallel) and not last else contextlib.nullcontext():
            with autocast:
                logp, entropy = completion_logprobs(policy, batch, cfg.temperature, cfg.logprob_chunk)
            loss, stats = grpo_loss(logp, batch.old_logp, batch.ref_logp, batch.advantages, batch.mask,
                                    clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high, beta=cfg.beta,
                                    loss_agg=cfg.loss_agg, num_sequences=n_seq, num_tokens=n_tok,
                                    constant_norm=cfg.max_new_tokens)
            # DDP and FSDP2 average the ranks' gradients; with global normalisers the sum is the batch's gradient
            (loss * world_size()).backward()
        for key, value in {"loss": loss.detach(), "entropy": entropy / n_tok, **stats}.items():
            totals[key] = totals.get(key, 0) + value
    if dist.is_initialized():
        totals = dict(zip(totals, summed_over_ranks(torch.stack(list(totals.values())))))
    return totals

# -----------------------------------------------------------------------------
# the novel-split demo's baselines: the same loop, rows and completions per step as GRPO, a supervised update
# (validate() keeps them to one process)


def supervised_update(run: Run, cfg: TrainConfig, step: int, prompts: list, targets: list) -> dict:
    """One optimizer step on the mean next-token loss of targets after prompts; the sampler follows the policy."""
    lr = warmup_lr(cfg.lr, step, cfg.warmup_steps)
    loss = sft_loss_backward(run.policy, prompts, targets, cfg.micro_batch_size, run.tokenizer.pad_token_id,
                             run.policy.lm_head.weight.device, run.autocast, cfg.logprob_chunk)
    grad_norm = optimizer_step(run.policy, run.optimizer, lr, cfg.grad_clip)
    if run.sampler is not run.policy:
        copy_weights(run.sampler, run.policy)
    return {"loss": loss.item(), "grad_norm": grad_norm.item(), "lr": lr}


def rft_step(run: Run, cfg: TrainConfig, step: int) -> tuple[dict, list[dict]]:
    """One step of rejection-sampling fine-tuning (RFT, STaR): grpo_step's samples, then one supervised update on
    the correct ones only; none correct, no update. kept_fraction is the share of samples trained on."""
    picked, prompts, samples = sample_groups(run, cfg, step)
    kept = [i for i, correct in enumerate(samples.components["correctness"]) if correct == 1.0]
    t1 = time.perf_counter()
    update = supervised_update(run, cfg, step, [prompts[i] for i in kept], [samples.completions[i] for i in kept]) \
        if kept else {"loss": None, "grad_norm": None, "lr": warmup_lr(cfg.lr, step, cfg.warmup_steps)}
    record = {"step": step, **rollout_stats(samples, cfg.reward_weights), "kept_fraction": len(kept) / len(prompts),
              **update, "time_update": time.perf_counter() - t1}
    return record, shown_samples(run, step, picked, samples, cfg.group_size)


def sft_step(run: Run, cfg: TrainConfig, step: int) -> tuple[dict, list[dict]]:
    """One supervised step on prompts_per_step * group_size training rows (GRPO's completions per step): the RL
    rows' answers alone ("sft_answers": "</think> <answer>N</answer>"), or warm-start rows ("sft_more")."""
    start = time.perf_counter()
    picked = run.stream.next(cfg.prompts_per_step * cfg.group_size)
    update = supervised_update(run, cfg, step, [run.prompts[i] for i in picked],
                               [sft_target(run.tokenizer, run.problems[i]) for i in picked])
    return {"step": step, **update, "time_update": time.perf_counter() - start}, []


def step_function(algorithm: str):
    """The step that cfg.algorithm names, looked up when called (so a test can replace one)."""
    steps = {"grpo": grpo_step, "rft": rft_step, "sft_answers": sft_step, "sft_more": sft_step}
    if algorithm not in steps:
        raise ValueError(f"algorithm must be one of {sorted(steps)}, got {algorithm!r}")
    return steps[algorithm]

# -----------------------------------------------------------------------------
# set-up: a new run, or a resumed one


def setup(cfg: TrainConfig) -> Run:
    """Load data, tokenizer and model; a new run does the warm start, a resumed one loads ckpt.pt."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device, dtype = resolve_device(cfg.device, cfg.dtype)
    device = init_distributed(device)
    # fp32 master weights and optimizer state; bf16 forward passes via autocast (plain bf16 AdamW rounds lr 1e-6 away)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()
    state = prepare_out_dir(cfg)
    tokenizer = load_tokenizer(cfg.tokenizer) if cfg.tokenizer else load_tokenizer(cfg.model, gguf_file=cfg.gguf_file or None)
    warm, problems, heldout = load_problems(cfg)
    if cfg.algorithm == "sft_more":  # the baseline that only continues the warm start, on the warm start's family
        problems = warm
    rewards = load_rewards(cfg.reward_weights, device, dtype, cfg.micro_batch_size)  # once per run, before any work
    prompts = [encode_prompt(tokenizer, p["question"], cfg.template) for p in problems]
    warm_prompts = []  # the warm start's prompts, when this run does one
    if state is None and cfg.warm_starts:
        warm_prompts = prompts if warm is problems else [encode_prompt(tokenizer, p["question"], cfg.template)
                                                         for p in warm]
    if state is not None:
        policy = model_from_checkpoint(state)
    elif cfg.model == "scratch":
        torch.manual_seed(cfg.seed)
        policy = Transformer(ModelConfig(**{"vocab_size": len(tokenizer), **cfg.model_args}))
    else:
        policy = Transformer.from_pretrained(cfg.model, dtype=torch.float32, gguf_file=cfg.gguf_file or None)
    if policy.config.vocab_size < len(tokenizer):
        raise ValueError(f"the model's vocab_size {policy.config.vocab_size} is smaller than the tokenizer's "
                         f"{len(tokenizer)} tokens")
    check_context(prompts + (warm_prompts if warm_prompts is not prompts else []) +
                  [encode_prompt(tokenizer, p["question"], cfg.template) for p in heldout],
                  cfg.max_new_tokens, policy.config.max_seq_len)
    if state is None and cfg.init_from:
        load_init_weights(policy, cfg, warm)
    policy.to(device).grad_checkpointing = cfg.grad_checkpointing
    if rank() == 0:
        write_jsonl(heldout, os.path.join(cfg.out_dir, "heldout.jsonl"))  # what `python eval.py --data` re-scores
        with open(os.path.join(cfg.out_dir, "config.json"), "w") as f:
            json.dump(dataclasses.asdict(cfg), f, indent=2)

    if warm_prompts:  # the warm start: worked solutions, its own optimizer
        warm_start(policy, policy.configure_optimizer(cfg.sft_lr, cfg.weight_decay, cfg.adam_betas), warm_prompts,
                   [sft_target(tokenizer, p) for p in warm], cfg.sft_steps, cfg.sft_batch_size, cfg.sft_lr, cfg.warmup_steps, cfg.grad_clip,
                   cfg.micro_batch_size, tokenizer.pad_token_id, device, autocast, cfg.logprob_chunk, cfg.seed,
                   os.path.join(cfg.out_dir, "sft_log.jsonl") if rank() == 0 else os.devnull)
    if state is None and cfg.lora_rank > 0:  # after the warm start: SFT trains every weight
        policy.add_lora(cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets)
    # torchrun: every rank takes rank 0's weights (a warm start on GPU is not bitwise reproducible). Under FSDP2 the
    # sampler is a whole copy (bf16 on GPU: 2 B/param on every rank) refreshed after each update, not the policy
    # unsharded around generation: every FSDP2 forward is a collective, while each rank decodes as many steps as
    # its own rows need. The copies are made before spread() shards the policy in place.
    sharded = dist.is_initialized() and cfg.sharding == "fsdp"
    if dist.is_initialized():
        for tensor in policy.state_dict().values():
            dist.broadcast(tensor, src=0)
    sampler = policy if dtype == torch.float32 and not sharded else frozen_copy(policy, dtype)
    reference = frozen_copy(policy, dtype) if cfg.beta > 0 and cfg.lora_rank == 0 and cfg.algorithm == "grpo" \
        else None
    ddp = spread(policy, cfg.sharding, device) if dist.is_initialized() else None
    run = Run(policy=policy, sampler=sampler, reference=reference,
              optimizer=policy.configure_optimizer(cfg.lr, cfg.weight_decay, cfg.adam_betas),
              stream=QuestionStream(len(problems), cfg.seed), tokenizer=tokenizer, problems=problems, prompts=prompts,
              heldout=heldout, autocast=autocast, rewards=rewards, ddp=ddp)
    if state is not None:
        run.step = state["step"]
        run.optimizer.load_state_dict(state["optimizer"])
        shard_optimizer_state(run.optimizer)
        run.stream.load_state_dict(state["stream"])
        if run.reference is not None:
            run.reference.load_state_dict(state["reference"])
    return run


def load_init_weights(policy: Transformer, cfg: TrainConfig, warm: list[dict]):
    """policy's weights := those of the train.py checkpoint cfg.init_from, after checking it has the same shape and,
    for dataset="demo", that its run's warm-start set is this run's `warm` (else it may hold held-out chains)."""
    path, state = cfg.init_from, read_checkpoint(cfg.init_from)
    theirs, ours = state["model_config"], dataclasses.asdict(policy.config)
    differ = [f"{key} {theirs.get(key)!r} (this run: {ours[key]!r})" for key in ours if theirs.get(key) != ours[key]]
    if differ:
        raise ValueError(f"init_from={path} holds a model of another shape: {', '.join(differ)}")
    if state["config"].get("lora_rank", 0) > 0:
        raise ValueError(f"init_from={path} was trained with LoRA adapters; start from a checkpoint without them")
    if cfg.dataset == "demo":
        run = state["config"]
        same = run["dataset"] == "demo" and demo_split(
            run["seed"] if run.get("data_seed") is None else run["data_seed"], run["synthetic_warm_size"],
            run["synthetic_train_size"], run["synthetic_eval_size"], **run["synthetic_args"])[0] == warm
        if not same:
            raise ValueError(f"init_from={path} was warm-started on another set than this run's (another seed, "
                             "data_seed, synthetic_warm_size or warm-start family): it may have seen this run's "
                             "held-out chains; set data_seed to its run's seed")
    policy.load_state_dict(state["model"])


def frozen_copy(model: Transformer, dtype) -> Transformer:
    return copy.deepcopy(model).to(dtype=dtype).eval().requires_grad_(False)


def prepare_out_dir(cfg: TrainConfig) -> dict | None:
    """Make out_dir ready: refuse to clobber a run, clear it on overwrite; on resume return ckpt.pt's state after
    checking that the config only changes RESUMABLE keys, and cut the logs back to its step."""
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    holds_run = any(os.path.exists(os.path.join(cfg.out_dir, name)) for name in ("ckpt.pt", "log.jsonl"))
    os.makedirs(cfg.out_dir, exist_ok=True)
    if not cfg.resume:
        if holds_run and not cfg.overwrite:
            raise FileExistsError(f"{cfg.out_dir} already holds a run: add --resume to continue it, --overwrite to "
                                  "delete it and start again, or choose another --out_dir")
        doomed = [os.path.join(cfg.out_dir, name) for name in RUN_FILES] + glob.glob(os.path.join(cfg.out_dir, "eval_*.jsonl"))
        for path in doomed if rank() == 0 else []:  # one process deletes
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
        return None
    state = read_checkpoint(ckpt_path)
    saved, now = state["config"], dataclasses.asdict(cfg)
    changed = [f"{k}={saved[k]!r} -> {now[k]!r}" for k in now if k in saved and saved[k] != now[k] and k not in RESUMABLE]
    if changed:
        raise ValueError(f"--resume keeps the settings {ckpt_path} was trained with, but this command changes "
                         f"{', '.join(changed)}; only {', '.join(RESUMABLE)} may change on resume")
    for name in ("log.jsonl", "eval.jsonl", "samples.jsonl") if rank() == 0 else ():
        truncate_log(os.path.join(cfg.out_dir, name), state["step"])
    return state


def truncate_log(path: str, step: int):
    """Drop a log's lines after `step` (they are about to be redone), and a torn last line (a kill mid-write)."""
    if not os.path.isfile(path):
        return
    with open(path) as f:
        lines = f.readlines()
    kept = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number} is not valid JSON; fix or delete that line to resume") from None
        if record["step"] <= step:
            kept.append(line)
    with open(path, "w") as f:
        f.writelines(kept)

# -----------------------------------------------------------------------------
# checkpoints, held-out evaluation, the loop


def save_checkpoint(run: Run, cfg: TrainConfig, path: str, full: bool = True):
    """Write the run (full: everything --resume needs; else the weights eval.py needs) to path, atomically:
    a temporary file is renamed over the old one, so a crash mid-write keeps the previous checkpoint.
    Under torchrun every rank calls it and rank 0 writes whole tensors in the single-process layout (FSDP2 shards
    gathered), so a run resumes under any number of ranks and either sharding."""
    state = {"model": gathered_to_rank0(run.policy.state_dict()), "model_config": dataclasses.asdict(run.policy.config),
             "config": dataclasses.asdict(cfg), "step": run.step}
    if full:
        optimizer = run.optimizer.state_dict()  # its per-weight dicts are the optimizer's own: gather copies
        optimizer["state"] = {i: gathered_to_rank0(dict(moments)) for i, moments in optimizer["state"].items()}
        state.update(optimizer=optimizer, stream=run.stream.state_dict(),
                     reference=run.reference.state_dict() if run.reference is not None else None)
    if rank() != 0:
        return
    if not all(torch.isfinite(t).all() for t in state["model"].values()):
        raise FloatingPointError(f"the weights are not finite after step {run.step}; {path} was not overwritten")
    tensors = [t for part in (state["model"], state.get("reference") or {}) for t in part.values()] + \
        [t for s in state.get("optimizer", {"state": {}})["state"].values() for t in s.values()]
    need = sum(t.numel() * t.element_size() for t in tensors)
    free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
    if need > free:
        raise OSError(f"{path} needs {need / 2**30:.2f} GiB but {free / 2**30:.2f} GiB is free there; free some "
                      f"space (the previous checkpoint, if any, is kept)")
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def held_out_eval(run: Run, cfg: TrainConfig) -> float:
    """Greedy pass@1 on the held-out questions; under torchrun each rank scores a slice and all see every record."""
    n, world = len(run.heldout), world_size()
    mine = run.heldout[rank() * n // world:(rank() + 1) * n // world]
    with run.sampler.lora_merged():
        records = score_questions(run.sampler, run.tokenizer, mine, cfg.template, 1, 0.0, cfg.max_new_tokens,
                                  cfg.eval_batch_size, desc=f"eval@{run.step}", progress=rank() == 0)
    records = [record for part in from_every_rank(records) for record in part]
    result = summarize(records, n=1, ks=(1,), temperature=0.0)
    if rank() != 0:
        return result["pass@1"]
    write_completions(records, os.path.join(cfg.out_dir, f"eval_{run.step:05d}.jsonl"))
    with open(os.path.join(cfg.out_dir, "eval.jsonl"), "a") as f:
        f.write(json.dumps({"step": run.step, **result}) + "\n")
    tqdm.write(f"step {run.step}: held-out pass@1 {result['pass@1']:.3f} ± {result['pass@1_stderr']:.3f} "
               f"({len(run.heldout)} questions, greedy)")
    return result["pass@1"]


class StopRequest:
    """Ctrl-C during training asks the loop to stop after the current step and save; a second Ctrl-C stops at once."""

    def __enter__(self):
        self.requested, self.previous = False, None
        if threading.current_thread() is threading.main_thread():  # signals can only be caught there
            self.previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum, frame):
        self.requested = True
        signal.signal(signal.SIGINT, self.previous)
        tqdm.write("Ctrl-C: finishing this step, then saving a checkpoint (Ctrl-C again to stop at once)")

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def train(cfg: TrainConfig) -> dict:
    """Run (or resume) training; returns {"pass@1_start", "pass@1_end", "step", "interrupted"}."""
    run = setup(cfg)
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    summary = {"pass@1_start": None, "pass@1_end": None, "interrupted": False}
    if run.step == 0:
        if cfg.eval_every > 0:
            summary["pass@1_start"] = held_out_eval(run, cfg)
        save_checkpoint(run, cfg, ckpt_path)  # a resume point after the warm start
        if cfg.warm_starts:  # eval.py can score the warm start alone after ckpt.pt moves on
            save_checkpoint(run, cfg, os.path.join(cfg.out_dir, "sft.pt"), full=False)
    main = rank() == 0  # under torchrun only rank 0 writes files and prints
    bar = tqdm(range(run.step + 1, cfg.max_steps + 1), initial=run.step, total=cfg.max_steps, desc=cfg.algorithm,
               dynamic_ncols=True, disable=not main)
    with StopRequest() as stop:
        for step in bar:
            try:
                record, shown = step_function(cfg.algorithm)(run, cfg, step)
            except FloatingPointError as error:
                raise FloatingPointError(f"step {step}: {error}; stopped before the update, so {ckpt_path} keeps "
                                         "the last good weights: lower lr or grad_clip") from None
            run.step = step
            if main:
                with open(os.path.join(cfg.out_dir, "log.jsonl"), "a") as f:
                    f.write(json.dumps(record) + "\n")
                bar.set_postfix({key: f"{record[key]:.4g}" for key in ("reward", "accuracy", "response_length", "kl",
                                                                        "loss") if record.get(key) is not None})
            if main and cfg.sample_every and step % cfg.sample_every == 0 and shown:
                with open(os.path.join(cfg.out_dir, "samples.jsonl"), "a") as f:
                    f.writelines(json.dumps(s) + "\n" for s in shown)
                tqdm.write(f"step {step} sample (reward {shown[0]['reward']:.2f}, gold {shown[0]['gold']}): "
                           f"{shown[0]['completion'][:300]!r}")
            if run.reference is not None and cfg.ref_reset_every and step % cfg.ref_reset_every == 0:
                copy_weights(run.reference, run.policy)  # iterative GRPO
            if cfg.eval_every > 0 and (step % cfg.eval_every == 0 or step == cfg.max_steps):
                summary["pass@1_end"] = held_out_eval(run, cfg)
            # torchrun forwards Ctrl-C to every rank, maybe not within the same step: any rank's request stops all
            stopping = any(from_every_rank(stop.requested))
            if stopping or step == cfg.max_steps or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                save_checkpoint(run, cfg, ckpt_path)
            if stopping:
                summary["interrupted"] = True
                if main:
                    tqdm.write(f"stopped after step {step}; {ckpt_path} holds it. Continue with the same command "
                               "and --resume")
                break
    bar.close()
    summary["step"] = run.step
    if main and run.step == cfg.max_steps:  # for vLLM, lm-eval-harness, the hub; from ckpt.pt: whole under FSDP2 too
        model_from_checkpoint(read_checkpoint(ckpt_path)).save_pretrained(os.path.join(cfg.out_dir, "hf"), run.tokenizer)
    drawn = any(os.path.getsize(os.path.join(cfg.out_dir, name)) for name in ("log.jsonl", "eval.jsonl")
                if os.path.isfile(os.path.join(cfg.out_dir, name)))
    if main and drawn and importlib.util.find_spec("matplotlib") is not None:  # optional: the plot is a bonus
        from plot import plot_run
        tqdm.write(f"curves: {plot_run(cfg.out_dir)}")
    return summary


if __name__ == "__main__":
    result = train(load_config(sys.argv[1:]))
    if dist.is_initialized():  # leave together: a gloo rank that tears down while another still works can abort
        dist.barrier()
        dist.destroy_process_group()
    if rank() == 0:
        print(json.dumps(result))
    sys.exit(130 if result["interrupted"] else 0)
