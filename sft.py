"""
Supervised fine-tuning: the warm start on worked solutions (the SFT stage of the R1 pipeline), and
the baselines GRPO is measured against, which train.py's loop runs in place of grpo_step (config key
`method`) with the same questions, completions per step, warm start and held-out set:

    rft           rejection-sampling fine-tuning (RFT, STaR): GRPO's samples, one supervised step on
                  the correct ones
    sft_answers   one supervised step on prompts_per_step * group_size training rows (their answers
                  alone, with dataset="synthetic_split": "</think> <answer>N</answer>")
    sft_more      the same on warm-start rows: more of the warm start

The loss is next-token cross-entropy on the completion only (the prompt is context, not a target),
averaged over every completion token of the batch (sft_loss_backward). A baseline step returns what
it computed, (its samples or None, its update's stats), as grpo_step does, and the loop records it;
config.validate keeps the baselines to one process.
"""
import json
import os
import random
import time

import torch
from torch.utils.checkpoint import checkpoint
from tqdm import tqdm

from checkpoint import save_warm_start
from distributed import copy_weights, rank
from update import (chunk_logprobs, completion_logprobs, configure_optimizer, make_micro_batches,
                    optimizer_step, optimizer_updates, warmup_lr)
from rollout import Samples, sample_groups
from run_management import report_stop, resume_command
from template import R1_ZERO, Template, stop_token_ids


def sft_text(row: dict, template: Template = R1_ZERO) -> str:
    """The warm-start target after the prompt's response prefix ("<think>"): the worked solution,
    then the tagged answer, in the template's tags (Template.target_text). GSM8K's calculator
    annotations <<a*b=c>> and its final "#### N" line are dropped."""
    lines = [line for line in row["solution"].splitlines() if not line.lstrip().startswith("####")]
    reasoning = "\n".join(lines)
    while "<<" in reasoning and ">>" in reasoning.split("<<", 1)[1]:
        before, rest = reasoning.split("<<", 1)
        reasoning = before + rest.split(">>", 1)[1]
    return template.target_text(reasoning.strip(), row["gold"])


def sft_target(tokenizer, row: dict, template: Template = R1_ZERO) -> list[int]:
    """The token ids an SFT step trains on for row: sft_text, then the first stop token (no BOS
    mid-row). An answer-only row ("#### N") gives "</think> <answer>N</answer>": no reasoning."""
    return (tokenizer.encode(sft_text(row, template), add_special_tokens=False)
            + [stop_token_ids(tokenizer)[0]])


def sft_loss_backward(model, prompts, targets, micro_batch_size, pad_id, device, autocast,
                      chunk, rows_per_pass: int = 0) -> torch.Tensor:
    """Backward of the mean next-token loss over all target tokens (micro-batched, exact); returns
    the loss. rows_per_pass 0: the update's micro-batches (prompts left-padded, the model's dense
    mask); n > 0: causal_passes."""
    if rows_per_pass:
        return causal_loss_backward(model, prompts, targets, rows_per_pass, pad_id, device,
                                    autocast, chunk)
    batches = make_micro_batches(prompts, targets, micro_batch_size, pad_id, device)
    n_tok = sum(b.mask.sum() for b in batches)
    loss = 0
    for batch in batches:
        with autocast:
            logp, _ = completion_logprobs(model, batch, 1.0, chunk)
        micro_loss = -(logp * batch.mask).sum() / n_tok
        micro_loss.backward()
        loss += micro_loss.detach()
    return loss



def causal_passes(prompts, targets, rows: int, pad_id: int, device):
    """The rows (prompt + target) sorted by length, `rows` to a pass, each right-padded from slot 0:
    [(ids [b, W], scored [b, W]: the positions whose next token is a target)]. Causal attention
    (the model's forward with no attention_mask: SDPA's is_causal, no [b, 1, W, W] mask) never
    reaches a row's padding, which comes after it and is scored nowhere; and the positions count
    from 0 as the left-padded forward counts them. The same loss as the update's micro-batches,
    summed in another order; a pass is as wide as its longest row (rows of a length share one)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(targets[i]))
    passes = []
    for start in range(0, len(order), rows):
        picked = order[start:start + rows]
        width = max(len(prompts[i]) + len(targets[i]) for i in picked)
        ids = torch.full((len(picked), width), pad_id, dtype=torch.long)
        scored = torch.zeros((len(picked), width), dtype=torch.bool)
        for row, i in enumerate(picked):
            n = len(prompts[i]) + len(targets[i])
            ids[row, :n] = torch.tensor(prompts[i] + targets[i])
            scored[row, len(prompts[i]) - 1:n - 1] = True  # position t scores token t + 1
        passes.append((ids.to(device), scored.to(device)))
    return passes


def causal_loss_backward(model, prompts, targets, rows: int, pad_id: int, device, autocast,
                         chunk: int) -> torch.Tensor:
    """sft_loss_backward over causal_passes: each pass's backward of its share of the mean
    next-token loss (the mean over every target token of the batch); returns the loss."""
    n_tok = sum(map(len, targets))
    loss = 0
    for ids, scored in causal_passes(prompts, targets, rows, pad_id, device):
        with autocast:
            hidden = model(ids, return_hidden=True)[scored]  # [M, dim]
        next_ids = ids[:, 1:][scored[:, :-1]]  # [M]: the targets (no pass scores its last slot)
        total = 0
        for start in range(0, next_ids.numel(), chunk):  # lm_head a chunk at a time, recomputed
            logp, _ = checkpoint(chunk_logprobs, model.lm_head, hidden[start:start + chunk],
                                 next_ids[start:start + chunk], 1.0, None, use_reentrant=False)
            total = total + logp.sum()
        micro_loss = -total / n_tok
        micro_loss.backward()
        loss += micro_loss.detach()
    return loss

def warm_start(model, prompts, targets, cfg, pad_id: int, device, autocast,
               state: dict | None = None, stop=None, warm_set: str = "", run_id: str = "") -> int:
    """cfg.sft_steps SFT steps on batches of cfg.sft_batch_size (prompt, target) token-id pairs
    drawn by a random.Random(cfg.seed), with its own AdamW; one JSON line per step appended to
    out_dir/sft_log.jsonl. Resumable: every cfg.sft_checkpoint_every steps, when stop (a
    run_management.StopRequest) has a signal, and before an exception in a step propagates (the
    previous step, when the failed one had not begun its update), the weights, optimizer and batch
    order go to out_dir/ckpt.pt (checkpoint.save_warm_start, with the warm-start set's fingerprint
    and the run's id); given that checkpoint's state (its weights already in model), the warm start
    goes on with the very steps an unstopped one takes. Returns the steps done: fewer than sft_steps
    when stopped."""
    optimizer = configure_optimizer(model, cfg.sft_lr, cfg.weight_decay, cfg.adam_betas)
    rng = random.Random(cfg.seed)
    first = 1
    path = os.path.join(cfg.out_dir, "ckpt.pt")
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        first = state["warm_step"] + 1
        rng.setstate(state["warm_rng"])

    def save(step, rng_state):
        log.flush()  # the log holds every step the checkpoint holds
        save_warm_start(model, optimizer, cfg, step, rng_state, warm_set, run_id, path)
    with open(os.path.join(cfg.out_dir, "sft_log.jsonl") if rank() == 0 else os.devnull,
              "a") as log:
        for step in (bar := tqdm(range(first, cfg.sft_steps + 1), initial=first - 1,
                                 total=cfg.sft_steps, desc="sft",
                                 dynamic_ncols=True, disable=rank() != 0)):
            before = rng.getstate()
            updates = optimizer_updates(optimizer)
            try:
                picked = rng.sample(range(len(prompts)), min(cfg.sft_batch_size, len(prompts)))
                loss = sft_loss_backward(model, [prompts[i] for i in picked],
                                         [targets[i] for i in picked],
                                         cfg.micro_batch_size, pad_id, device, autocast,
                                         cfg.logprob_chunk, cfg.sft_rows_per_pass)
                lr = warmup_lr(cfg.sft_lr, step, cfg.warmup_steps)
                if cfg.sft_lr_decay:  # linearly, to sft_lr / sft_steps at the last step
                    lr *= 1 - (step - 1) / cfg.sft_steps
                optimizer_step(model, optimizer, lr, cfg.grad_clip, loss=loss)
            except Exception as error:
                # the weights are still step - 1's
                if optimizer_updates(optimizer) == updates and step > first:
                    save(step - 1, before)
                    if rank() == 0:
                        tqdm.write(f"warm-start step {step} failed ({type(error).__name__}: "
                                   f"{error}); {path} holds warm-start step {step - 1}. Continue "
                                   f"with: {resume_command()}")
                raise
            bar.set_postfix(loss=f"{loss.item():.3f}")
            log.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
            # a signal in the last step stops the run once RL's first checkpoint is written
            # (run.setup)
            stopping = stop.agreed() if stop is not None and step < cfg.sft_steps else False
            if stopping or (cfg.sft_checkpoint_every and step % cfg.sft_checkpoint_every == 0):
                save(step, rng.getstate())
            if stopping:
                report_stop(stopping, f"warm-start step {step}", cfg)
                return step
    return cfg.sft_steps

# -----------------------------------------------------------------------------
# the baselines


def supervised_update(run, cfg, step: int, prompts: list, targets: list) -> dict:
    """One optimizer step on the mean next-token loss of targets after prompts; the sampler follows
    the policy."""
    lr = warmup_lr(cfg.lr, step, cfg.warmup_steps)
    loss = sft_loss_backward(run.policy, prompts, targets, cfg.micro_batch_size,
                             run.tokenizer.pad_token_id,
                             run.policy.lm_head.weight.device, run.autocast, cfg.logprob_chunk,
                             cfg.sft_rows_per_pass)
    grad_norm = optimizer_step(run.policy, run.optimizer, lr, cfg.grad_clip, loss=loss)
    if run.sampler is not run.policy:
        copy_weights(run.sampler, run.policy)
    return {"loss": loss.item(), "grad_norm": grad_norm.item(), "lr": lr}


def rft_step(run, cfg, step: int) -> tuple[Samples, dict]:
    """One step of rejection-sampling fine-tuning: grpo_step's samples, then one supervised update
    on the correct ones only; none correct, no update. kept_fraction is the share of samples trained
    on."""
    samples = sample_groups(run, cfg, step)
    kept = [i for i, correct in enumerate(samples.components["correctness"]) if correct == 1.0]
    t1 = time.perf_counter()
    update = supervised_update(run, cfg, step, [samples.prompts[i] for i in kept],
                               [samples.completions[i] for i in kept]) if kept else \
        {"loss": None, "grad_norm": None, "lr": warmup_lr(cfg.lr, step, cfg.warmup_steps)}
    return samples, {"kept_fraction": len(kept) / len(samples.prompts), **update,
                     "time_update": time.perf_counter() - t1}


def sft_step(run, cfg, step: int) -> tuple[None, dict]:
    """One supervised step on prompts_per_step * group_size training rows (GRPO's completions per
    step): the RL rows' answers alone ("sft_answers"), or warm-start rows ("sft_more": run.setup
    gives it those as its rows)."""
    start = time.perf_counter()
    picked = run.stream.next(cfg.prompts_per_step * cfg.group_size)
    update = supervised_update(run, cfg, step, [run.prompts[i] for i in picked],
                               [sft_target(run.tokenizer, run.problems[i], run.template)
                                for i in picked])
    return None, {**update, "time_update": time.perf_counter() - start}
