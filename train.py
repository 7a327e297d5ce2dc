"""
R1-Zero-style reinforcement learning: GRPO (DeepSeekMath, arXiv:2402.03300) on math word problems with
rule-based rewards only (DeepSeek-R1-Zero, arXiv:2501.12948), on one device, or data-parallel under torchrun.

    python train.py configs/gsm8k.py                  # Qwen2.5 on GSM8K, one GPU
    python train.py configs/demo.py                   # a tiny model on synthetic problems, a laptop CPU
    python train.py configs/demo.py --lr=1e-3         # --key=value overrides any config key (config.py)
    python train.py configs/demo.py --resume          # continue out_dir/ckpt.pt exactly where it stopped
    python train.py configs/demo.py --overwrite       # start again in an out_dir that already holds a run
    torchrun --standalone --nproc_per_node=8 train.py configs/gsm8k.py   # 8 GPUs, DDP (--sharding=fsdp: FSDP2)

The loop (train): set up (data, tokenizer, model, an optional supervised warm start), evaluate, then for each step
grpo_step: 1. rollout: G completions of each of the step's questions, sampled and scored by the rewards;
2. reference log-probs for the KL penalty; 3. advantages: each reward normalised within its group; 4. update: mu
optimizer steps on the clipped-ratio objective (grpo.grpo_loss); 5. sync the sampler with the new weights. Between
steps: logs, held-out evaluations and checkpoints. `method` swaps grpo_step for a baseline of baselines.py.
"""
import contextlib
import copy
import dataclasses
import json
import math
import os
import signal
import sys
import threading
import time
import typing
import uuid
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

import baselines
from checkpoint import (RunLock, check_out_dir, check_out_dir_path, fingerprint, load_init_weights,
                        model_from_checkpoint, read_checkpoint, save_checkpoint, start_out_dir, tokenizer_of)
from config import TrainConfig, installed, load_config
from data import QuestionStream, encode_prompt, load_problems, write_jsonl
from distributed import (all_samples, copy_weights, from_every_rank, init_distributed, max_over_ranks, rank,
                         shard_optimizer_state, spread, summed_over_ranks, whole, world_size)
from eval import score_questions, summarize, write_completions
from grpo import group_advantages, grpo_loss, kl_penalized_rewards, process_advantages, zero_std_group_fraction
from logprobs import add_logprobs, completion_logprobs, make_micro_batches, sequence_sums, set_advantages
from model import (ModelConfig, Transformer, disable_cudnn_attention, optimizer_step, optimizer_updates,
                   resolve_device, warmup_lr)
from reward_models import load_rewards
from rollout import Samples, rollout_stats, sample_groups, shown_samples
from sample import check_context
from sft import sft_target, warm_start
from tracker import Tracker


@dataclass
class Run:
    """What a training run holds between steps; save_checkpoint() saves it and setup() rebuilds it."""
    policy: Transformer  # fp32 master weights, trained
    sampler: Transformer  # generates rollouts: the policy itself, or its bf16 copy on CUDA
    reference: Transformer | None  # frozen KL anchor (beta > 0 without LoRA)
    optimizer: torch.optim.Optimizer
    stream: QuestionStream  # the order of the training questions
    tokenizer: typing.Any
    problems: list[dict]  # training problems {"question", "solution", "gold"}
    prompts: list[list[int]]  # their prompt token ids
    heldout: list[dict]
    autocast: typing.Any  # bf16 autocast on CUDA, a null context in fp32
    step: int = 0  # steps completed
    rewards: dict = field(default_factory=dict)  # the loaded non-rule rewards (reward_models.load_rewards)
    ddp: DistributedDataParallel | None = None  # torchrun, sharding="ddp": the loss runs through this wrapper
    warm_set: str = ""  # fingerprint of the warm-start set (checkpoint.fingerprint), recorded in checkpoints
    run_id: str = ""  # the run's own id, kept in its checkpoints (a resumed run goes on in the same wandb run)

# -----------------------------------------------------------------------------
# the loop


def train(cfg: TrainConfig) -> dict:
    """Run (or resume) training; returns {"pass@1_start", "pass@1_end", "step", "interrupted"} (interrupted: the
    name of the signal that stopped the run early, or False)."""
    check_out_dir_path(cfg)
    main = rank() == 0  # under torchrun only rank 0 writes files and prints
    with RunLock(cfg.out_dir), StopRequest() as stop:  # one run per out_dir; Ctrl-C and SIGTERM stop after a step
        run = setup(cfg, stop)
        if run is None:
            if main:
                tqdm.write(f"{stop.requested}: stopped during the warm start, which is not saved; the same command "
                           "with --overwrite starts the run again")
            return {"pass@1_start": None, "pass@1_end": None, "interrupted": stop.requested, "step": 0}
        ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
        if run.step == 0 and not cfg.resume:  # a resume point after the warm start, before anything else can fail
            save_checkpoint(run, cfg, ckpt_path)
            if cfg.warm_starts:  # eval.py can score the warm start alone after ckpt.pt moves on
                save_checkpoint(run, cfg, os.path.join(cfg.out_dir, "sft.pt"), full=False)
        with Tracker(cfg, run.run_id, run.step) as tracker:
            summary = loop(run, cfg, stop, tracker)
        if main and run.step == cfg.max_steps:  # for vLLM, lm-eval-harness, the hub; from ckpt.pt: whole under FSDP2
            model_from_checkpoint(read_checkpoint(ckpt_path)).save_pretrained(os.path.join(cfg.out_dir, "hf"),
                                                                              run.tokenizer)
        drawn = any(os.path.getsize(os.path.join(cfg.out_dir, name)) for name in ("log.jsonl", "eval.jsonl")
                    if os.path.isfile(os.path.join(cfg.out_dir, name)))
        if main and drawn and installed("matplotlib"):  # optional: the plot is a bonus
            from plot import plot_run
            tqdm.write(f"curves: {plot_run(cfg.out_dir)}")
    return summary


def loop(run: Run, cfg: TrainConfig, stop, tracker: Tracker) -> dict:
    """The steps from run.step + 1 to max_steps, with logs, evaluations and checkpoints between them."""
    summary, main = {"pass@1_start": None, "pass@1_end": None, "interrupted": False}, rank() == 0
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    if run.step == 0 and cfg.eval_every > 0:  # a resume at step 0 has no step-0 evaluation (start_out_dir)
        summary["pass@1_start"] = held_out_eval(run, cfg, tracker)
    bar = tqdm(range(run.step + 1, cfg.max_steps + 1), initial=run.step, total=cfg.max_steps, desc=cfg.method,
               dynamic_ncols=True, disable=not main)
    for step in bar:
        before = (run.stream.state_dict(), optimizer_updates(run.optimizer))
        try:
            record, shown = step_function(cfg.method)(run, cfg, step)
        except Exception as error:  # steps up to step - 1 were complete: keep them if the weights are still theirs
            saved = save_before_failure(run, cfg, ckpt_path, *before)
            if isinstance(error, FloatingPointError):  # its message names the step and what to change
                raise FloatingPointError(f"step {step}: {error}; {saved}") from None
            if main:
                tqdm.write(f"step {step} failed ({type(error).__name__}); {saved}")
            raise
        run.step = step
        tracker.log(record)
        if main:
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
            summary["pass@1_end"] = held_out_eval(run, cfg, tracker)
        stopping = stop.agreed() if step < cfg.max_steps else False  # a signal in the last step stops nothing
        if stopping or step == cfg.max_steps or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
            save_checkpoint(run, cfg, ckpt_path)
        if stopping:
            summary["interrupted"] = stopping
            if main:
                tqdm.write(f"{stopping}: stopped after step {step}; {ckpt_path} holds it. Continue with the same "
                           "command and --resume")
            break
    bar.close()
    summary["step"] = run.step
    return summary


def save_before_failure(run: Run, cfg: TrainConfig, path: str, stream_state: dict, updates: int) -> str:
    """After an exception inside a step: checkpoint the last complete step (run.step) if the weights are still its
    (no optimizer update of the failed step had begun), with the question order put back to where that step left
    it, so that --resume redoes the failed step. Returns what was done, for the error message."""
    if optimizer_updates(run.optimizer) != updates:
        return f"the step had updated the weights, so {path} keeps the last checkpoint written"
    if dist.is_initialized() and cfg.sharding == "fsdp":  # gathering the shards would wait for the other ranks
        return f"under FSDP2 nothing is saved after a failure; {path} keeps the last checkpoint written"
    run.stream.load_state_dict(stream_state)
    save_checkpoint(run, cfg, path)
    return f"stopped before the update, so {path} keeps the last good weights, those of step {run.step}"


def step_function(method: str):
    """The step that cfg.method names (config.METHODS), looked up when called (so a test can replace one)."""
    return {"grpo": grpo_step, "rft": baselines.rft_step, "sft_answers": baselines.sft_step,
            "sft_more": baselines.sft_step}[method]

# -----------------------------------------------------------------------------
# one GRPO step


def grpo_step(run: Run, cfg: TrainConfig, step: int) -> tuple[dict, list[dict]]:
    """One step of GRPO on run's weights, in place; returns (the step's log record, two sample completions)."""
    device = run.policy.lm_head.weight.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # memory_gb: this step's peak
    # 1. rollout: group_size completions of each of prompts_per_step questions, sampled and scored
    picked, prompts, samples = sample_groups(run, cfg, step)
    t1 = time.perf_counter()
    batches = make_micro_batches(prompts, samples.completions, None, cfg.micro_batch_size,
                                 run.tokenizer.pad_token_id, device, samples.logprobs)
    # 2. reference log-probs for the KL penalty (beta > 0), and for mu > 1 the sampling policy's for the ratio
    if cfg.beta > 0:  # the reference: a frozen copy, or with LoRA the policy itself with its adapters off
        with run.policy.adapters_disabled() if run.reference is None else contextlib.nullcontext():
            add_logprobs(run.reference or run.policy, batches, "ref_logp", cfg.temperature, cfg.logprob_chunk,
                         run.autocast)
    if cfg.mu > 1:
        add_logprobs(run.policy, batches, "old_logp", cfg.temperature, cfg.logprob_chunk, run.autocast)
    # 3. advantages: the rewards normalised within each group
    set_advantages(batches, advantages_of(samples, batches, cfg))
    if device.type == "cuda":
        torch.cuda.synchronize()  # so the phase timings below are honest
    t2 = time.perf_counter()
    # 4. update: mu optimizer steps on the clipped objective
    lr, stats, gap = warmup_lr(cfg.lr, step, cfg.warmup_steps), {}, {}
    for epoch_index in range(cfg.mu):
        epoch = policy_gradient(run.ddp or run.policy, batches, cfg, run.autocast, measure_gap=epoch_index == 0)
        gap.update({key: epoch.pop(key) for key in GAP_STATS if key in epoch})
        epoch["grad_norm"] = whole(optimizer_step(run.policy, run.optimizer, lr, cfg.grad_clip, loss=epoch["loss"]))
        stats = {key: stats.get(key, 0) + value / cfg.mu for key, value in epoch.items()}
    # 5. sync the sampler: it generates the next step's rollout with the new weights
    if run.sampler is not run.policy:
        copy_weights(run.sampler, run.policy)
    stats = {**stats, **gap}
    stats = dict(zip(stats, torch.stack(list(stats.values())).tolist()))  # the one host sync of the stats
    t3 = time.perf_counter()

    everyone = all_samples(samples)  # the log describes the whole step: every rank's rows
    record = {"step": step, **rollout_stats(everyone, cfg.reward_weights),
              "zero_std_frac": zero_std_group_fraction(torch.tensor(everyone.rewards), cfg.group_size).item(),
              **stats, "lr": lr, "time_reference": t2 - t1, "time_update": t3 - t2,
              **({"memory_gb": torch.cuda.max_memory_allocated(device) / 1e9} if device.type == "cuda" else {})}
    record = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in record.items()}  # kl when beta=0
    return record, shown_samples(run.problems, step, picked, samples, cfg.group_size)


def advantages_of(samples: Samples, batches: list, cfg: TrainConfig) -> torch.Tensor:
    """The advantages of a step's completions: [B] per completion (outcome supervision: grpo.group_advantages, of
    the rewards less beta times each sequence's log-ratio to the reference with kl_estimator="k1_reward"), or
    [B, T] per token (process supervision: grpo.process_advantages of the arithmetic claims; "both" adds them)."""
    rewards = torch.tensor(samples.rewards)
    if cfg.kl_estimator == "k1_reward" and cfg.beta > 0:
        log_ratio = sequence_sums(batches, lambda batch: batch.sampler_logp - batch.ref_logp, len(rewards))
        rewards = kl_penalized_rewards(rewards, log_ratio, cfg.beta)
    advantages = group_advantages(rewards, cfg.group_size, baseline=cfg.adv_baseline, scale=cfg.adv_scale)
    if cfg.supervision == "outcome":
        return advantages
    rewards, ends, mask = claim_tensors(samples.claims)
    process = process_advantages(rewards, ends, cfg.group_size, max(map(len, samples.completions)), mask)
    return process if cfg.supervision == "process" else advantages[:, None] + cfg.process_weight * process


def claim_tensors(claims: list[list[tuple[int, float]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-completion claims [(token index of the claim's end, reward)] -> grpo.process_advantages' claim_rewards
    [B, S] float, claim_ends [B, S] long and claim_mask [B, S] bool, right-padded to the most claims S."""
    width = max(map(len, claims))
    padded = [row + [(0, 0.0)] * (width - len(row)) for row in claims]
    return (torch.tensor([[reward for _, reward in row] for row in padded]),
            torch.tensor([[end for end, _ in row] for row in padded]),
            torch.tensor([[True] * len(row) + [False] * (width - len(row)) for row in claims]))


GAP_STATS = ("logprob_gap", "logprob_gap_max", "sampler_ratio")


def policy_gradient(policy, batches, cfg: TrainConfig, autocast, measure_gap: bool = False) -> dict[str, torch.Tensor]:
    """Forward and backward of the GRPO loss over every micro-batch. The loss normalisers are the whole batch's,
    so the gradients add up to the whole batch's gradient, and the returned stats (0-d tensors, no host sync) to
    its means: loss, kl, clip fractions, ratio and entropy per token. Under torchrun the whole batch is every
    rank's rows: the normalisers and the stats are summed over the ranks. measure_gap (before any update of the
    step): also GAP_STATS, how far the trainer's log-probs of the sampled tokens lie from the sampler's:
    mean and max of |trainer - sampler|, and the mean of exp(trainer - sampler), the samples' importance ratio."""
    n_seq = sum(b.mask.shape[0] for b in batches)
    n_tok = sum(b.mask.sum() for b in batches)
    if dist.is_initialized():
        n_seq, n_tok = summed_over_ranks(torch.stack([torch.tensor(n_seq, device=n_tok.device), n_tok]))
    totals, gap_max = {}, torch.zeros((), device=n_tok.device)
    for i, batch in enumerate(batches):
        # DDP all-reduces in the last micro-batch's backward only, after the others accumulated their gradients
        last = i == len(batches) - 1
        with policy.no_sync() if isinstance(policy, DistributedDataParallel) and not last else contextlib.nullcontext():
            with autocast:
                logp, entropy = completion_logprobs(policy, batch, cfg.temperature, cfg.logprob_chunk)
            loss, stats = grpo_loss(logp, batch.old_logp, batch.ref_logp, batch.advantages, batch.mask,
                                    clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high, beta=cfg.beta,
                                    loss_agg=cfg.loss_agg, num_sequences=n_seq, num_tokens=n_tok,
                                    constant_norm=cfg.max_new_tokens, kl_estimator=cfg.kl_estimator)
            # DDP and FSDP2 average the ranks' gradients; with global normalisers the sum is the batch's gradient
            (loss * world_size()).backward()
        if measure_gap:
            with torch.no_grad():
                diff = (logp.detach() - batch.sampler_logp).masked_fill(~batch.mask, 0.0)
                stats = {**stats, "logprob_gap": diff.abs().sum() / n_tok,
                         "sampler_ratio": (diff.exp() * batch.mask).sum() / n_tok}
                gap_max = torch.maximum(gap_max, diff.abs().max())
        for key, value in {"loss": loss.detach(), "entropy": entropy / n_tok, **stats}.items():
            totals[key] = totals.get(key, 0) + value
    if dist.is_initialized():
        totals = dict(zip(totals, summed_over_ranks(torch.stack(list(totals.values())))))
    if measure_gap:
        totals["logprob_gap_max"] = max_over_ranks(gap_max)
    return totals

# -----------------------------------------------------------------------------
# set-up: a new run, or a resumed one


def setup(cfg: TrainConfig, stop=None) -> Run | None:
    """Load data, tokenizer and model; a new run does the warm start, a resumed one loads ckpt.pt. Every check runs
    before out_dir changes (an --overwrite deletes the old run only then). None: `stop` was requested during the
    warm start."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device, dtype = resolve_device(cfg.device, cfg.dtype)
    device = init_distributed(device)
    if device.type == "cuda":
        disable_cudnn_attention()  # its masked bf16 GQA backward has returned NaN (model.disable_cudnn_attention)
    # fp32 master weights and optimizer state; bf16 forward passes via autocast (plain bf16 AdamW rounds lr 1e-6 away)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()
    state = check_out_dir(cfg)
    tokenizer = tokenizer_of(cfg.model, cfg.tokenizer, cfg.gguf_file)
    warm, problems, heldout = load_problems(cfg)
    if cfg.method == "sft_more":  # the baseline that only continues the warm start, on the warm start's family
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
        load_init_weights(policy, cfg.init_from, warm, check_warm_set=cfg.dataset == "synthetic_split")
    start_out_dir(cfg, state)  # every check passed: now clear an old run (--overwrite) or cut the logs back (--resume)
    policy.to(device).grad_checkpointing = cfg.grad_checkpointing
    if rank() == 0:
        write_jsonl(heldout, os.path.join(cfg.out_dir, "heldout.jsonl"))  # what `python eval.py --data` re-scores
        with open(os.path.join(cfg.out_dir, "config.json"), "w") as f:
            json.dump(dataclasses.asdict(cfg), f, indent=2)

    if warm_prompts:  # the warm start: worked solutions, its own optimizer
        done = warm_start(policy, policy.configure_optimizer(cfg.sft_lr, cfg.weight_decay, cfg.adam_betas),
                          warm_prompts, [sft_target(tokenizer, p) for p in warm], cfg.sft_steps, cfg.sft_batch_size,
                          cfg.sft_lr, cfg.warmup_steps, cfg.grad_clip, cfg.micro_batch_size, tokenizer.pad_token_id,
                          device, autocast, cfg.logprob_chunk, cfg.seed,
                          os.path.join(cfg.out_dir, "sft_log.jsonl") if rank() == 0 else os.devnull,
                          should_stop=stop.agreed if stop else None)
        if done < cfg.sft_steps:
            return None
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
    reference = frozen_copy(policy, dtype) if cfg.beta > 0 and cfg.lora_rank == 0 and cfg.method == "grpo" else None
    ddp = spread(policy, cfg.sharding, device) if dist.is_initialized() else None
    run = Run(policy=policy, sampler=sampler, reference=reference,
              optimizer=policy.configure_optimizer(cfg.lr, cfg.weight_decay, cfg.adam_betas),
              stream=QuestionStream(len(problems), cfg.seed), tokenizer=tokenizer, problems=problems, prompts=prompts,
              heldout=heldout, autocast=autocast, rewards=rewards, ddp=ddp, warm_set=fingerprint(warm),
              run_id=from_every_rank(uuid.uuid4().hex[:12])[0])
    if state is not None:
        run.step, run.run_id = state["step"], state.get("run_id") or run.run_id
        run.optimizer.load_state_dict(state["optimizer"])
        shard_optimizer_state(run.optimizer)
        run.stream.load_state_dict(state["stream"])
        if run.reference is not None:
            run.reference.load_state_dict(state["reference"])
    return run


def frozen_copy(model: Transformer, dtype) -> Transformer:
    return copy.deepcopy(model).to(dtype=dtype).eval().requires_grad_(False)

# -----------------------------------------------------------------------------
# held-out evaluation, stopping


def held_out_eval(run: Run, cfg: TrainConfig, tracker: Tracker) -> float:
    """Greedy pass@1 on the held-out questions; under torchrun each rank scores a slice and all see every record."""
    n, world = len(run.heldout), world_size()
    mine = run.heldout[rank() * n // world:(rank() + 1) * n // world]
    with run.sampler.lora_merged():
        records = score_questions(run.sampler, run.tokenizer, mine, cfg.template, 1, 0.0, cfg.max_new_tokens,
                                  cfg.eval_batch_size, desc=f"eval@{run.step}", progress=rank() == 0,
                                  cuda_graphs=cfg.cuda_graphs)
    records = [record for part in from_every_rank(records) for record in part]
    result = summarize(records, n=1, ks=(1,), temperature=0.0)
    if rank() != 0:
        return result["pass@1"]
    write_completions(records, os.path.join(cfg.out_dir, f"eval_{run.step:05d}.jsonl"))
    tracker.log({"step": run.step, **result}, "eval.jsonl")
    tqdm.write(f"step {run.step}: held-out pass@1 {result['pass@1']:.3f} ± {result['pass@1_stderr']:.3f} "
               f"({len(run.heldout)} questions, greedy)")
    return result["pass@1"]


class StopRequest:
    """Ctrl-C (SIGINT) or SIGTERM (what Slurm, Kubernetes and most schedulers send before SIGKILL) asks the loop to
    stop after the current step and save; `requested` is then the signal's name. A second Ctrl-C stops at once, a
    second SIGTERM terminates."""
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self):
        self.requested, self.previous = False, {}
        if threading.current_thread() is threading.main_thread():  # signals can only be caught there
            self.previous = {signum: signal.signal(signum, self._handler) for signum in self.SIGNALS}
        return self

    def _handler(self, signum, frame):
        self.requested = signal.Signals(signum).name
        signal.signal(signum, self.previous[signum])
        tqdm.write(f"{self.requested}: stopping after the current step"
                   + (" (Ctrl-C again to stop at once)" if signum == signal.SIGINT else ""))

    def agreed(self):
        """The signal any rank got (a collective: torchrun forwards a signal to every rank, maybe not within the same
        step, and any rank's request stops all), or False; kept in `requested`, so every rank reports it."""
        self.requested = next(filter(None, from_every_rank(self.requested)), False)
        return self.requested

    def __exit__(self, *exc):
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)


if __name__ == "__main__":
    result = train(load_config(sys.argv[1:]))
    if dist.is_initialized():  # leave together: a gloo rank that tears down while another still works can abort
        dist.barrier()
        dist.destroy_process_group()
    if rank() == 0:
        print(json.dumps(result))
    sys.exit(128 + signal.Signals[result["interrupted"]].value if result["interrupted"] else 0)
