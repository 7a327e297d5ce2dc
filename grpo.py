"""
GRPO's "learn" (DeepSeekMath, arXiv:2402.03300): the log-probs of the sampled tokens, the
advantages, the loss and its variants, and the micro-batched update that keeps them exact, in the
order a step reads them:

    loss = loss_of(cfg)  # once, at set-up: one part of each table, settings bound
    batches = make_micro_batches(prompts, completions, size, pad_id, device, sampler_logprobs)
    add_logprobs(reference, batches, "ref_logp", temperature, chunk, autocast)  # beta > 0: anchor
    set_rows(batches, "advantages", advantages_of(samples, batches, cfg))  # per completion, token
    stats = update(policy, optimizer, batches, loss, cfg, lr, autocast)  # mu optimizer steps

The maths are pure functions: group_advantages (GRPO, Dr. GRPO, RLOO, REINFORCE; group or batch
std), process_advantages (per-step rewards), kl_penalized_rewards (the KL in the reward), and the
loss's parts, one table per kind (IMPORTANCE_SAMPLING_LEVELS, POLICY_LOSSES, the masks,
IMPORTANCE_SAMPLING_MODES, KL_ESTIMATORS, the entropy bonus, LOSS_AGGS), each a short function
with its paper; grpo_loss computes any of them in one call. PPO (method="ppo") swaps the group
baseline for a learned critic's values: gae_advantages (GAE, whitened) and critic_update (the
clipped value loss), through the same step. Which KL each estimator's gradient
follows is said once, in docs/guide.md ("The KL term"). The settings are config keys, checked once
when the config loads (check_settings, at the end of this file), trusted here.

The normaliser contract: a micro-batch's loss is divided by the WHOLE batch's sequence or token
count (every rank's under torchrun), fixed before the micro-batch loop, so the micro-batches'
gradients add up to the whole batch's exactly, however the rows are split (policy_gradient keeps
it). Three masks: `mask` the completion tokens (scored, measured), `loss_mask` those the loss
trains on and normalises over, `policy_mask` those whose policy term counts. The full-vocabulary
logits of a micro-batch never exist at once: lm_head and log_softmax run a chunk of tokens at a
time (completion_logprobs).
"""
import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from functools import partial

import torch
from torch.utils.checkpoint import checkpoint

from distributed import (accumulating, from_every_rank, max_over_ranks, rank, summed_over_ranks,
                         whole, world_size)

BASELINES = ("mean", "rloo", "none")
SCALES = ("std", "batch", "none")
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
    mask: torch.Tensor  # [b, N] bool: completion tokens, stop token included (scored, measured)
    prompt_width: int  # P
    rows: list[int]  # the step's rows this micro-batch holds, in its order
    # [b, N] bool: the tokens the loss trains on and is normalised over (mask, less the completions
    # masked out: mask_truncated_completions)
    loss_mask: torch.Tensor | None = None
    # [b, N] bool: the tokens whose policy term counts (loss_mask; top_entropy_quantile narrows it)
    policy_mask: torch.Tensor | None = None
    advantages: torch.Tensor | None = None  # [b] float32, or [b, N] per token (set_advantages)
    old_logp: torch.Tensor | None = None  # [b, N] under the sampling policy (mu > 1 only)
    ref_logp: torch.Tensor | None = None  # [b, N] under the reference model (beta > 0 only)
    sampler_logp: torch.Tensor | None = None  # [b, N] as the sampler computed them when it drew
    values: torch.Tensor | None = None  # [b, N] the critic's, before the update (PPO only)
    returns: torch.Tensor | None = None  # [b, N] what the critic learns to predict (PPO only)


def make_micro_batches(prompts, completions, size: int, pad_id: int, device,
                       sampler_logprobs: list[list[float]] | None = None,
                       trained: list[bool] | None = None) -> list[MicroBatch]:
    """Split rows into micro-batches of `size` rows of similar total length (less padding); any
    split is exact (whole-batch normalisers). Rows are reordered: per-row data lives in the
    MicroBatch (set_rows). sampler_logprobs: the sampler's own (Rollout.logprobs); trained:
    per row, whether its completion is in the loss (None: every one)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(completions[i]))
    batches = []
    for start in range(0, len(order), size):
        rows = order[start:start + size]
        ids, attention_mask, mask, width = pack([prompts[i] for i in rows],
                                                [completions[i] for i in rows], pad_id)
        batch = MicroBatch(ids.to(device), attention_mask.to(device), mask.to(device), width, rows)
        batch.loss_mask = batch.mask
        if trained is not None:  # [b, 1]: the rows whose completion is in the loss
            kept = torch.tensor([trained[i] for i in rows], device=device)
            batch.loss_mask = batch.mask & kept[:, None]
        batch.policy_mask = batch.loss_mask
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


def completion_logprobs(model, batch: MicroBatch, temperature: float, chunk: int,
                        entropy: str | None = None):
    """Log-probs [b, N] fp32 of the completion tokens (0 off the mask) under log_softmax(logits /
    temperature), and their entropies as `entropy` asks: None, "sum" (over the tokens, 0-d, no
    grad: the logged mean) or "tokens" ([b, N], with grad where grad is on: an entropy bonus).
    Only masked positions go through lm_head, `chunk` tokens at a time, each recomputed in backward
    instead of stored."""
    hidden = completion_hidden(model, batch)  # [M, dim]
    targets = batch.ids[:, batch.prompt_width:][batch.mask]  # [M]
    logps, entropies = [], []
    for start in range(0, targets.numel(), chunk):
        args = (model.lm_head, hidden[start:start + chunk], targets[start:start + chunk],
                temperature, entropy)
        if torch.is_grad_enabled():
            logp, ent = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            logp, ent = _chunk_logprobs(*args)
        logps.append(logp)
        entropies.append(ent)
    logp = _scattered(logps, batch.mask, hidden)
    if entropy == "sum":
        return logp, sum((ent.sum() for ent in entropies), torch.zeros((), device=hidden.device))
    return logp, _scattered(entropies, batch.mask, hidden) if entropy == "tokens" else None


def completion_hidden(model, batch: MicroBatch) -> torch.Tensor:
    """The final normed hidden states [M, dim] that predict the M completion tokens of batch."""
    hidden = model(batch.ids, attention_mask=batch.attention_mask, return_hidden=True)
    return hidden[:, batch.prompt_width - 1:-1][batch.mask]  # position t scores token t + 1


def _chunk_logprobs(lm_head, hidden, targets, temperature, entropy):
    """hidden [M, dim], targets [M] -> (each target's log-prob [M] fp32, each position's entropy [M]
    (with grad only for entropy="tokens") or None)."""
    logits = lm_head(hidden).float()  # [M, V]
    if temperature != 1:  # a division by 1 would copy the logits for nothing
        logits = logits / temperature
    log_z = logits.logsumexp(dim=-1)
    chosen = logits.gather(-1, targets[:, None]).squeeze(-1) - log_z
    if entropy is None:
        return chosen, None
    with torch.set_grad_enabled(torch.is_grad_enabled() and entropy == "tokens"):
        return chosen, log_z - (logits.softmax(dim=-1) * logits).sum(dim=-1)


def _scattered(pieces: list[torch.Tensor], mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The chunks' values [M] laid out on mask [b, N] (0 elsewhere), fp32."""
    values = torch.cat(pieces) if pieces else like.new_zeros(0, dtype=torch.float32)
    return torch.zeros(mask.shape, device=values.device).masked_scatter(mask, values)


@torch.no_grad()
def mark_high_entropy(policy, batches: list[MicroBatch], quantile: float, temperature: float,
                      chunk: int, autocast):
    """top_entropy_quantile (Wang et al. 2025, "Beyond the 80/20 rule", arXiv:2506.01939): each
    micro-batch's policy_mask keeps the tokens of its loss_mask whose entropy under the policy lies
    in the top `quantile` of the whole step's loss tokens (every rank's; torch.quantile's linear
    interpolation, as TRL's). One no-grad forward of the step; the tokens are chosen once, before
    the first of the mu updates."""
    entropies = []
    for batch in batches:
        with autocast:
            entropies.append(completion_logprobs(policy, batch, temperature, chunk, "tokens")[1])
    values = torch.cat([e[b.loss_mask] for e, b in zip(entropies, batches)]).cpu()  # [M]
    threshold = entropy_floor(torch.cat(from_every_rank(values)), quantile)
    for entropy, batch in zip(entropies, batches):
        batch.policy_mask = batch.loss_mask & (entropy >= threshold)


def entropy_floor(values: torch.Tensor, quantile: float):
    """The entropy at or above which the top `quantile` of values [M] lie (torch.quantile's linear
    interpolation, as TRL's); inf when there are none."""
    return torch.quantile(values.float(), 1 - quantile) if values.numel() else math.inf


# -----------------------------------------------------------------------------
# advantages


def advantages_of(samples, batches: list[MicroBatch], cfg) -> torch.Tensor:
    """The advantages of a step's samples (rollout.Samples): [B] per completion, group_advantages
    of the rewards (with k1_reward less beta times each sequence's log-ratio to the reference); or
    [B, T] per token (process_supervised)."""
    rewards = torch.tensor(samples.rewards)
    if cfg.kl_estimator == "k1_reward" and cfg.beta > 0:
        log_ratio = sequence_sums(batches, lambda batch: batch.sampler_logp - batch.ref_logp,
                                  len(rewards))
        rewards = kl_penalized_rewards(rewards, log_ratio, cfg.beta)
    every = torch.cat(from_every_rank(rewards))  # every rank's: scale "batch" reads them all
    advantages = group_advantages(every, cfg.group_size, baseline=cfg.adv_baseline,
                                  scale=reward_scale(cfg))
    advantages = advantages.view(world_size(), -1)[rank()]  # this rank's rows
    if cfg.supervision != "outcome":
        return process_supervised(advantages, samples, cfg)
    return advantages


def process_supervised(advantages, samples, cfg) -> torch.Tensor:
    """Per token [B, T]: process_advantages of the arithmetic claims (supervision="process"), or
    the outcome advantages [B] plus process_weight times them ("both")."""
    rewards, ends, mask = claim_tensors(samples.claims)
    process = process_advantages(rewards, ends, cfg.group_size, max(samples.lengths), mask)
    if cfg.supervision == "process":
        return process
    return advantages[:, None] + cfg.process_weight * process  # "both"


def reward_scale(cfg) -> str:
    """group_advantages' scale for cfg: scale_rewards in TRL's names ("group" is "std"), or "none"
    where adv_scale, its older name, says so."""
    return "none" if cfg.adv_scale == "none" else {"group": "std"}.get(cfg.scale_rewards,
                                                                      cfg.scale_rewards)


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
    TRL); "batch" by (the std of all B rewards + eps), as PPO-Lite (arXiv:2508.08221) and TRL's
    scale_rewards="batch"; "none" does not divide (Dr. GRPO, arXiv:2503.20783).
    GRPO = ("mean", "std"), Dr. GRPO = ("mean", "none"), RLOO = ("rloo", "none"), REINFORCE =
    ("none", "none"). With a baseline, a group whose rewards are all equal gets exactly 0."""
    grouped = _grouped(rewards, group_size)  # [n_groups, G]
    if (baseline, scale) == ("none", "none"):  # REINFORCE: the raw rewards
        return grouped.flatten()
    if baseline not in ("mean", "rloo") or scale not in SCALES:
        check_advantage_settings(baseline, scale, group_size)  # raises, naming what is wrong
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if baseline == "rloo":
        centred = centred * group_size / (group_size - 1)
    if scale == "std":
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    elif scale == "batch":
        centred = centred / (grouped.std() + eps)
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


def gae_advantages(critic, samples, batches: list[MicroBatch], cfg, autocast) -> dict:
    """PPO's advantages and returns [B, T] (method="ppo", as verl and InstructGPT compute them), set
    as each micro-batch's rows, after the critic's values (add_values); returns the stats. Each
    completion's reward at its last token, less beta times each token's log-ratio to the reference
    with kl_estimator="k1_reward" (token_rewards); GAE on the critic's values (gae); the advantages
    whitened over the step's tokens (whitened). The stats: what the values explain of the returns
    (explained_variance), returns_mean, values_mean. One process (config.validate)."""
    add_values(critic, batches, autocast)
    width = max(samples.lengths)
    mask = per_row(batches, lambda batch: batch.mask, width)  # [B, T]
    values = per_row(batches, lambda batch: batch.values, width)
    log_ratio = None
    if cfg.kl_estimator == "k1_reward" and cfg.beta > 0:  # per token, in the rewards
        log_ratio = per_row(batches, lambda batch: batch.sampler_logp - batch.ref_logp, width)
    rewards = token_rewards(torch.tensor(samples.rewards), mask, log_ratio, cfg.beta)
    advantages, returns = gae(rewards, values, mask, cfg.gamma, cfg.lam)

    def mean(x):
        return (x * mask).sum() / mask.sum()

    def variance(x):  # unbiased, over the step's tokens
        return mean((x - mean(x)) ** 2) * mask.sum() / (mask.sum() - 1).clamp(min=1)
    stats = {"explained_variance": 1 - variance(returns - values) / (variance(returns) + 1e-5),
             "returns_mean": mean(returns), "values_mean": mean(values)}
    set_rows(batches, "advantages", whitened(advantages, mask))
    set_rows(batches, "returns", returns)
    return {key: value.item() for key, value in stats.items()}


def per_row(batches: list[MicroBatch], values, width: int) -> torch.Tensor:
    """[B, width] float32 (on the CPU), row i holding values(batch) [b, N] of the micro-batch that
    holds step row i; 0 past its N columns."""
    n = sum(len(batch.rows) for batch in batches)
    out = torch.zeros(n, width)
    for batch in batches:
        out[batch.rows, :batch.mask.shape[1]] = values(batch).float().cpu()
    return out


def token_rewards(rewards, mask, log_ratio=None, beta: float = 0.0) -> torch.Tensor:
    """Per-token rewards [B, T] for GAE: each completion's reward [B] at its last token (mask
    [B, T]: its completion tokens), and with log_ratio [B, T] (log pi_sampler - log pi_ref) minus
    beta times it at every token: PPO-RLHF's KL in the reward (k1; InstructGPT, arXiv:2203.02155,
    eq. 2)."""
    last = mask.long().sum(dim=1) - 1  # [B]
    out = torch.zeros(mask.shape)
    out[torch.arange(len(rewards)), last] = rewards.float()
    if log_ratio is not None:
        out = out - beta * log_ratio * mask
    return out


def gae(rewards, values, mask, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv:1506.02438): rewards, values,
    mask [B, T] -> advantages [B, T], A_t = sum_k (gamma lam)^k delta_{t+k}, delta_t = r_t +
    gamma V_{t+1} - V_t (V after a row's last token is 0), and returns A + V, the critic's targets.
    verl's compute_gae_advantage_return before its whitening; with gamma = lam = 1 (its defaults)
    A_t is the reward still to come less V_t."""
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(rewards.shape[0])
    running = torch.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        inside = mask[:, t].float()
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        # past a row's end nothing changes: the running sums wait for its last token
        running = inside * (delta + gamma * lam * running) + (1 - inside) * running
        next_value = inside * values[:, t] + (1 - inside) * next_value
        advantages[:, t] = running
    return advantages, advantages + values


def whitened(x, mask) -> torch.Tensor:
    """x [B, T] less its mean over the masked entries, times rsqrt(their unbiased variance + 1e-8):
    verl's masked_whiten, PPO's normalisation of its advantages over the batch."""
    count = mask.sum()
    mean = (x * mask).sum() / count
    variance = ((x - mean) ** 2 * mask).sum() / (count - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(variance + 1e-8)


def set_rows(batches: list[MicroBatch], field: str, values: torch.Tensor):
    """values of the step's rows ("advantages", "returns"): [B] (one per completion) or [B, T] (per
    token, T >= the longest completion), in the step's row order: each micro-batch takes its rows
    and, per token, its own N completion columns, as its `field`."""
    for batch in batches:
        rows = values[batch.rows]
        if values.dim() == 2:  # per token: this micro-batch's N completion columns
            rows = rows[:, :batch.mask.shape[1]]
        setattr(batch, field, rows.to(batch.ids.device))


# -----------------------------------------------------------------------------
# the update: mu optimizer steps on the loss over every micro-batch


def warmup_lr(lr: float, step: int, warmup_steps: int) -> float:
    """Linear warm-up over the first warmup_steps steps (step counts from 1), then constant."""
    return lr * min(1.0, step / max(1, warmup_steps))


def update(policy, optimizer, batches: list[MicroBatch], loss, cfg, lr: float, autocast,
           ddp=None) -> dict[str, float]:
    """cfg.mu optimizer steps on `loss` (the run's Loss) over the step's micro-batches; returns the
    stats, each the mean over the mu steps (loss, grad_norm, the loss's measures), and GAP_STATS
    from the first. ddp: the wrapper the loss runs through under torchrun."""
    stats = {}
    gap = {}
    for epoch_index in range(cfg.mu):
        epoch = policy_gradient(ddp or policy, batches, loss, cfg, autocast,
                                measure_gap=epoch_index == 0)
        gap.update({key: epoch.pop(key) for key in GAP_STATS if key in epoch})
        norm = optimizer_step(policy, optimizer, lr, cfg.grad_clip, loss=epoch["loss"])
        epoch["grad_norm"] = whole(norm)
        stats = {key: stats.get(key, 0) + value / cfg.mu for key, value in epoch.items()}
    stats.update(gap)
    values = torch.stack(list(stats.values())).tolist()  # one host sync for all of them
    return dict(zip(stats, values))


def policy_gradient(policy, batches: list[MicroBatch], loss, cfg, autocast,
                    measure_gap: bool = False) -> dict:
    """Forward and backward of `loss` over every micro-batch with the whole batch's normalisers
    (every rank's under torchrun): the gradients add up to the whole batch's, the stats (0-d
    tensors, no host sync) to its means over the completion tokens. measure_gap: also GAP_STATS
    (sampler_gap)."""
    sizes = batch_sizes(batches, cfg.max_new_tokens)
    totals = {}
    gap_max = torch.zeros((), device=sizes.scored.device)
    for i, batch in enumerate(batches):
        with accumulating(policy, last=i == len(batches) - 1):  # DDP syncs in the last backward
            with autocast:
                logp, entropy = completion_logprobs(policy, batch, cfg.temperature,
                                                    cfg.logprob_chunk, loss.entropy)
            value, stats = loss(terms_of(batch, logp, entropy), sizes)
            # DDP and FSDP2 average the ranks' gradients; whole-batch normalisers make it a sum
            (value * world_size()).backward()
        if measure_gap:
            gap, batch_max = sampler_gap(logp, batch, sizes.scored)
            stats = {**stats, **gap}
            gap_max = torch.maximum(gap_max, batch_max)
        for key, value in {"loss": value.detach(), **stats}.items():
            totals[key] = totals.get(key, 0) + value
    sums = summed_over_ranks(torch.stack(list(totals.values())))
    totals = dict(zip(totals, sums))
    if measure_gap:
        totals["logprob_gap_max"] = max_over_ranks(gap_max)
    return totals


@torch.no_grad()
def add_values(critic, batches: list[MicroBatch], autocast):
    """Fill each micro-batch's `values` with the critic's (completion_values) before the update: the
    V of GAE and the V_old the value loss clips around."""
    for batch in batches:
        with autocast:
            batch.values = completion_values(critic, batch)


def completion_values(critic, batch: MicroBatch) -> torch.Tensor:
    """The critic's values [b, N] fp32 (0 off the mask): its scalar head on the hidden state that
    predicts each completion token, the value of the prefix before it."""
    values = critic.value_head(completion_hidden(critic.body, batch)).squeeze(-1).float()  # [M]
    return torch.zeros(batch.mask.shape, device=values.device).masked_scatter(batch.mask, values)


def critic_update(critic, optimizer, batches: list[MicroBatch], cfg, lr: float, autocast) -> dict:
    """cfg.mu optimizer steps of PPO's critic on value_loss over the step's micro-batches (the whole
    step's token count the normaliser); returns value_loss and value_clip_frac (means over the mu
    steps) and critic_grad_norm."""
    tokens = sum(batch.loss_mask.sum() for batch in batches).clamp(min=1)
    stats = {}
    for _ in range(cfg.mu):
        totals = {}
        for batch in batches:
            with autocast:
                values = completion_values(critic, batch)
            loss, clipped = value_loss(values, batch.values, batch.returns, batch.loss_mask.float(),
                                       tokens, cfg.cliprange_value)
            loss.backward()
            for key, value in (("value_loss", loss.detach()), ("value_clip_frac", clipped)):
                totals[key] = totals.get(key, 0) + value
        totals["critic_grad_norm"] = optimizer_step(critic, optimizer, lr, cfg.grad_clip,
                                                    loss=totals["value_loss"])
        stats = {key: stats.get(key, 0) + value / cfg.mu for key, value in totals.items()}
    return dict(zip(stats, torch.stack(list(stats.values())).tolist()))


def value_loss(values, old_values, returns, mask, num_tokens, cliprange: float):
    """PPO's clipped value loss (verl's compute_value_loss, token-mean): 0.5 sum_t max((V - R)^2,
    (clip(V, V_old - c, V_old + c) - R)^2) / num_tokens, over mask [b, N]; and the share of tokens
    whose clipped term is the larger (value_clip_frac), as this micro-batch's part of the step's."""
    clipped = torch.max(torch.min(values, old_values + cliprange), old_values - cliprange)
    unclipped_loss = (values - returns) ** 2
    clipped_loss = (clipped - returns) ** 2
    loss = 0.5 * (torch.max(unclipped_loss, clipped_loss) * mask).sum() / num_tokens
    return loss, ((clipped_loss > unclipped_loss) * mask).sum().detach() / num_tokens


@dataclass
class Sizes:
    """A step's counts over every micro-batch and rank (0-d tensors, each at least 1): the loss's
    normalisers, fixed before the micro-batch loop, and the measures' denominator."""
    sequences: torch.Tensor  # completions with a token in the loss
    tokens: torch.Tensor  # tokens in the loss (loss_mask)
    policy_tokens: torch.Tensor  # tokens whose policy term counts (policy_mask)
    scored: torch.Tensor  # completion tokens (mask), over which the measures average
    width: int  # max_new_tokens: Dr. GRPO's constant


def batch_sizes(batches: list[MicroBatch], width: int) -> Sizes:
    """The step's Sizes (every rank's under torchrun: a collective)."""
    counts = torch.stack([sum(b.loss_mask.any(dim=1).sum() for b in batches),
                          sum(b.loss_mask.sum() for b in batches),
                          sum(b.policy_mask.sum() for b in batches),
                          sum(b.mask.sum() for b in batches)])
    return Sizes(*summed_over_ranks(counts).clamp(min=1), width)


@dataclass
class Terms:
    """What the loss's parts read, for one micro-batch: [b, N] fp32 unless said (terms_of)."""
    logp: torch.Tensor  # the sampled tokens' log-probs under the policy, with grad
    # under pi_old, no grad; mu = 1: logp.detach(), a ratio of 1 in value that carries the gradient
    old_logp: torch.Tensor
    log_ratio: torch.Tensor  # logp - old_logp
    token_ratio: torch.Tensor  # exp(log_ratio): pi_theta / pi_old per token
    advantages: torch.Tensor  # [b, 1] per completion, or [b, N] per token
    scored: torch.Tensor  # the completion tokens (MicroBatch.mask), which the measures average over
    mask: torch.Tensor  # the tokens in the loss (MicroBatch.loss_mask)
    policy_mask: torch.Tensor  # bool: the tokens whose policy term counts (MicroBatch.policy_mask)
    ref_logp: torch.Tensor | None  # under the reference model (beta > 0)
    sampler_logp: torch.Tensor | None  # as the sampler computed them when it drew
    entropy: torch.Tensor | None  # Loss.entropy's: the summed entropy (0-d), or each token's
    ratio: torch.Tensor | None = None  # the importance ratio: the loss's ratio part sets it


def terms_of(batch: MicroBatch, logp: torch.Tensor, entropy: torch.Tensor | None) -> Terms:
    """The Terms of a micro-batch whose completion tokens have log-probs logp [b, N] (with grad)."""
    old_logp = logp.detach() if batch.old_logp is None else batch.old_logp
    log_ratio = logp - old_logp  # [b, N]
    advantages = batch.advantages.float()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # [b, 1]
    return Terms(logp, old_logp, log_ratio, torch.exp(log_ratio), advantages, batch.mask.float(),
                 batch.loss_mask.float(), batch.policy_mask, batch.ref_logp, batch.sampler_logp,
                 entropy)


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
# the loss: built once from the config (loss_of) out of named parts, one table per kind; each part
# is a short function of a micro-batch's Terms, its settings bound when the loss is built, and the
# step runs only the parts chosen. A part that measures returns sums over the completion tokens
# (summed), logged as their means. A new variant: a function and its entry in a table.


@dataclass
class Loss:
    """The loss a run minimises (-J of DeepSeekMath, arXiv:2402.03300, and its variants), per
    micro-batch: the importance ratio; the policy term on it [b, N]; times the policy term's
    weights (masks, the sampler correction; no grad); plus the penalties (the KL) [b, N];
    aggregated over the tokens in the loss; less the bonuses (entropy). -> (loss, measures)"""
    entropy: str  # what completion_logprobs computes for it: "sum" (logged) or "tokens" (a bonus)
    ratio: typing.Callable  # IMPORTANCE_SAMPLING_LEVELS'
    policy: typing.Callable  # POLICY_LOSSES'
    weights: list  # the masks', then the sampler correction's (IMPORTANCE_SAMPLING_MODES)
    penalties: list  # the KL estimator's (KL_ESTIMATORS)
    aggregate: typing.Callable  # LOSS_AGGS'
    bonuses: list  # the entropy bonus's
    measures: list  # what only measures: the entropy; the KL when it is in the rewards

    def __call__(self, x: Terms, sizes: Sizes) -> tuple[torch.Tensor, dict]:
        x.ratio = self.ratio(x)  # [b, N]: the one ratio every part reads
        token_loss, sums = self.policy(x)  # [b, N]
        sums["ratio_mean"] = summed(x, x.ratio)
        for part in self.weights:
            weight, more = part(x)  # [b, N] or [b, 1]
            token_loss = token_loss * weight
            sums.update(more)
        for part in self.penalties:
            term, more = part(x)  # [b, N]
            token_loss = token_loss + term
            sums.update(more)
        loss = self.aggregate(token_loss, x.mask, sizes)
        for part in self.bonuses:
            loss = loss - part(x, sizes)
        for part in self.measures:
            sums.update(part(x))
        return loss, {key: value / sizes.scored for key, value in sums.items()}


def summed(x: Terms, value: torch.Tensor) -> torch.Tensor:
    """value's sum over the micro-batch's completion tokens (0-d, no grad): a measure."""
    return (value.detach().float() * x.scored).sum()

# the ratio (importance_sampling_level), [b, N] with grad


def token_ratio(x: Terms) -> torch.Tensor:
    """pi_theta / pi_old per token (PPO; DeepSeekMath eq. 3)."""
    return x.token_ratio


def sequence_ratio(x: Terms) -> torch.Tensor:
    """GSPO (arXiv:2507.18071, eq. 7): one ratio per completion, exp of the mean of its tokens'
    log-ratios, on each of its tokens. On-policy the token level's gradient under seq_mean; its
    ratios stay near 1, so it clips far tighter (clip_eps 3e-4, clip_eps_high 4e-4)."""
    lengths = x.scored.sum(dim=1, keepdim=True).clamp(min=1)  # [b, 1]
    mean_log_ratio = (x.log_ratio * x.scored).sum(dim=1, keepdim=True) / lengths  # [b, 1]
    return torch.exp(mean_log_ratio).expand_as(x.logp)


IMPORTANCE_SAMPLING_LEVELS = {"token": token_ratio, "sequence": sequence_ratio}

# the policy term (policy_loss, delta): per-token loss [b, N] and measures


def clip(x: Terms, low: float, high: float) -> tuple[torch.Tensor, dict]:
    """PPO's clipped surrogate (arXiv:1707.06347; DeepSeekMath eq. 3), with DAPO's clip-higher
    when high > low (arXiv:2503.14476): -min(r A, clip(r, 1 - low, 1 + high) A). Measures the
    tokens it clips: clip_frac_low (A < 0), clip_frac_high (A > 0)."""
    clipped = x.ratio.clamp(1 - low, 1 + high)
    token_loss = -torch.minimum(x.ratio * x.advantages, clipped * x.advantages)
    return token_loss, {"clip_frac_low": summed(x, (x.advantages < 0) & (x.ratio < 1 - low)),
                        "clip_frac_high": summed(x, (x.advantages > 0) & (x.ratio > 1 + high))}


def two_sided_clip(x: Terms, low: float, high: float, delta: float) -> tuple[torch.Tensor, dict]:
    """INTELLECT-2 (arXiv:2505.07291): PPO's clip with the ratio also capped at delta > 1 + high,
    which bounds the term of a negative advantage (PPO's min leaves it unbounded above). Measures
    delta_capped_frac: the tokens with A < 0 whose ratio passes delta."""
    token_loss, sums = clip(dataclasses.replace(x, ratio=x.ratio.clamp(max=delta)), low, high)
    sums["delta_capped_frac"] = summed(x, (x.advantages < 0) & (x.ratio > delta))
    return token_loss, sums


def cispo(x: Terms, high: float) -> tuple[torch.Tensor, dict]:
    """CISPO (MiniMax-M1, arXiv:2506.13585, eq. 4): the ratio itself, capped at 1 + high and
    detached, weighs A log pi_theta, so that every token keeps its gradient (PPO's clip drops the
    clipped ones'). Measures clip_frac_high: the tokens whose weight is capped."""
    weight = x.ratio.clamp(max=1 + high).detach()
    return -weight * x.advantages * x.logp, {"clip_frac_high": summed(x, x.ratio > 1 + high)}


def sapo(x: Terms, positive: float, negative: float) -> tuple[torch.Tensor, dict]:
    """SAPO (arXiv:2511.20347): a soft gate instead of the clip, -sigmoid(tau (r - 1)) 4 / tau A,
    with tau = positive for A > 0, negative otherwise; its gradient is that of r A at r = 1 and
    fades smoothly off-policy. Measures sapo_gate_mean: the gradient's weight against r A's, 4
    sigma (1 - sigma), 1 on-policy."""
    tau = torch.where(x.advantages > 0, positive, negative)  # [b, 1] or [b, N]
    gate = torch.sigmoid(tau * (x.ratio - 1))  # [b, N]
    return -(gate * 4 / tau) * x.advantages, {"sapo_gate_mean": summed(x, 4 * gate * (1 - gate))}


POLICY_LOSSES = {"clip": clip, "cispo": cispo, "sapo": sapo}

# the policy term's weights, no grad: masks (which tokens carry the policy gradient; the KL still
# applies to them) and the sampler correction


def high_entropy_only(x: Terms) -> tuple[torch.Tensor, dict]:
    """top_entropy_quantile (arXiv:2506.01939): only the step's highest-entropy tokens carry the
    policy gradient (MicroBatch.policy_mask, set by mark_high_entropy)."""
    return x.policy_mask, {}


def off_policy_sequences(x: Terms, threshold: float) -> tuple[torch.Tensor, dict]:
    """DeepSeek-V3.2 (arXiv:2512.02556, eq. 9): a completion with a negative advantage whose mean
    log pi_sampler / pi_theta over its tokens exceeds threshold is dropped from the policy term.
    Measures off_policy_masked_frac."""
    lengths = x.scored.sum(dim=1, keepdim=True).clamp(min=1)  # [b, 1]
    drift = ((x.sampler_logp - x.logp.detach()) * x.scored).sum(dim=1, keepdim=True) / lengths
    keep = (x.advantages >= 0) | (drift <= threshold)  # [b, 1], or [b, N] per-token advantages
    return keep, {"off_policy_masked_frac": summed(x, ~keep)}


def token_sampler_ratio(x: Terms) -> torch.Tensor:
    """pi_old / pi_sampler of each token [b, N]."""
    return torch.exp(x.old_logp - x.sampler_logp)


def sequence_sampler_ratio(x: Terms) -> torch.Tensor:
    """pi_old / pi_sampler of each whole completion [b, 1]: the product of its tokens' ratios."""
    return torch.exp(((x.old_logp - x.sampler_logp) * x.scored).sum(dim=1, keepdim=True))


def truncated(ratio: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Truncated importance sampling: the ratio clamped to [low, high]."""
    return ratio.clamp(low, high)


def masked(ratio: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Masked importance sampling: the ratio, or 0 (dropped) outside [low, high]."""
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


IMPORTANCE_SAMPLING_MODES = {"token_truncate": (token_sampler_ratio, truncated),
                             "token_mask": (token_sampler_ratio, masked),
                             "sequence_truncate": (sequence_sampler_ratio, truncated),
                             "sequence_mask": (sequence_sampler_ratio, masked)}


def sampler_correction(x: Terms, ratio_of, bound, low: float, high: float):
    """The sampler's numerics against the trainer's (a bf16 copy, a KV-cache decode): the policy
    term weighed by pi_old / pi_sampler, bounded to [low, high] (Yao et al. 2025, "Your efficient
    RL framework secretly brings you off-policy RL training"; TRL's vllm_importance_sampling_*).
    Measures tis_capped_frac (the tokens whose ratio lies outside [low, high]) and
    tis_weight_mean."""
    ratio = ratio_of(x)  # [b, N] or [b, 1]
    weight = bound(ratio, low, high)
    return weight, {"tis_capped_frac": summed(x, (ratio < low) | (ratio > high)),
                    "tis_weight_mean": summed(x, weight)}

# the penalties: per-token terms [b, N] added to the policy term's, and what only measures


def kl_penalty(x: Terms, beta: float, estimator) -> tuple[torch.Tensor, dict]:
    """beta times a per-token estimate of KL(pi_theta || pi_ref) (DeepSeekMath eq. 4) by
    estimator (KL_ESTIMATORS). Measures kl: k3's value, whatever the estimator."""
    log_ratio, kl = reference_log_ratio(x)
    return beta * estimator(x, log_ratio, kl), {"kl": summed(x, kl)}


def reference_kl(x: Terms) -> dict:
    """The kl measure alone (kl_estimator="k1_reward": the KL is in the rewards)."""
    return {"kl": summed(x, reference_log_ratio(x)[1])}


def reference_log_ratio(x: Terms) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi_ref / pi_theta per token, clamped to +-20 (exp(20) is finite in fp32: one outlier
    token cannot overflow k3), and k3 = exp(it) - it - 1 >= 0, each [b, N]."""
    log_ratio = (x.ref_logp - x.logp).clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    return log_ratio, torch.exp(log_ratio) - log_ratio - 1


def k3(x: Terms, log_ratio: torch.Tensor, kl: torch.Tensor) -> torch.Tensor:
    """DeepSeekMath's (Schulman's k3): unbiased in value; its gradient follows KL(pi_ref ||
    pi_theta). Which KL each estimator's gradient follows: docs/guide.md, "The KL term"."""
    return kl


def k3_is(x: Terms, log_ratio: torch.Tensor, kl: torch.Tensor) -> torch.Tensor:
    """k3 times the token ratio pi_theta / pi_old, with its gradient: the gradient of
    KL(pi_theta || pi_ref) (DeepSeek-V3.2; TRL's use_bias_correction_kl)."""
    return x.token_ratio * kl


def k2(x: Terms, log_ratio: torch.Tensor, kl: torch.Tensor) -> torch.Tensor:
    """(log pi_ref / pi_theta)^2 / 2: on-policy its gradient is that of KL(pi_theta || pi_ref)."""
    return 0.5 * log_ratio ** 2


# "k1_reward": the KL is in the rewards (kl_penalized_rewards), the loss only measures it
KL_ESTIMATORS = {"k3": k3, "k3_is": k3_is, "k2": k2, "k1_reward": None}


def entropy_bonus(x: Terms, sizes: Sizes, coef: float) -> torch.Tensor:
    """coef times the mean entropy of the tokens whose policy term counts, subtracted from the loss
    whatever loss_agg (TRL's entropy_coef: a token mean, so that coef means the same under every
    aggregation). With its gradient: completion_logprobs computes each token's."""
    return coef * (x.entropy * x.policy_mask).sum() / sizes.policy_tokens


def policy_tokens(x: Terms) -> dict:
    """The policy_token_frac measure: the completion tokens whose policy term counts
    (top_entropy_quantile's and mask_truncated_completions' policy_mask)."""
    return {"policy_token_frac": summed(x, x.policy_mask)}


def entropy_sum(x: Terms) -> dict:
    """The entropy measure from completion_logprobs' sum."""
    return {"entropy": x.entropy}


def entropy_tokens(x: Terms) -> dict:
    """The entropy measure from each token's (an entropy bonus asked for them)."""
    return {"entropy": summed(x, x.entropy)}

# the aggregation (loss_agg) over the tokens in the loss, with the whole step's normalisers


def seq_mean(token_loss: torch.Tensor, mask: torch.Tensor, sizes: Sizes) -> torch.Tensor:
    """DeepSeekMath eq. 3: each completion's mean over its tokens, averaged over the
    completions: sum_i (sum_t loss_it / |o_i|) / N."""
    per_row = (token_loss * mask).sum(dim=1)  # [b]
    return (per_row / mask.sum(dim=1).clamp(min=1)).sum() / sizes.sequences


def token_mean(token_loss: torch.Tensor, mask: torch.Tensor, sizes: Sizes) -> torch.Tensor:
    """DAPO (arXiv:2503.14476, eq. 8): the mean over the step's tokens, sum_it loss_it / tokens."""
    return (token_loss * mask).sum(dim=1).sum() / sizes.tokens


def constant(token_loss: torch.Tensor, mask: torch.Tensor, sizes: Sizes) -> torch.Tensor:
    """Dr. GRPO (arXiv:2503.20783): sum_it loss_it / (max_new_tokens * N), no length bias."""
    return (token_loss * mask).sum(dim=1).sum() / (sizes.width * sizes.sequences)


LOSS_AGGS = {"seq_mean": seq_mean, "token_mean": token_mean, "constant": constant}


def loss_of(cfg) -> Loss:
    """The Loss cfg's loss keys ask for (a TrainConfig, or any object with them), each part's
    settings bound: built once at set-up (a name no table holds is a ValueError naming its key)."""
    high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    policy = chosen(POLICY_LOSSES, "policy_loss", cfg.policy_loss)
    settings = {clip: dict(low=cfg.clip_eps, high=high), cispo: dict(high=high),  # each term's
                sapo: dict(positive=cfg.sapo_temperature_pos, negative=cfg.sapo_temperature_neg)}
    policy = partial(policy, **settings[policy])
    if cfg.delta is not None:
        policy = partial(two_sided_clip, low=cfg.clip_eps, high=high, delta=cfg.delta)
    weights = []
    if cfg.top_entropy_quantile < 1:
        weights.append(high_entropy_only)
    if cfg.off_policy_mask_threshold is not None:
        weights.append(partial(off_policy_sequences, threshold=cfg.off_policy_mask_threshold))
    correction = correction_mode(cfg)
    if correction is not None:
        mode, low, cap = correction
        ratio_of, bound = chosen(IMPORTANCE_SAMPLING_MODES, "importance_sampling_mode", mode)
        weights.append(partial(sampler_correction, ratio_of=ratio_of, bound=bound,
                               low=0.0 if low is None else low,
                               high=math.inf if cap is None else cap))
    penalties, measures, bonuses = [], [], []
    estimator = chosen(KL_ESTIMATORS, "kl_estimator", cfg.kl_estimator)
    if cfg.beta > 0 and estimator is not None:
        penalties.append(partial(kl_penalty, beta=cfg.beta, estimator=estimator))
    elif cfg.beta > 0:
        measures.append(reference_kl)
    if cfg.entropy_coef > 0:
        bonuses.append(partial(entropy_bonus, coef=cfg.entropy_coef))
    measures.append(entropy_tokens if bonuses else entropy_sum)
    if cfg.top_entropy_quantile < 1 or cfg.mask_truncated_completions:
        measures.append(policy_tokens)
    ratio = chosen(IMPORTANCE_SAMPLING_LEVELS, "importance_sampling_level",
                   cfg.importance_sampling_level)
    aggregate = chosen(LOSS_AGGS, "loss_agg", cfg.loss_agg)
    return Loss("tokens" if bonuses else "sum", ratio, policy, weights, penalties, aggregate,
                bonuses, measures)


def chosen(table, key: str, name: str):
    """table[name], or a ValueError naming the config key and its choices."""
    if name not in table:
        raise ValueError(f"{key} must be one of {tuple(table)}, got {name!r}")
    return table[name]


def correction_mode(cfg) -> tuple | None:
    """The sampler correction cfg asks for, (importance_sampling_mode, clip_min, clip_max), or None:
    tis_cap = C is ("token_truncate", None, C), the name this repo had before TRL's."""
    if cfg.tis_cap is not None:
        return "token_truncate", None, cfg.tis_cap
    if cfg.importance_sampling_correction:
        return (cfg.importance_sampling_mode, cfg.importance_sampling_clip_min,
                cfg.importance_sampling_clip_max)
    return None


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, num_sequences=None, num_tokens=None,
              constant_norm=None, sampler_logp=None, clip_eps=0.2, clip_eps_high=None, beta=0.04,
              kl_estimator="k3", loss_agg="seq_mean", importance_sampling_level="token",
              tis_cap=None, policy_loss="clip", delta=None, sapo_temperature_pos=1.0,
              sapo_temperature_neg=1.05, importance_sampling_correction=False,
              importance_sampling_mode="sequence_mask", importance_sampling_clip_max=3.0,
              importance_sampling_clip_min=None, off_policy_mask_threshold=None,
              top_entropy_quantile=1.0, entropy_coef=0.0, *, entropy=None, loss_mask=None):
    """The loss to minimise (= -J of DeepSeekMath) of one batch (or micro-batch) under these
    settings -> (loss, stats): loss_of's Loss in one call, for a caller outside a run (tests,
    tools/bandit.py, tools/trl_parity.py). The settings after sampler_logp are the config keys of
    the same names, with the same defaults (config.py says what each does).

    logp [B, T]: the sampled tokens' log-probs under the policy, with grad (padding finite: 0).
    old_logp [B, T] or None: under the sampling policy, no grad. None (mu = 1): logp.detach().
    ref_logp [B, T] or None: under the reference model; None only when beta == 0.
    advantages [B] (per sequence) or [B, T] (per token); mask [B, T]: completion tokens.
    sampler_logp [B, T] or None: the sampler's own log-probs, read by the sampler correction
        (tis_cap, importance_sampling_correction) and off_policy_mask_threshold.
    entropy [B, T] or None: each token's entropy under the policy (with grad for entropy_coef),
        read by entropy_coef and top_entropy_quantile (whose quantile is over this call's tokens).
    loss_mask [B, T] or None: the tokens in the loss (default: mask), e.g. without truncated
        completions (mask_truncated_completions).
    num_sequences, num_tokens (of the loss mask), constant_norm default to this call's completions
    in the loss, loss tokens and T; under gradient accumulation pass the WHOLE batch's.
    stats (0-d, detached): sums over this call's tokens / their count (num_tokens when given),
    adding up to the batch's means: ratio_mean and each part's measures (kl, clip fractions, ...).
    """
    if beta > 0 and ref_logp is None:
        raise ValueError(f"beta={beta} needs ref_logp; pass beta=0 to train without a reference")
    if entropy is None and (entropy_coef > 0 or top_entropy_quantile < 1):
        raise ValueError("entropy_coef and top_entropy_quantile read each token's entropy: pass it")
    reading = {"tis_cap": tis_cap is not None,
               "importance_sampling_correction": importance_sampling_correction,
               "off_policy_mask_threshold": off_policy_mask_threshold is not None}
    if sampler_logp is None and any(reading.values()):
        raise ValueError(f"{', '.join(k for k, on in reading.items() if on)} needs sampler_logp, "
                         "the sampler's log-probs of the tokens")
    settings = types.SimpleNamespace(
        clip_eps=clip_eps, clip_eps_high=clip_eps_high, beta=beta, kl_estimator=kl_estimator,
        loss_agg=loss_agg, importance_sampling_level=importance_sampling_level, tis_cap=tis_cap,
        policy_loss=policy_loss, delta=delta, sapo_temperature_pos=sapo_temperature_pos,
        sapo_temperature_neg=sapo_temperature_neg,
        importance_sampling_correction=importance_sampling_correction,
        importance_sampling_mode=importance_sampling_mode,
        importance_sampling_clip_max=importance_sampling_clip_max,
        importance_sampling_clip_min=importance_sampling_clip_min,
        off_policy_mask_threshold=off_policy_mask_threshold,
        top_entropy_quantile=top_entropy_quantile, entropy_coef=entropy_coef,
        mask_truncated_completions=loss_mask is not None)
    loss = loss_of(settings)
    mask = mask.bool()
    loss_mask = mask if loss_mask is None else mask & loss_mask.bool()
    policy_mask = loss_mask
    if top_entropy_quantile < 1:
        floor = entropy_floor(entropy[loss_mask].detach(), top_entropy_quantile)
        policy_mask = loss_mask & (entropy.detach() >= floor)
    if entropy is None:  # nothing to measure it from
        loss.measures.remove(entropy_sum)
    elif loss.entropy == "sum":
        entropy = (entropy.detach() * mask).sum()
    sizes = Sizes(sequences=loss_mask.any(dim=1).sum().clamp(min=1) if num_sequences is None
                  else num_sequences,
                  tokens=loss_mask.sum().clamp(min=1) if num_tokens is None else num_tokens,
                  policy_tokens=policy_mask.sum().clamp(min=1),
                  scored=mask.sum().clamp(min=1) if num_tokens is None else num_tokens,
                  width=logp.shape[1] if constant_norm is None else constant_norm)
    batch = MicroBatch(ids=None, attention_mask=None, mask=mask, prompt_width=0, rows=[],
                       loss_mask=loss_mask, policy_mask=policy_mask, advantages=advantages,
                       old_logp=None if old_logp is None else old_logp.float(),
                       ref_logp=None if ref_logp is None else ref_logp.float(),
                       sampler_logp=None if sampler_logp is None else sampler_logp.float())
    return loss(terms_of(batch, logp.float(), entropy), sizes)


# -----------------------------------------------------------------------------
# the optimizer: AdamW over fp32 master weights, the update every training step ends with (GRPO, the
# warm start, the baselines)


def optimizer_step(model, optimizer, lr: float, grad_clip: float,
                   loss: torch.Tensor | None = None) -> torch.Tensor:
    """The update every training step ends with: clip the global grad norm to grad_clip (0 = no
    clipping), step, zero the grads; returns the norm before clipping. A non-finite norm or loss
    raises FloatingPointError before the update, the weights kept (not_finite says why)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                          grad_clip if grad_clip > 0 else math.inf)
    finite = torch.isfinite(norm) if loss is None else torch.isfinite(norm) & torch.isfinite(loss)
    if not finite:  # one host sync per update: the price of never writing nan weights
        optimizer.zero_grad(set_to_none=True)
        raise FloatingPointError(not_finite(norm, loss))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def not_finite(norm: torch.Tensor, loss: torch.Tensor | None) -> str:
    """What a non-finite gradient norm or loss says: which, and what likely made it."""
    if loss is not None and not torch.isfinite(loss):
        return (f"the loss is {loss.item()} (gradient norm {norm.item()}): a term of it is not "
                "finite: an advantage (a reward function's nan or inf), a log-prob of -inf (the "
                "trainer finds a sampled token impossible: a sampler with top_p or top_k, bf16 "
                "logits) or a term that overflowed (lower lr, or grad_clip)")
    if loss is not None:
        return (f"gradient norm is {norm.item()} while the loss is finite ({loss.item():.4g}), so "
                "the backward pass made it: weights grown too large can (lower lr or grad_clip), "
                "and so can the attention backend or bf16 on CUDA (try dtype='float32')")
    return f"gradient norm is {norm.item()}: lower lr or grad_clip"


def configure_optimizer(model, lr: float, weight_decay: float = 0.0,
                        betas=(0.9, 0.99)) -> torch.optim.AdamW:
    """AdamW over model's trainable parameters; weight decay on matrices only (not norms, biases).
    Keep the parameters fp32: plain bf16 AdamW rounds an update of lr 1e-6 away."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=params[0].is_cuda)


def optimizer_updates(optimizer) -> int:
    """How many updates the optimizer has taken (AdamW's step count; 0 before the first)."""
    return next((int(state["step"]) for state in optimizer.state.values() if "step" in state), 0)


# -----------------------------------------------------------------------------
# the settings, checked once when the config loads (config.validate)


def check_settings(cfg):
    """A ValueError naming the knob unless cfg's loss settings (loss_of's keys) and advantage
    settings (adv_baseline, scale_rewards / adv_scale with group_size, k1_reward's needs) are ones
    grpo.py computes; run once, when the config loads."""
    high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    for key, table in (("loss_agg", LOSS_AGGS), ("kl_estimator", KL_ESTIMATORS),
                       ("importance_sampling_level", IMPORTANCE_SAMPLING_LEVELS),
                       ("policy_loss", POLICY_LOSSES),
                       ("importance_sampling_mode", IMPORTANCE_SAMPLING_MODES),
                       ("scale_rewards", dict.fromkeys(("group", "batch", "none"))),
                       ("adv_scale", dict.fromkeys(("std", "none")))):
        chosen(table, key, getattr(cfg, key))
    if not (0 <= cfg.clip_eps < 1 and high >= 0):
        raise ValueError(f"need 0 <= clip_eps < 1 and clip_eps_high >= 0, got {cfg.clip_eps}, "
                         f"{high}")
    if not cfg.beta >= 0:
        raise ValueError(f"beta must be >= 0, got {cfg.beta}")
    two_sided = cfg.policy_loss == "clip" and 1 + high < (cfg.delta or math.inf) < math.inf
    if cfg.delta is not None and not two_sided:
        raise ValueError(f"delta caps PPO's ratio above the clip: it needs policy_loss='clip' and "
                         f"a number above 1 + clip_eps_high = {1 + high}, got {cfg.delta} with "
                         f"policy_loss={cfg.policy_loss!r}")
    if not (0 < cfg.sapo_temperature_pos < math.inf and 0 < cfg.sapo_temperature_neg < math.inf):
        raise ValueError("sapo_temperature_pos and sapo_temperature_neg must be finite numbers "
                         f"> 0, got {cfg.sapo_temperature_pos}, {cfg.sapo_temperature_neg}")
    if cfg.tis_cap is not None and not 1 <= cfg.tis_cap < math.inf:
        raise ValueError("tis_cap must be None (off) or a number >= 1 (a cap below 1 would shrink "
                         f"every on-policy token's weight), got {cfg.tis_cap}")
    if cfg.tis_cap is not None and cfg.importance_sampling_correction:
        raise ValueError("tis_cap=C is importance_sampling_correction=True with "
                         "importance_sampling_mode='token_truncate' and "
                         "importance_sampling_clip_max=C: set one or the other")
    low, cap = cfg.importance_sampling_clip_min, cfg.importance_sampling_clip_max
    if cfg.importance_sampling_correction and not ((cap is None or 1 <= cap < math.inf)
                                                   and (low is None or 0 <= low <= 1)
                                                   and (low, cap) != (None, None)):
        raise ValueError("importance_sampling_correction bounds the ratio pi_old / pi_sampler, 1 "
                         "on-policy: it needs importance_sampling_clip_max None or a number >= 1, "
                         "importance_sampling_clip_min None or in [0, 1], not both None; got "
                         f"{cap}, {low}")
    threshold = cfg.off_policy_mask_threshold
    if threshold is not None and not 0 <= threshold < math.inf:
        raise ValueError("off_policy_mask_threshold must be None (off) or a finite number >= 0 (a "
                         f"mean log-ratio), got {threshold}")
    if not 0 <= cfg.top_entropy_quantile <= 1:
        raise ValueError(f"top_entropy_quantile must lie in [0, 1], got {cfg.top_entropy_quantile}")
    if not 0 <= cfg.entropy_coef < math.inf:
        raise ValueError(f"entropy_coef must be a finite number >= 0, got {cfg.entropy_coef}")
    if cfg.adv_scale == "none" and cfg.scale_rewards == "batch":
        raise ValueError("adv_scale='none' (no std) and scale_rewards='batch' (the batch's std) "
                         "disagree; adv_scale is scale_rewards' older name: set scale_rewards "
                         "alone")
    if cfg.method == "ppo":
        check_ppo_settings(cfg)
    else:
        check_group_settings(cfg)
    switched = [key for key, off in SWITCHES_OFF.items() if getattr(cfg, key) != off]
    if cfg.method not in ("grpo", "ppo") and switched:
        raise ValueError(f"{', '.join(switched)} shape GRPO's loss; method={cfg.method!r} trains "
                         "without it")


def check_group_settings(cfg):
    """GRPO's advantage settings: a baseline and scale group_advantages computes for this group
    size, k1_reward's needs (the penalty lives in the outcome advantages), none of PPO's keys."""
    check_advantage_settings(cfg.adv_baseline, reward_scale(cfg), cfg.group_size)
    if cfg.kl_estimator == "k1_reward" and cfg.beta > 0:
        if cfg.supervision == "process":
            raise ValueError("kl_estimator='k1_reward' puts the KL in the outcome rewards, which "
                             "supervision='process' does not use: the run would have no KL "
                             "penalty; use 'both', or k3_is in the loss")
        if reward_scale(cfg) != "none":
            raise ValueError("kl_estimator='k1_reward' with adv_scale='std': in a group whose "
                             "rewards are all equal (all right or all wrong) the std scaling "
                             "divides beta back out and the KL alone gets unit-sized advantages; "
                             "set scale_rewards='none' (Dr. GRPO), or keep a std with a "
                             "loss-side estimator (k3_is)")
    changed = [key for key, default in PPO_DEFAULTS.items() if getattr(cfg, key) != default]
    if changed:
        raise ValueError(f"{', '.join(changed)}: PPO's (method='ppo'); method={cfg.method!r} has "
                         "no critic")


def check_ppo_settings(cfg):
    """PPO's settings: GAE's gamma and lam in [0, 1], a positive value clip and critic learning
    rate, outcome rewards, no LoRA (the critic copies the whole policy), and none of GRPO's
    advantage settings, which GAE replaces (one process: config.validate)."""
    if not (0 <= cfg.gamma <= 1 and 0 <= cfg.lam <= 1):
        raise ValueError(f"gamma and lam must lie in [0, 1], got {cfg.gamma}, {cfg.lam}")
    if not 0 < cfg.cliprange_value < math.inf:
        raise ValueError(f"cliprange_value must be a finite number > 0, got {cfg.cliprange_value}")
    if cfg.critic_lr is not None and not 0 < cfg.critic_lr < math.inf:
        raise ValueError(f"critic_lr must be None (lr) or a finite number > 0, got {cfg.critic_lr}")
    grouped = {key: getattr(cfg, key) for key, default in GROUP_DEFAULTS.items()
               if getattr(cfg, key) != default}
    if grouped:
        raise ValueError(f"{grouped} shape GRPO's group advantages; method='ppo' computes GAE on "
                         "its critic's values instead")
    if cfg.supervision != "outcome" or cfg.lora_rank or cfg.dynamic_sampling:
        raise ValueError("method='ppo' needs supervision='outcome', no LoRA (its critic is a whole "
                         "copy of the policy) and no dynamic_sampling; got "
                         f"{cfg.supervision!r}, lora_rank={cfg.lora_rank}, "
                         f"dynamic_sampling={cfg.dynamic_sampling}")


# GRPO's advantage keys, and PPO's, with their defaults: what the other method must leave alone
GROUP_DEFAULTS = {"adv_baseline": "mean", "scale_rewards": "group", "adv_scale": "std"}
PPO_DEFAULTS = {"gamma": 1.0, "lam": 1.0, "cliprange_value": 0.5, "critic_lr": None}
# the loss's switches, each off: what only method="grpo" and "ppo" read
SWITCHES_OFF = {"policy_loss": "clip", "delta": None, "importance_sampling_correction": False,
                "tis_cap": None, "off_policy_mask_threshold": None, "top_entropy_quantile": 1.0,
                "entropy_coef": 0.0, "mask_truncated_completions": False}


def check_advantage_settings(baseline: str, scale: str, group_size: int):
    """A ValueError unless group_advantages computes advantages with this baseline and scale in
    groups of this size."""
    if baseline not in BASELINES or scale not in SCALES:
        raise ValueError(f"baseline must be one of {BASELINES} and scale one of {SCALES}, got "
                         f"{baseline!r}, {scale!r}")
    if baseline == "none" and scale != "none":
        raise ValueError(f"scale={scale!r} needs a baseline: a raw reward divided by a zero std "
                         "explodes")
    if baseline != "none" and group_size < 2:
        raise ValueError(f"baseline {baseline!r} needs group_size >= 2, got {group_size}")
