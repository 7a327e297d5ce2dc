"""
R1-Zero-style RL: GRPO (DeepSeekMath, arXiv:2402.03300) on math word problems with rule-based
rewards only (DeepSeek-R1-Zero, arXiv:2501.12948), on one device, or data-parallel under torchrun.

    python train.py configs/gsm8k.py              # Qwen2.5 on GSM8K, one GPU
    python train.py configs/demo.py --lr=1e-3     # a laptop CPU; --key=value overrides a config key
    python train.py configs/demo.py --resume      # continue out_dir/ckpt.pt (--overwrite: anew)
    torchrun --standalone --nproc_per_node=8 train.py configs/gsm8k.py   # 8 GPUs (DDP, or FSDP2)

The loop (train): set up (run.py: data, tokenizer, model, a supervised warm start), evaluate, then
grpo_step after grpo_step: the step computes (act: rollout.py; learn: grpo.py's objective through
update.py's micro-batched update; sync the sampler), the loop records (records.py), evaluates and
saves. `method` swaps in a baseline (sft.py), or PPO: the same step with a learned critic (GAE for
the group baseline, and the critic's own update).
"""
import contextlib
import json
import os
import signal
import sys
import time

import torch
from tqdm import tqdm

from checkpoint import export_hf, save_checkpoint
from config import TrainConfig, load_config
from distributed import copy_weights, leave_together, mix_weights, rank
from eval import held_out_eval
from grpo import advantages_of
from records import Tracker, progress, shown_samples, step_record
from rollout import Samples, sample_groups
from run import Run, setup
from run_management import (RunLock, StopRequest, command_line, refusals, report_stop,
                            saved_on_failure)
from sft import rft_step, sft_step
from update import (add_logprobs, critic_update, gae_advantages, make_micro_batches,
                    mark_high_entropy, set_rows, update, warmup_lr)


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
    """One GRPO step on run's weights, in place -> the samples and stats, for the loop to record."""
    device = run.policy.lm_head.weight.device
    # 1. rollout: group_size scored completions of prompts_per_step questions
    samples = sample_groups(run, cfg, step)
    t1 = time.perf_counter()
    trained = samples.stopped if run.loss.drops_truncated else None  # DAPO: no truncated
    batches = make_micro_batches(samples.prompts, samples.completions, cfg.micro_batch_size,
                                 run.tokenizer.pad_token_id, device, samples.logprobs, trained)
    # 2. log-probs: the reference's (beta > 0), the sampling policy's (mu > 1)
    if cfg.beta > 0:  # a frozen copy, or with LoRA the policy without its adapters
        with run.policy.adapters_disabled() if run.reference is None else contextlib.nullcontext():
            add_logprobs(run.reference or run.policy, batches, "ref_logp", cfg.temperature,
                         cfg.logprob_chunk, run.autocast)
    if cfg.mu > 1:
        add_logprobs(run.policy, batches, "old_logp", cfg.temperature, cfg.logprob_chunk,
                     run.autocast)
    if run.loss.entropy_quantile < 1:  # the highest-entropy tokens, chosen once
        mark_high_entropy(run.policy, batches, run.loss.entropy_quantile, cfg.temperature,
                          cfg.logprob_chunk, run.autocast)
    # 3. advantages: rewards normalised in each group (PPO: GAE on a critic)
    if run.critic is None:
        advantages, advantage_stats = advantages_of(samples, batches, cfg)
        set_rows(batches, "advantages", advantages)
    else:
        advantage_stats = gae_advantages(run.critic, samples, batches, cfg, run.autocast)
    if device.type == "cuda":
        torch.cuda.synchronize()  # honest phase times
    t2 = time.perf_counter()
    # 4. update: mu optimizer steps on the objective
    lr = warmup_lr(cfg.lr, step, cfg.warmup_steps)
    stats = update(run.policy, run.optimizer, batches, run.loss, cfg, lr, run.autocast, run.ddp)
    if run.critic is not None:  # PPO: the critic's mu steps
        critic_lr = warmup_lr(cfg.critic_rate, step, cfg.warmup_steps)
        stats.update(critic_update(run.critic, run.critic_optimizer, batches, cfg, critic_lr,
                                   run.autocast))
    # 5. the sampler takes the new weights
    if run.sampler is not run.policy:
        copy_weights(run.sampler, run.policy)
    t3 = time.perf_counter()
    stats.update(advantage_stats, lr=lr, time_reference=t2 - t1, time_update=t3 - t2)
    return samples, stats

# -----------------------------------------------------------------------------
# set-up: a new run, or a resumed one




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
