"""
R1-Zero-style RL: GRPO (DeepSeekMath, arXiv:2402.03300) on math word problems with rule-based
rewards only (DeepSeek-R1-Zero, arXiv:2501.12948), on one device, or data-parallel under torchrun.

    python train.py configs/gsm8k.py              # Qwen2.5 on GSM8K, one GPU
    python train.py configs/demo.py --lr=1e-3     # a laptop CPU; --key=value overrides a config key
    python train.py configs/demo.py --resume      # continue out_dir/ckpt.pt (--overwrite: anew)
    torchrun --standalone --nproc_per_node=8 train.py configs/gsm8k.py   # 8 GPUs (DDP, or FSDP2)

The loop (train): set up (data, tokenizer, model, a supervised warm start), evaluate, then grpo_step
after grpo_step: the step computes (act: rollout.py; learn: grpo.py; sync the sampler), the loop
records (records.py), evaluates and saves. `method` swaps in a baseline (sft.py), or PPO: the
same step with a learned critic (GAE for the group baseline, and the critic's own update).
"""
import contextlib
import json
import os
import signal
import sys
import time
import typing
import uuid
from dataclasses import dataclass

import torch
from tqdm import tqdm

from checkpoint import (export_hf, fingerprint, load_init_weights, load_policy, restore,
                        save_checkpoint, tokenizer_of)
from config import TrainConfig, load_config
from data import load_problems
from distributed import (broadcast_weights, copy_weights, from_every_rank, init_distributed,
                         leave_together, mix_weights, rank, sharded, spread)
from eval import held_out_eval
from grpo import Loss, advantages_of, loss_of
from update import (add_logprobs, configure_optimizer, critic_update, gae_advantages,
                    make_micro_batches, mark_high_entropy, set_rows, update, warmup_lr)
from model import Critic, Transformer, resolve_device, set_attention_backends
from records import Tracker, progress, shown_samples, step_record
from reward_models import load_rewards
from rollout import QuestionStream, Samples, Sampling, Scoring, sample_groups, sampling_of
from run_management import (RunLock, StopRequest, check_machine, check_out_dir, check_reachable,
                            command_line, grad_checkpointing_of, hub_names, model_config,
                            refusals, report_stop,
                            saved_on_failure, start_out_dir)
from sft import rft_step, sft_step, sft_target, warm_start
from template import Template, encode_prompt, template_of


@dataclass
class Run:
    """What a run holds between steps; save_checkpoint() saves it and setup() rebuilds it."""
    policy: Transformer  # fp32 master weights, trained
    sampler: Transformer  # generates rollouts: the policy itself, or its bf16 copy on CUDA
    reference: Transformer | None  # frozen KL anchor (beta > 0 without LoRA)
    optimizer: torch.optim.Optimizer
    loss: Loss  # what the update minimises, built from the config's loss keys (grpo.loss_of)
    stream: QuestionStream  # the order of the training questions
    tokenizer: typing.Any
    template: Template  # the prompt and the tags (template.py)
    problems: list[dict]  # training problems {"question", "solution", "gold"}
    prompts: list[list[int]]  # their prompt token ids
    heldout: list[dict]
    autocast: typing.Any  # bf16 autocast on CUDA, a null context in fp32
    sampling: Sampling  # how rollouts sample (cfg's settings, the stop sequences)
    scoring: Scoring  # how they are scored (the template, the rewards' weights and functions)
    step: int = 0  # steps completed
    ddp: torch.nn.Module | None = None  # torchrun, sharding="ddp": the loss runs through it
    warm_set: str = ""  # the warm-start set's fingerprint (checkpoint.fingerprint)
    run_id: str = ""  # the run's own id (a resumed run goes on in the same wandb run)
    critic: Critic | None = None  # method="ppo": the value model, and its own optimizer
    critic_optimizer: torch.optim.Optimizer | None = None

# -----------------------------------------------------------------------------
# the loop


def train(cfg: TrainConfig) -> dict:
    """Run (or resume) training; returns {"pass@1_start", "pass@1_end", "step", "interrupted"}
    (interrupted: the name of the signal that stopped the run early, or False)."""
    # one run per out_dir; signals stop after a step
    with RunLock(cfg.out_dir, cfg.model), StopRequest() as stop:
        run = setup(cfg, stop)
        if run is None or stop.agreed():  # a signal in the warm start or the set-up
            if run is not None:
                report_stop(stop.requested, "the set-up", cfg)
            return {"pass@1_start": None, "pass@1_end": None, "interrupted": stop.requested,
                    "step": run.step if run else 0}
        with Tracker(cfg, run.run_id, run.step) as tracker:  # logs; at the end, the curves
            summary = loop(run, cfg, stop, tracker)
        if rank() == 0 and run.step == cfg.max_steps and cfg.save_checkpoints:
            export_hf(os.path.join(cfg.out_dir, "ckpt.pt"), os.path.join(cfg.out_dir, "hf"),
                      run.tokenizer)  # for vLLM, lm-eval-harness, the hub
    return summary


def loop(run: Run, cfg: TrainConfig, stop, tracker: Tracker) -> dict:
    """The steps from run.step + 1 to max_steps; between them, logs, evaluations, checkpoints."""
    summary = {"pass@1_start": None, "pass@1_end": None, "interrupted": False}
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    if run.step == 0 and cfg.eval_every > 0:  # a resume at step 0 has no step-0 evaluation
        summary["pass@1_start"] = held_out_eval(run, cfg, tracker)
    bar = tqdm(range(run.step + 1, cfg.max_steps + 1), initial=run.step, total=cfg.max_steps,
               desc=cfg.method, dynamic_ncols=True, disable=rank() != 0)
    step_of = {"grpo": grpo_step, "ppo": grpo_step, "rft": rft_step, "sft_answers": sft_step,
               "sft_more": sft_step}
    for step in bar:
        with saved_on_failure(run, cfg, step, ckpt_path):  # a failure keeps the steps before
            samples, stats = with_peak_memory(step_of[cfg.method], run, cfg, step)
            record = step_record(step, samples, stats, cfg, run.template)  # may fail the step too
        run.step = step
        tracker.log(record)
        bar.set_postfix(progress(record, cfg.progress_keys))  # other ranks' bars are disabled
        if cfg.sample_every and step % cfg.sample_every == 0:
            tracker.samples(shown_samples(run.problems, step, samples, cfg.group_size))
        if run.reference is not None and cfg.ref_reset_every and step % cfg.ref_reset_every == 0:
            copy_weights(run.reference, run.policy)  # iterative GRPO
        if cfg.sync_ref_model and step % cfg.ref_model_sync_steps == 0:  # TR-DPO's reference
            mix_weights(run.reference, run.policy, cfg.ref_model_mixup_alpha)
        if cfg.eval_every > 0 and (step % cfg.eval_every == 0 or step == cfg.max_steps):
            summary["pass@1_end"] = held_out_eval(run, cfg, tracker)
        stopping = stop.agreed() if step < cfg.max_steps else False  # the last step stops anyway
        periodic = cfg.checkpoint_every and step % cfg.checkpoint_every == 0
        if stopping or step == cfg.max_steps or periodic:
            save_checkpoint(run, cfg, ckpt_path)
        if stopping:
            summary["interrupted"] = stopping
            report_stop(stopping, f"step {step}", cfg)
            break
    bar.close()
    return {**summary, "step": run.step}


def with_peak_memory(step_fn, run: Run, cfg: TrainConfig, step: int) -> tuple[Samples, dict]:
    """step_fn(run, cfg, step), on CUDA with the step's peak memory in its stats: allocated
    (memory_gb) and reserved (memory_reserved_gb, the CUDA graphs' pool included)."""
    device = run.policy.lm_head.weight.device
    if device.type != "cuda":
        return step_fn(run, cfg, step)
    torch.cuda.reset_peak_memory_stats(device)
    samples, stats = step_fn(run, cfg, step)
    return samples, {**stats, "memory_gb": torch.cuda.max_memory_allocated(device) / 1e9,
                     "memory_reserved_gb": torch.cuda.max_memory_reserved(device) / 1e9}


# -----------------------------------------------------------------------------
# one GRPO step


def grpo_step(run: Run, cfg: TrainConfig, step: int) -> tuple[Samples, dict]:
    """One step of GRPO on run's weights, in place (method="ppo": PPO's, a critic's values for the
    group baseline); returns what it computed, for the loop to record: the samples and the update's
    stats (with lr and the phase times; the loop adds the peak memory, with_peak_memory)."""
    device = run.policy.lm_head.weight.device
    # 1. rollout: group_size completions of prompts_per_step questions, sampled, scored, shaped
    samples = sample_groups(run, cfg, step)
    t1 = time.perf_counter()
    trained = samples.stopped if run.loss.drops_truncated else None  # DAPO: no truncated
    batches = make_micro_batches(samples.prompts, samples.completions, cfg.micro_batch_size,
                                 run.tokenizer.pad_token_id, device, samples.logprobs, trained)
    # 2. reference log-probs for the KL penalty (beta > 0); for mu > 1 the sampling policy's too
    if cfg.beta > 0:  # the reference: a frozen copy, or with LoRA the policy without its adapters
        with run.policy.adapters_disabled() if run.reference is None else contextlib.nullcontext():
            add_logprobs(run.reference or run.policy, batches, "ref_logp", cfg.temperature,
                         cfg.logprob_chunk, run.autocast)
    if cfg.mu > 1:
        add_logprobs(run.policy, batches, "old_logp", cfg.temperature, cfg.logprob_chunk,
                     run.autocast)
    if run.loss.entropy_quantile < 1:  # the step's highest-entropy tokens, chosen once
        mark_high_entropy(run.policy, batches, run.loss.entropy_quantile, cfg.temperature,
                          cfg.logprob_chunk, run.autocast)
    # 3. advantages: the rewards normalised within each group; PPO: GAE on its critic's values
    if run.critic is None:
        advantages, advantage_stats = advantages_of(samples, batches, cfg)
        set_rows(batches, "advantages", advantages)
    else:  # the critic's values, then the advantages and the returns it learns
        advantage_stats = gae_advantages(run.critic, samples, batches, cfg, run.autocast)
    if device.type == "cuda":
        torch.cuda.synchronize()  # so the phase timings below are honest
    t2 = time.perf_counter()
    # 4. update: mu optimizer steps on the clipped objective, whole-batch normalisers
    lr = warmup_lr(cfg.lr, step, cfg.warmup_steps)
    stats = update(run.policy, run.optimizer, batches, run.loss, cfg, lr, run.autocast, run.ddp)
    if run.critic is not None:  # PPO: the critic's mu steps on the clipped value loss
        critic_lr = warmup_lr(cfg.critic_rate, step, cfg.warmup_steps)
        stats.update(critic_update(run.critic, run.critic_optimizer, batches, cfg, critic_lr,
                                   run.autocast))
    # 5. sync the sampler: it generates the next step's rollout with the new weights
    if run.sampler is not run.policy:
        copy_weights(run.sampler, run.policy)
    t3 = time.perf_counter()
    stats.update(advantage_stats, lr=lr, time_reference=t2 - t1, time_update=t3 - t2)
    return samples, stats

# -----------------------------------------------------------------------------
# set-up: a new run, or a resumed one


def setup(cfg: TrainConfig, stop=None) -> Run | None:
    """Load data, tokenizer and model; a new run does the warm start, a resumed one loads ckpt.pt
    (in the warm start's phase or RL's). Every check runs before any work and before out_dir
    changes. None: `stop` was requested during the warm start."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    with refusals():  # a bad input, a missing file, a machine short of something: a few lines
        device, dtype = resolve_device(cfg.device, cfg.dtype)
        device = init_distributed(device)
        state = check_out_dir(cfg)
        template = template_of(cfg.template)
        check_reachable(hub_names(cfg))  # cached, or the hub answers: before a minute of retries
        tokenizer = tokenizer_of(cfg.model, cfg.tokenizer, cfg.gguf_file)
        warm, problems, heldout = load_problems(cfg)
        if cfg.method == "sft_more":  # the baseline that continues the warm start, on its family
            problems = warm
        def encode(rows):
            return [encode_prompt(tokenizer, row["question"], template) for row in rows]
        prompts = encode(problems)
        warming = cfg.warm_starts and (state is None or state.get("phase") == "warm_start")
        warm_prompts = [] if not warming else prompts if warm is problems else encode(warm)
        every_prompt = prompts + ([] if warm_prompts is prompts else warm_prompts) + encode(heldout)
        prompt_len = max(map(len, every_prompt))  # the longest: what memory is sized for
        check_machine(cfg, device, model_config(cfg, len(tokenizer)), prompt_len)
        rewards = load_rewards(cfg.reward_weights, device, dtype, cfg.micro_batch_size)
        policy = load_policy(cfg, state, tokenizer)
        policy.config.check_context(every_prompt, cfg.max_new_tokens)
        checkpointing, chosen = grad_checkpointing_of(cfg, device, policy.config, prompt_len)
        if state is None and cfg.init_from:
            load_init_weights(policy, cfg.init_from, warm, cfg.dataset == "synthetic_split")
        start_out_dir(cfg, state, heldout)  # all checked: clear an old run, or cut its logs
    set_attention_backends(device)  # on CUDA: no cuDNN attention, as eval.py and tools/bench.py
    # fp32 master weights and AdamW; bf16 forward passes under autocast (bf16 AdamW loses lr 1e-6)
    autocast = (torch.autocast(device.type, dtype=dtype) if dtype != torch.float32
                else contextlib.nullcontext())
    policy.to(device).grad_checkpointing = checkpointing
    if chosen and rank() == 0:
        print(chosen, flush=True)
    run_id = (state or {}).get("run_id") or from_every_rank(uuid.uuid4().hex[:12])[0]
    if warm_prompts:  # the warm start; a saved one goes on where it stopped
        targets = [sft_target(tokenizer, p, template) for p in warm]
        done = warm_start(policy, warm_prompts, targets, cfg, tokenizer.pad_token_id, device,
                          autocast, state, stop, fingerprint(warm), run_id)
        if done < cfg.sft_steps:
            return None  # stopped by a signal: saved, and said how to go on
        state = None  # the warm start is done: RL starts as a new run does
    if state is None and cfg.lora_rank > 0:  # after the warm start: SFT trains every weight
        policy.add_lora(cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets)
    broadcast_weights(policy)  # torchrun: every rank starts from rank 0's weights
    one_model = dtype == torch.float32 and not sharded(cfg.sharding)  # the policy samples itself
    # the sampler: the policy itself, or its copy with fused projections (kernels.decode_step)
    sampler = policy if one_model else policy.frozen_copy(dtype).fuse_projections()
    with_reference = cfg.beta > 0 and cfg.lora_rank == 0 and cfg.method in ("grpo", "ppo")
    reference = policy.frozen_copy(dtype) if with_reference else None
    critic = Critic(policy) if cfg.method == "ppo" else None  # PPO: from the policy's weights
    ddp = spread(policy, cfg.sharding, device)  # torchrun: DDP replicas, or FSDP2 shards
    run = Run(policy=policy, sampler=sampler, reference=reference,
              optimizer=configure_optimizer(policy, cfg.lr, cfg.weight_decay, cfg.adam_betas),
              loss=loss_of(cfg),
              stream=QuestionStream(len(problems), cfg.seed), tokenizer=tokenizer,
              template=template, problems=problems, prompts=prompts, heldout=heldout,
              autocast=autocast, ddp=ddp, warm_set=fingerprint(warm), run_id=run_id, critic=critic,
              critic_optimizer=critic and configure_optimizer(critic, cfg.critic_rate,
                                                              cfg.weight_decay, cfg.adam_betas),
              sampling=sampling_of(tokenizer, template, cfg.max_new_tokens, cfg.temperature,
                                   cuda_graphs=cfg.cuda_graphs, fused_sampling=cfg.fused_sampling,
                                   fused_decode=cfg.fused_decode, checked=True),
              scoring=Scoring(template, cfg.reward_weights, cfg.answer_checker, rewards,
                              process=cfg.supervision != "outcome"))
    if state is not None:
        restore(run, state)
    else:  # RL's first resume point, before anything can fail (sft.pt first: ckpt.pt implies it)
        if cfg.warm_starts:  # eval.py can score the warm start alone after ckpt.pt moves on
            save_checkpoint(run, cfg, os.path.join(cfg.out_dir, "sft.pt"), full=False)
        save_checkpoint(run, cfg, os.path.join(cfg.out_dir, "ckpt.pt"))
    return run


def main(argv: list[str]) -> dict:
    """`python train.py CONFIG.py ... --key=value ...`: load and check the config, then train."""
    with refusals():
        cfg = load_config(argv)
    return train(cfg)


if __name__ == "__main__":
    result = command_line("train.py", lambda: main(sys.argv[1:]))  # a refusal: no traceback
    leave_together()
    if rank() == 0:
        print(json.dumps(result))
    sys.exit(128 + signal.Signals[result["interrupted"]].value if result["interrupted"] else 0)
