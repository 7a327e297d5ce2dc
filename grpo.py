"""
GRPO's "learn" (DeepSeekMath, arXiv:2402.03300): the log-probs of the sampled tokens, the
advantages, the clipped objective and its variants, and the micro-batched update that keeps them
exact, in the order a step reads them:

    batches = make_micro_batches(prompts, completions, size, pad_id, device, sampler_logprobs)
    add_logprobs(reference, batches, "ref_logp", temperature, chunk, autocast)  # beta > 0: anchor
    set_advantages(batches, advantages_of(samples, batches, cfg))  # per completion or per token
    stats = update(policy, optimizer, batches, cfg, lr, autocast)  # mu optimizer steps on grpo_loss

The maths are pure functions: group_advantages (GRPO, Dr. GRPO, RLOO, REINFORCE), process_advantages
(per-step rewards), grpo_loss (PPO-clipped ratio per token or GSPO's per sequence, DAPO's
clip-higher, truncated importance sampling, a KL penalty by one of KL_ESTIMATORS, three loss
aggregations), kl_penalized_rewards (the KL in the reward instead). Which KL each estimator's
gradient follows is said once, in docs/guide.md ("The KL term"). The settings are config keys,
checked once when the config loads (check_settings, at the end of this file), trusted here.

The normaliser contract: a micro-batch's loss is divided by the WHOLE batch's sequence or token
count (every rank's under torchrun), fixed before the micro-batch loop, so the micro-batches'
gradients add up to the whole batch's exactly, however the rows are split (policy_gradient keeps
it). The full-vocabulary logits of a micro-batch never exist at once: lm_head and log_softmax run a
chunk of tokens at a time (completion_logprobs).
"""
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from distributed import accumulating, max_over_ranks, summed_over_ranks, whole, world_size

BASELINES = ("mean", "rloo", "none")
SCALES = ("std", "none")
LOSS_AGGS = ("seq_mean", "token_mean", "constant")
KL_ESTIMATORS = ("k3", "k3_is", "k2", "k1_reward")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
# exp(20) ~ 5e8 is finite in fp32; one outlier token cannot overflow the k3 term
KL_LOG_RATIO_CLAMP = 20.0
GAP_STATS = ("logprob_gap", "logprob_gap_max", "sampler_ratio")

# -----------------------------------------------------------------------------
# the step's rows in micro-batches: a row is a prompt (token ids) followed by its completion (token
# ids, stop token included); make_micro_batches() splits a step's rows, pack() lays rows out in one
# tensor


@dataclass
class MicroBatch:
    ids: torch.Tensor  # [b, P + N] left-padded prompts, then completions (right-padded)
    attention_mask: torch.Tensor  # [b, P + N] bool: real tokens
    mask: torch.Tensor  # [b, N] bool: completion tokens, stop token included
    prompt_width: int  # P
    rows: list[int]  # the step's rows this micro-batch holds, in its order
    advantages: torch.Tensor | None = None  # [b] float32, or [b, N] per token (set_advantages)
    old_logp: torch.Tensor | None = None  # [b, N] under the sampling policy (mu > 1 only)
    ref_logp: torch.Tensor | None = None  # [b, N] under the reference model (beta > 0 only)
    sampler_logp: torch.Tensor | None = None  # [b, N] as the sampler computed them when it drew


def make_micro_batches(prompts, completions, size: int, pad_id: int, device,
                       sampler_logprobs: list[list[float]] | None = None) -> list[MicroBatch]:
    """Split rows into micro-batches of `size` rows of similar total length (less padding); any
    split is exact (whole-batch normalisers). Rows are reordered: per-row data lives in the
    MicroBatch (set_advantages). sampler_logprobs: the sampler's own (Rollout.logprobs)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(completions[i]))
    batches = []
    for start in range(0, len(order), size):
        rows = order[start:start + size]
        ids, attention_mask, mask, width = pack([prompts[i] for i in rows],
                                                [completions[i] for i in rows], pad_id)
        batch = MicroBatch(ids.to(device), attention_mask.to(device), mask.to(device), width, rows)
        if sampler_logprobs is not None:
            flat = torch.tensor([x for i in rows for x in sampler_logprobs[i]])
            batch.sampler_logp = torch.zeros(mask.shape).masked_scatter(mask, flat).to(device)
        batches.append(batch)
    return batches


def pack(prompts: list[list[int]], completions: list[list[int]], pad_id: int):
    """Left-pad prompts, append completions -> ids [b, P+N], attention_mask [b, P+N], mask [b, N],
    P. The mask comes from the lengths, never from token values (Qwen's pad token is its EOS)."""
    width = max(map(len, prompts))
    n_new = max(map(len, completions))
    ids = torch.full((len(prompts), width + n_new), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(ids, dtype=torch.bool)
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        ids[i, width - len(prompt):width + len(completion)] = torch.tensor(prompt + completion)
        attention_mask[i, width - len(prompt):width + len(completion)] = True
    return ids, attention_mask, attention_mask[:, width:].clone(), width


# -----------------------------------------------------------------------------
# log-probs of the sampled tokens: completion_logprobs() runs the model and gives the log-prob of
# every completion token; add_logprobs() keeps the reference's (beta > 0) and the sampling policy's
# (mu > 1)


@torch.no_grad()
def add_logprobs(model, batches: list[MicroBatch], field: str, temperature: float, chunk: int,
                 autocast):
    """Fill each micro-batch's `field` ("old_logp" or "ref_logp") with its log-probs under model."""
    for batch in batches:
        with autocast:
            setattr(batch, field, completion_logprobs(model, batch, temperature, chunk)[0])


def completion_logprobs(model, batch: MicroBatch, temperature: float, chunk: int):
    """Log-probs [b, N] fp32 of the completion tokens (0 off the mask) under log_softmax(logits /
    temperature), and their summed entropy (0-d, no grad). Only masked positions go through
    lm_head, `chunk` tokens at a time, each chunk recomputed in backward instead of stored."""
    hidden = model(batch.ids, attention_mask=batch.attention_mask, return_hidden=True)
    hidden = hidden[:, batch.prompt_width - 1:-1][batch.mask]  # [M, dim]: position t scores t+1
    targets = batch.ids[:, batch.prompt_width:][batch.mask]  # [M]
    pieces, entropy = [], torch.zeros((), device=hidden.device)
    for start in range(0, targets.numel(), chunk):
        args = (model.lm_head, hidden[start:start + chunk], targets[start:start + chunk],
                temperature)
        if torch.is_grad_enabled():
            logp, ent = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            logp, ent = _chunk_logprobs(*args)
        pieces.append(logp)
        entropy = entropy + ent
    values = torch.cat(pieces) if pieces else hidden.new_zeros(0, dtype=torch.float32)
    logp = torch.zeros(batch.mask.shape, device=values.device).masked_scatter(batch.mask, values)
    return logp, entropy


def _chunk_logprobs(lm_head, hidden, targets, temperature):
    """hidden [M, dim], targets [M] -> (each target's log-prob [M] fp32, summed entropy 0-d)."""
    logits = lm_head(hidden).float() / temperature
    log_z = logits.logsumexp(dim=-1)
    chosen = logits.gather(-1, targets[:, None]).squeeze(-1) - log_z
    with torch.no_grad():
        entropy = (log_z - (logits.softmax(dim=-1) * logits).sum(dim=-1)).sum()
    return chosen, entropy


# -----------------------------------------------------------------------------
# advantages


def advantages_of(samples, batches: list[MicroBatch], cfg) -> torch.Tensor:
    """The advantages of a step's samples (rollout.Samples): [B] per completion (outcome
    supervision: group_advantages of the rewards, with k1_reward less beta times each sequence's
    log-ratio to the reference), or [B, T] per token (process supervision: process_advantages of
    the arithmetic claims; "both" adds process_weight times them to the outcome's)."""
    rewards = torch.tensor(samples.rewards)
    if cfg.kl_estimator == "k1_reward" and cfg.beta > 0:
        log_ratio = sequence_sums(batches, lambda batch: batch.sampler_logp - batch.ref_logp,
                                  len(rewards))
        rewards = kl_penalized_rewards(rewards, log_ratio, cfg.beta)
    advantages = group_advantages(rewards, cfg.group_size, baseline=cfg.adv_baseline,
                                  scale=cfg.adv_scale)
    if cfg.supervision == "outcome":
        return advantages
    rewards, ends, mask = claim_tensors(samples.claims)
    process = process_advantages(rewards, ends, cfg.group_size, max(samples.lengths), mask)
    if cfg.supervision == "process":
        return process
    return advantages[:, None] + cfg.process_weight * process  # "both"


def sequence_sums(batches: list[MicroBatch], values, n: int) -> torch.Tensor:
    """[n] (on the CPU): each row's sum over its completion tokens of values(batch) [b, N]."""
    sums = torch.zeros(n)
    for batch in batches:
        sums[batch.rows] = (values(batch) * batch.mask).sum(dim=1).float().cpu()
    return sums


def kl_penalized_rewards(rewards, sequence_log_ratio, beta):
    """kl_estimator="k1_reward": rewards [B] minus beta times each sequence's log pi_theta / pi_ref
    [B] (k1 summed over its tokens, under the policy that sampled it), before group_advantages; the
    loss then adds no KL term."""
    if rewards.shape != sequence_log_ratio.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and sequence_log_ratio "
                         f"{tuple(sequence_log_ratio.shape)} must both be [B]")
    return rewards.float() - beta * sequence_log_ratio.float()


def group_advantages(rewards, group_size, baseline="mean", scale="std", eps=1e-6):
    """Outcome advantages, one per completion: rewards [B] float -> advantages [B] float32.

    baseline: "mean" subtracts the group mean (GRPO); "rloo" the mean of the *other* G-1 rewards
    (leave-one-out, = G/(G-1) * (r - mean)); "none" keeps the raw reward (REINFORCE).
    scale: "std" divides by (group std + eps), the unbiased std (torch.std's, as DeepSeekMath and
    TRL); "none" does not divide (Dr. GRPO, arXiv:2503.20783).
    GRPO = ("mean", "std"), Dr. GRPO = ("mean", "none"), RLOO = ("rloo", "none"), REINFORCE =
    ("none", "none"). With a baseline, a group whose rewards are all equal gets exactly 0.
    """
    grouped = _grouped(rewards, group_size)  # [n_groups, G]
    if baseline == "none":
        if scale != "none":
            raise ValueError("scale='std' needs a baseline: a raw reward divided by a zero group "
                             "std explodes")
        return grouped.flatten()
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if baseline == "rloo":
        centred = centred * group_size / (group_size - 1)
    elif baseline != "mean":
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if scale == "std":
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    elif scale != "none":
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    all_equal = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(all_equal, torch.zeros_like(centred), centred).flatten()


def _grouped(rewards, group_size):
    """rewards [B] -> [B // group_size, group_size] float32 (a ragged batch raises)."""
    return rewards.float().view(-1, group_size)


def zero_std_group_fraction(rewards, group_size):
    """The share of groups whose rewards are all equal (no signal): rewards [B] -> 0-d tensor."""
    grouped = _grouped(rewards, group_size)
    return (grouped == grouped[:, :1]).all(dim=1).float().mean()


def claim_tensors(claims: list[list[tuple[int, float]]]) -> tuple[torch.Tensor, ...]:
    """Per-completion claims [(token index of the claim's end, reward)] -> process_advantages'
    claim_rewards [B, S] float, claim_ends [B, S] long, claim_mask [B, S] bool (right-padded)."""
    width = max(map(len, claims))
    padded = [row + [(0, 0.0)] * (width - len(row)) for row in claims]
    return (torch.tensor([[reward for _, reward in row] for row in padded]),
            torch.tensor([[end for end, _ in row] for row in padded]),
            torch.tensor([[True] * len(row) + [False] * (width - len(row)) for row in claims]))


def process_advantages(claim_rewards, claim_ends, group_size, seq_len, claim_mask=None, eps=1e-6):
    """Process-supervision advantages (DeepSeekMath sec. 4.1.3): per-token advantages [B, T]
    float32. A reasoning step here is an arithmetic claim (rewards.claim_rewards); any per-step
    reward fits.

    claim_rewards [B, S] float: each reasoning step's reward, right-padded to S steps.
    claim_ends [B, S] long: the completion-token index (0 .. seq_len-1) of each step's last token.
    claim_mask [B, S] bool: which entries are real steps (default: all); padding is ignored.
    A group's real steps are normalised together, (r - mean) / (unbiased std + eps); token t gets
    the sum of the normalised rewards of its sequence's steps that end at or after t (0 after the
    last). A group whose step rewards are all equal gets exactly 0.
    """
    if claim_rewards.shape != claim_ends.shape or claim_rewards.dim() != 2:
        raise ValueError(f"claim_rewards {tuple(claim_rewards.shape)} and claim_ends "
                         f"{tuple(claim_ends.shape)} must both be [B, S]")
    if group_size < 1 or claim_rewards.shape[0] % group_size:
        raise ValueError(f"batch of {claim_rewards.shape[0]} sequences is not a whole number of "
                         f"groups of size {group_size}")
    if claim_mask is None:
        claim_mask = torch.ones_like(claim_ends, dtype=torch.bool)
    claim_mask = claim_mask.bool()
    if claim_mask.shape != claim_ends.shape:
        raise ValueError(f"claim_mask has shape {tuple(claim_mask.shape)}, claim_ends has "
                         f"{tuple(claim_ends.shape)}")
    real_ends = claim_ends[claim_mask]
    if real_ends.numel() and (real_ends.min() < 0 or real_ends.max() >= seq_len):
        raise ValueError(f"claim_ends must lie in [0, {seq_len - 1}], got {real_ends.min()} .. "
                         f"{real_ends.max()}")
    group_steps = group_size * claim_rewards.shape[1]
    weights = claim_mask.reshape(-1, group_steps).float()  # [n_groups, G * S]
    rewards = claim_rewards.float().reshape(-1, group_steps)
    rewards = rewards.masked_fill(weights == 0, 0.0)  # padding may be nan
    count = weights.sum(dim=1, keepdim=True)
    mean = rewards.sum(dim=1, keepdim=True) / count.clamp(min=1)
    var = ((rewards - mean) ** 2 * weights).sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)
    normalised = (rewards - mean) / (var.sqrt() + eps)
    lowest = rewards.masked_fill(weights == 0, float("inf")).amin(dim=1, keepdim=True)
    highest = rewards.masked_fill(weights == 0, float("-inf")).amax(dim=1, keepdim=True)
    normalised = torch.where((lowest == highest) | (weights == 0), torch.zeros_like(normalised),
                             normalised)
    # each step's value at its last token; a reverse cumulative sum: "steps ending at or after t"
    at_end = torch.zeros(claim_rewards.shape[0], seq_len, dtype=torch.float32,
                         device=claim_rewards.device)
    at_end.scatter_add_(1, torch.where(claim_mask, claim_ends, 0),
                        normalised.view(claim_rewards.shape))
    return at_end.flip(1).cumsum(1).flip(1)


def set_advantages(batches: list[MicroBatch], advantages: torch.Tensor):
    """advantages: [B] (one per completion) or [B, T] (per token, T >= the longest completion), in
    the step's row order: each micro-batch takes its rows and, per token, its own N completion
    columns."""
    for batch in batches:
        rows = advantages[batch.rows]
        if advantages.dim() == 2:  # per token: this micro-batch's N completion columns
            rows = rows[:, :batch.mask.shape[1]]
        batch.advantages = rows.to(batch.ids.device)


# -----------------------------------------------------------------------------
# the update: mu optimizer steps on the loss over every micro-batch


def warmup_lr(lr: float, step: int, warmup_steps: int) -> float:
    """Linear warm-up over the first warmup_steps steps (step counts from 1), then constant."""
    return lr * min(1.0, step / max(1, warmup_steps))


def update(policy, optimizer, batches: list[MicroBatch], cfg, lr: float, autocast,
           ddp=None) -> dict[str, float]:
    """cfg.mu optimizer steps on the GRPO loss of the step's micro-batches; returns the update's
    stats, each the mean over the mu steps (loss, kl, clip fractions, ratio, entropy, grad_norm),
    and GAP_STATS from the first. ddp: the wrapper the loss runs through under torchrun."""
    stats = {}
    gap = {}
    for epoch_index in range(cfg.mu):
        epoch = policy_gradient(ddp or policy, batches, cfg, autocast, measure_gap=epoch_index == 0)
        gap.update({key: epoch.pop(key) for key in GAP_STATS if key in epoch})
        norm = optimizer_step(policy, optimizer, lr, cfg.grad_clip, loss=epoch["loss"])
        epoch["grad_norm"] = whole(norm)
        stats = {key: stats.get(key, 0) + value / cfg.mu for key, value in epoch.items()}
    stats.update(gap)
    values = torch.stack(list(stats.values())).tolist()  # one host sync for all of them
    return dict(zip(stats, values))


def policy_gradient(policy, batches: list[MicroBatch], cfg, autocast,
                    measure_gap: bool = False) -> dict:
    """Forward and backward of the GRPO loss over every micro-batch with the whole batch's
    normalisers (every rank's under torchrun): the gradients add up to the whole batch's, the stats
    returned (0-d tensors, no host sync) to its means: loss, kl, clip fractions, ratio, entropy per
    token. measure_gap: also GAP_STATS, how far the trainer's log-probs of the sampled tokens lie
    from the sampler's (sampler_gap)."""
    n_seq, n_tok = batch_sizes(batches)
    totals = {}
    gap_max = torch.zeros((), device=n_tok.device)
    for i, batch in enumerate(batches):
        with accumulating(policy, last=i == len(batches) - 1):  # DDP syncs in the last backward
            with autocast:
                logp, entropy = completion_logprobs(policy, batch, cfg.temperature,
                                                    cfg.logprob_chunk)
            loss, stats = grpo_loss(
                logp, batch.old_logp, batch.ref_logp, batch.advantages, batch.mask,
                num_sequences=n_seq, num_tokens=n_tok, constant_norm=cfg.max_new_tokens,
                sampler_logp=batch.sampler_logp, clip_eps=cfg.clip_eps,
                clip_eps_high=cfg.clip_eps_high, beta=cfg.beta, kl_estimator=cfg.kl_estimator,
                loss_agg=cfg.loss_agg, importance_sampling_level=cfg.importance_sampling_level,
                tis_cap=cfg.tis_cap)
            # DDP and FSDP2 average the ranks' gradients; whole-batch normalisers make it a sum
            (loss * world_size()).backward()
        if measure_gap:
            gap, batch_max = sampler_gap(logp, batch, n_tok)
            stats = {**stats, **gap}
            gap_max = torch.maximum(gap_max, batch_max)
        for key, value in {"loss": loss.detach(), "entropy": entropy / n_tok, **stats}.items():
            totals[key] = totals.get(key, 0) + value
    sums = summed_over_ranks(torch.stack(list(totals.values())))
    totals = dict(zip(totals, sums))
    if measure_gap:
        totals["logprob_gap_max"] = max_over_ranks(gap_max)
    return totals


def batch_sizes(batches: list[MicroBatch]) -> tuple:
    """The step's sequence and completion-token counts (0-d tensors; every rank's under torchrun):
    the loss normalisers of every micro-batch."""
    n_seq = sum(b.mask.shape[0] for b in batches)
    n_tok = sum(b.mask.sum() for b in batches)
    if dist.is_initialized():
        counts = torch.stack([torch.tensor(n_seq, device=n_tok.device), n_tok])
        n_seq, n_tok = summed_over_ranks(counts)
    return n_seq, n_tok


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, num_sequences=None, num_tokens=None,
              constant_norm=None, sampler_logp=None, clip_eps=0.2, clip_eps_high=None, beta=0.04,
              kl_estimator="k3", loss_agg="seq_mean", importance_sampling_level="token",
              tis_cap=None):
    """GRPO loss to minimise (= -J of DeepSeekMath) for a batch or micro-batch -> (loss, stats).

    logp [B, T]: the sampled tokens' log-probs under the policy, with grad (padding finite: 0).
    old_logp [B, T] or None: under the sampling policy, no grad. None (mu = 1): logp.detach(), a
        ratio of 1 in value that still carries the policy gradient.
    ref_logp [B, T] or None: under the reference model; None only when beta == 0.
    advantages [B] (per sequence) or [B, T] (per token); mask [B, T]: completion tokens.
    sampler_logp [B, T] or None: the sampler's own log-probs of the tokens, read with tis_cap.
    The knobs after it are the config keys of the same names, with the same defaults, trusted as
    given (check_settings checks the config's once); clip_eps_high None is clip_eps.

    Per token: -min(ratio * A, clip(ratio, 1 - clip_eps, 1 + clip_eps_high) * A) + beta * KL.
    KL by kl_estimator, in fp32, ref - logp clamped to +-20: "k3" exp(ref - logp) - (ref - logp) -
    1, "k3_is" the token ratio times k3, "k2" (ref - logp)^2 / 2, "k1_reward" none (it is in the
    rewards); which KL each one's gradient follows: docs/guide.md, "The KL term". tis_cap
    (truncated importance sampling, Yao et al. 2025) weighs the clipped term, not the KL, by
    min(exp(old_logp - sampler_logp), tis_cap), detached. importance_sampling_level "sequence"
    (GSPO, arXiv:2507.18071, eq. 7): one ratio per sequence, exp of the mean of its tokens'
    log-ratios, clipped per sequence (on-policy the token level's gradient with seq_mean; its
    ratios stay near 1, so it clips far tighter: clip_eps 3e-4, clip_eps_high 4e-4).
    loss_agg, with N = num_sequences and |o_i| the masked tokens of row i:
        "seq_mean"   (DeepSeekMath): sum_i (sum_t loss_it / |o_i|) / N
        "token_mean" (DAPO):         sum_it loss_it / num_tokens
        "constant"   (Dr. GRPO):     sum_it loss_it / (constant_norm * N)
    num_sequences, num_tokens, constant_norm default to this call's B, mask.sum() and T; under
    gradient accumulation pass the WHOLE batch's to every micro-batch (policy_gradient).
    stats (0-d, detached), sums over this call's tokens / num_tokens, adding up to the batch's
    means: "kl" (k3's value, whatever the estimator), "clip_frac_low" (A < 0, ratio clipped below),
    "clip_frac_high", "ratio_mean"; with tis_cap, "tis_capped_frac" and "tis_weight_mean".
    """
    if beta > 0 and ref_logp is None:
        raise ValueError(f"beta={beta} needs ref_logp; pass beta=0 to train without a reference")
    clip_eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    logp = logp.float()
    old_logp = logp.detach() if old_logp is None else old_logp.float()
    adv = advantages.float() if advantages.dim() == 2 else advantages.float().unsqueeze(1)
    weights = mask.float()

    token_ratio = torch.exp(logp - old_logp)  # [B, T]
    if importance_sampling_level == "token":
        ratio = token_ratio
    elif importance_sampling_level == "sequence":  # GSPO: one ratio per sequence, for its tokens
        lengths = weights.sum(dim=1, keepdim=True).clamp(min=1)  # [B, 1]
        mean_log_ratio = ((logp - old_logp) * weights).sum(dim=1, keepdim=True) / lengths
        ratio = torch.exp(mean_log_ratio).expand_as(logp)
    else:
        raise ValueError(f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}")
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps_high)
    token_loss = -torch.minimum(ratio * adv, clipped * adv)
    if tis_cap is not None:  # truncated importance sampling: sampler -> pi_old, capped, no grad
        if sampler_logp is None:
            raise ValueError("tis_cap needs sampler_logp, the sampler's log-probs of the tokens")
        sampler_ratio = torch.exp(old_logp - sampler_logp.float()).detach()
        token_loss = token_loss * sampler_ratio.clamp(max=tis_cap)
    kl = None
    if ref_logp is not None:
        log_ratio = (ref_logp.float() - logp).clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
        kl = torch.exp(log_ratio) - log_ratio - 1
        if beta > 0 and kl_estimator != "k1_reward":  # k1_reward's KL is in the rewards
            if kl_estimator == "k3":
                penalty = kl
            elif kl_estimator == "k3_is":
                penalty = token_ratio * kl
            elif kl_estimator == "k2":
                penalty = 0.5 * log_ratio ** 2
            else:
                raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got "
                                 f"{kl_estimator!r}")
            token_loss = token_loss + beta * penalty

    masked_sum = (token_loss * weights).sum(dim=1)  # [B]
    n_seq = logp.shape[0] if num_sequences is None else num_sequences
    if loss_agg == "seq_mean":
        loss = (masked_sum / weights.sum(dim=1).clamp(min=1)).sum() / n_seq
    elif loss_agg == "token_mean":
        loss = masked_sum.sum() / (weights.sum().clamp(min=1) if num_tokens is None else num_tokens)
    elif loss_agg == "constant":
        width = logp.shape[1] if constant_norm is None else constant_norm
        loss = masked_sum.sum() / (width * n_seq)
    else:
        raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, got {loss_agg!r}")

    with torch.no_grad():
        token_count = weights.sum().clamp(min=1) if num_tokens is None else num_tokens

        def token_mean(x):
            return (x.float() * weights).sum() / token_count
        stats = {
            "kl": torch.tensor(float("nan"), device=logp.device) if kl is None else token_mean(kl),
            "clip_frac_low": token_mean((adv < 0) & (ratio < 1 - clip_eps)),
            "clip_frac_high": token_mean((adv > 0) & (ratio > 1 + clip_eps_high)),
            "ratio_mean": token_mean(ratio),
        }
        if tis_cap is not None:
            stats["tis_capped_frac"] = token_mean(sampler_ratio > tis_cap)
            stats["tis_weight_mean"] = token_mean(sampler_ratio.clamp(max=tis_cap))
    return loss, stats


@torch.no_grad()
def sampler_gap(logp: torch.Tensor, batch: MicroBatch, n_tok) -> tuple[dict, torch.Tensor]:
    """How far the trainer's log-probs logp [b, N] of the sampled tokens lie from the sampler's:
    this micro-batch's share of {"logprob_gap": mean |trainer - sampler|, "sampler_ratio": mean
    exp(trainer - sampler)} over n_tok tokens, and its max |trainer - sampler| (0-d)."""
    diff = (logp.detach() - batch.sampler_logp).masked_fill(~batch.mask, 0.0)
    shares = {"logprob_gap": diff.abs().sum() / n_tok,
              "sampler_ratio": (diff.exp() * batch.mask).sum() / n_tok}
    return shares, diff.abs().max()


# -----------------------------------------------------------------------------
# the optimizer: AdamW over fp32 master weights, the update every training step ends with (GRPO, the
# warm start, the baselines)


def optimizer_step(model, optimizer, lr: float, grad_clip: float,
                   loss: torch.Tensor | None = None) -> torch.Tensor:
    """The update every training step ends with: clip the global grad norm to grad_clip (0 = no
    clipping), step, zero the grads; returns the norm before clipping. A non-finite norm raises
    FloatingPointError before the update (the weights stay), saying whether the loss was finite."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                          grad_clip if grad_clip > 0 else math.inf)
    if not torch.isfinite(norm):  # one host sync per update: the price of never writing nan weights
        optimizer.zero_grad(set_to_none=True)
        if loss is not None and torch.isfinite(loss):
            raise FloatingPointError(
                f"gradient norm is {norm.item()} while the loss is finite ({loss.item():.4g}), so "
                "the backward pass made it: weights grown too large can (lower lr or grad_clip), "
                "and so can the attention backend or bf16 on CUDA (try dtype='float32')")
        with_loss = "" if loss is None else f" and the loss {loss.item()}"
        raise FloatingPointError(f"gradient norm is {norm.item()}{with_loss}: lower lr or "
                                 "grad_clip")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def configure_optimizer(model, lr: float, weight_decay: float = 0.0,
                        betas=(0.9, 0.99)) -> torch.optim.AdamW:
    """AdamW over model's trainable parameters; weight decay on matrices only (not norms, biases).
    Keep the parameters fp32: plain bf16 AdamW rounds an update of lr 1e-6 away."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=model.lm_head.weight.is_cuda)


def optimizer_updates(optimizer) -> int:
    """How many updates the optimizer has taken (AdamW's step count; 0 before the first)."""
    return next((int(state["step"]) for state in optimizer.state.values() if "step" in state), 0)


# -----------------------------------------------------------------------------
# the settings, checked once when the config loads (config.validate)


def check_settings(cfg):
    """A ValueError naming the knob unless cfg's loss settings (grpo_loss's keywords) and advantage
    settings (adv_baseline, adv_scale with group_size, k1_reward's needs) are ones grpo.py computes;
    run once, when the config loads."""
    clip_eps_high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    if cfg.loss_agg not in LOSS_AGGS:
        raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, got {cfg.loss_agg!r}")
    if cfg.kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {cfg.kl_estimator!r}")
    if cfg.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, "
                         f"got {cfg.importance_sampling_level!r}")
    if not (0 <= cfg.clip_eps < 1 and clip_eps_high >= 0):
        raise ValueError(f"need 0 <= clip_eps < 1 and clip_eps_high >= 0, got {cfg.clip_eps}, "
                         f"{clip_eps_high}")
    if not cfg.beta >= 0:
        raise ValueError(f"beta must be >= 0, got {cfg.beta}")
    if cfg.tis_cap is not None and not 1 <= cfg.tis_cap < float("inf"):
        raise ValueError("tis_cap must be None (off) or a number >= 1 (a cap below 1 would shrink "
                         f"every on-policy token's weight), got {cfg.tis_cap}")
    check_advantage_settings(cfg.adv_baseline, cfg.adv_scale, cfg.group_size)
    # the penalty lives in the outcome advantages
    if cfg.kl_estimator == "k1_reward" and cfg.beta > 0:
        if cfg.supervision == "process":
            raise ValueError("kl_estimator='k1_reward' puts the KL in the outcome rewards, which "
                             "supervision='process' does not use: the run would have no KL "
                             "penalty; use 'both', or k3_is in the loss")
        if cfg.adv_scale != "none":
            raise ValueError("kl_estimator='k1_reward' with adv_scale='std': in a group whose "
                             "rewards are all equal (all right or all wrong) the std scaling "
                             "divides beta back out and the KL alone gets unit-sized advantages; "
                             "set adv_scale='none' (Dr. GRPO), or keep std with a loss-side "
                             "estimator (k3_is)")


def check_advantage_settings(baseline: str, scale: str, group_size: int):
    """A ValueError unless group_advantages computes advantages with this baseline and scale in
    groups of this size."""
    if baseline not in BASELINES or scale not in SCALES:
        raise ValueError(f"baseline must be one of {BASELINES} and scale one of {SCALES}, got "
                         f"{baseline!r}, {scale!r}")
    if baseline == "none" and scale == "std":
        raise ValueError("scale='std' needs a baseline: a raw reward divided by a zero group std "
                         "explodes")
    if baseline != "none" and group_size < 2:
        raise ValueError(f"baseline {baseline!r} needs group_size >= 2, got {group_size}")
