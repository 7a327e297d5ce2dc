"""
GRPO's objective (DeepSeekMath, arXiv:2402.03300): the advantages and the loss, with their
variants. Each setting is declared once (settings.py), in the dataclass beside the part that reads
it; config.TrainConfig inherits them. In the order a step reads them (train.grpo_step):

    advantages, stats = advantages_of(samples, batches, cfg)  # per completion, or per token
    loss = loss_of(cfg)  # once, at set-up: one part of each table, its settings bound
    value, measures = loss(terms_of(batch, logp, entropy), sizes)  # each micro-batch (update.py)
    logged = loss.after_step()  # after each optimizer step: parts that keep state update it

The maths are pure functions: group_advantages (GRPO, Dr. GRPO arXiv:2503.20783, RLOO's
leave-one-out mean G/(G-1) (r - mean), REINFORCE; the group's unbiased std + eps, or the batch's;
with a baseline a group of equal rewards gets exactly 0), normalize_then_sum (GDPO),
process_advantages (per-step rewards), kl_penalized_rewards (the KL in the reward), GAE and the
value loss of PPO's critic, and the loss's parts, one table per kind
(IMPORTANCE_SAMPLING_LEVELS, POLICY_LOSSES, the masks, IMPORTANCE_SAMPLING_MODES, KL_ESTIMATORS,
the entropy bonus, LOSS_AGGS), each a short function with its paper; grpo_loss computes any of them
in one call. update.py runs them over a step's micro-batches with whole-batch normalisers. Which KL
each estimator's gradient follows is said once, in docs/guide.md ("The KL term"). The settings are
checked once, when the config loads (their rules; check_settings for what spans several), and
trusted here.
"""
import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from functools import partial

import torch

from distributed import from_every_rank, over_ranks, rank, world_size
from settings import (AT_LEAST_0, AT_LEAST_1, POSITIVE, PROBABILITY, Rule, changed, check,
                      defaults, one_of, optional, setting, within)

BASELINES = ("mean", "rloo", "none")
SCALES = ("std", "batch", "none")
MULTI_OBJECTIVE = ("sum_then_normalize", "normalize_then_sum")
# exp(20) ~ 5e8 is finite in fp32; one outlier token cannot overflow the k3 term
KL_LOG_RATIO_CLAMP = 20.0

# -----------------------------------------------------------------------------
# advantages: how much better each completion did than its group


@dataclass
class AdvantageSettings:
    """GRPO's group advantages (method="ppo" leaves them at their defaults: GAE replaces them)."""
    adv_baseline: str = setting("mean", "the group baseline: mean (GRPO), rloo, none (REINFORCE)",
                                one_of(BASELINES))
    scale_rewards: str = setting(
        "group", "the std the advantages are divided by: the group's (GRPO), the batch's "
        "(PPO-Lite, arXiv:2508.08221) or none (Dr. GRPO)", one_of(("group", "batch", "none")))
    adv_scale: str = setting(
        "std", "the older name of the scale above: std (the scale above says which), none (no std)",
        one_of(("std", "none")), needs=Rule(lambda v, s: v == "std" or s.scale_rewards != "batch",
                                            "no batch std: it is the scale's older name, set that "
                                            "one alone"))
    multi_objective_aggregation: str = setting(
        "sum_then_normalize", "the rewards' weighted sum, then group advantages; or each reward "
        "normalised in its group, then summed and normalised over the batch (GDPO, "
        "arXiv:2601.05242)", one_of(MULTI_OBJECTIVE), needs=Rule(
            lambda v, s: v == MULTI_OBJECTIVE[0] or gdpo_fits(s),
            "GRPO's baseline and group std, outcome supervision and no shaping of the total "
            "(random_reward, overlong_buffer_len, k1_reward) when it normalises each reward "
            "alone (GDPO)"))


def advantages_of(samples, batches, cfg) -> tuple[torch.Tensor, dict]:
    """A step's advantages [B] (or [B, T]: process_supervised) and their stats."""
    rewards = torch.tensor(samples.rewards)
    if cfg.kl_estimator == "k1_reward" and cfg.beta > 0:
        log_ratio = sequence_sums(batches, lambda batch: batch.sampler_logp - batch.ref_logp,
                                  len(rewards))
        rewards = kl_penalized_rewards(rewards, log_ratio, cfg.beta)
    stats = {}
    if cfg.multi_objective_aggregation == "normalize_then_sum":
        components = {name: torch.cat(from_every_rank(torch.tensor(samples.components[name])))
                      for name in cfg.reward_weights}
        advantages, normalised = normalize_then_sum(components, cfg.reward_weights, cfg.group_size)
        for name, values in normalised.items():
            stats[f"adv_abs_mean_{name}"] = values.abs().mean().item()
    else:
        every = torch.cat(from_every_rank(rewards))  # every rank's: scale "batch" reads all
        advantages = group_advantages(every, cfg.group_size, baseline=cfg.adv_baseline,
                                      scale=reward_scale(cfg))
    advantages = advantages.view(world_size(), -1)[rank()]  # this rank's rows
    if cfg.supervision != "outcome":
        advantages = process_supervised(advantages, samples, cfg)
    stats.update(advantage_stats(advantages, samples.lengths))
    return advantages, stats


def gdpo_fits(cfg) -> bool:
    """Whether GDPO's advantages fit cfg: GRPO's baseline and scale, outcome supervision, no shaping
    of the total reward (a shaping term is no reward function of its own)."""
    shaped = cfg.random_reward or cfg.overlong_buffer_len or cfg.kl_estimator == "k1_reward"
    return (cfg.adv_baseline, reward_scale(cfg), cfg.supervision) == ("mean", "std", "outcome") \
        and not shaped


def normalize_then_sum(components: dict, weights: dict, group_size: int, eps=1e-6):
    """GDPO (arXiv:2601.05242; TRL's "normalize_then_sum"): each reward components[name] [B]
    normalised within its group (group_advantages: mean baseline, group std), summed by
    weights[name], the sum then normalised over the batch, (s - mean) / (std + eps), so that a
    reward with a small spread is not drowned by one with a large spread. -> advantages [B],
    {name: its normalised reward [B]}."""
    normalised = {name: group_advantages(values, group_size, eps=eps)
                  for name, values in components.items()}
    total = sum(weights[name] * values for name, values in normalised.items())  # [B]
    return (total - total.mean()) / (total.std() + eps), normalised


def process_supervised(advantages, samples, cfg) -> torch.Tensor:
    """Per token [B, T]: process_advantages of the arithmetic claims (supervision="process"), or
    the outcome advantages [B] plus process_weight times them ("both")."""
    rewards, ends, mask = claim_tensors(samples.claims)
    process = process_advantages(rewards, ends, cfg.group_size, max(samples.lengths), mask)
    if cfg.supervision == "process":
        return process
    return advantages[:, None] + cfg.process_weight * process  # "both"


def reward_scale(cfg) -> str:
    """group_advantages' scale for cfg ("group" is its "std"; the older name's "none" wins)."""
    scale = "none" if cfg.adv_scale == "none" else cfg.scale_rewards
    return "std" if scale == "group" else scale


def sequence_sums(batches, values, n: int) -> torch.Tensor:
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
    """rewards [B] -> advantages [B] fp32, groups of group_size rows. baseline: "mean" (GRPO),
    "rloo", "none" (REINFORCE); scale: "std", "batch" (arXiv:2508.08221), "none" (Dr. GRPO)."""
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
    return rewards.float().view(-1, group_size)


def advantage_stats(advantages: torch.Tensor, lengths: list[int]) -> dict:
    """The advantages' mean |A|, std and share of zeros (over the completion tokens)."""
    if advantages.dim() == 2:
        advantages = advantages[torch.arange(advantages.shape[1]) < torch.tensor(lengths)[:, None]]
    return {"adv_abs_mean": advantages.abs().mean().item(),
            "adv_std": advantages.std().item() if advantages.numel() > 1 else 0.0,
            "adv_zero_frac": (advantages == 0).float().mean().item()}


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

# -----------------------------------------------------------------------------
# PPO's critic (method="ppo"): GAE on its values instead of the group baseline, and its clipped
# value loss; update.py runs them (gae_advantages, critic_update)


@dataclass
class CriticSettings:
    """PPO's (verl's names): a critic of the policy's shape, from its weights, a value head at zero;
    the KL to the reference in the loss (k3, k3_is, k2) or per token in the rewards (k1_reward,
    PPO-RLHF's); group_size 1 is classic PPO. GRPO leaves them at their defaults."""
    gamma: float = setting(1.0, "GAE's discount (verl's default)", PROBABILITY)
    lam: float = setting(1.0, "GAE's lambda (verl's default)", PROBABILITY)
    cliprange_value: float = setting(0.5, "the value loss's clip around the critic's old values",
                                     POSITIVE)
    critic_lr: float | None = setting(None, "the critic's own AdamW learning rate; None: 10 x lr, "
                                      "as verl's defaults (1e-5 to the actor's 1e-6)",
                                      optional(POSITIVE))


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


def value_loss(values, old_values, returns, mask, num_tokens, cliprange: float):
    """PPO's clipped value loss (verl's compute_value_loss, token-mean): 0.5 sum_t max((V - R)^2,
    (clip(V, V_old - c, V_old + c) - R)^2) / num_tokens, over mask [b, N]; and the share of tokens
    whose clipped term is the larger (value_clip_frac), as this micro-batch's part of the step's."""
    clipped = torch.max(torch.min(values, old_values + cliprange), old_values - cliprange)
    unclipped_loss = (values - returns) ** 2
    clipped_loss = (clipped - returns) ** 2
    loss = 0.5 * (torch.max(unclipped_loss, clipped_loss) * mask).sum() / num_tokens
    return loss, ((clipped_loss > unclipped_loss) * mask).sum().detach() / num_tokens


# -----------------------------------------------------------------------------
# the loss: built once from its settings (loss_of) out of named parts, one table per kind; each part
# is a short function of a micro-batch's Terms, its settings bound when the loss is built, and the
# step runs only the parts chosen. A part that measures returns sums over the completion tokens
# (summed), logged as their means. A new variant: a function and its entry in a table, its settings
# declared in LossSettings (after the tables, whose names its rules read) and bound in loss_of. A
# part that keeps state from one optimizer step to the next is an object with after_step,
# state_dict and load_state_dict (AdaptiveEntropy); the checkpoint keeps its state.


@dataclass
class Sizes:
    """A step's counts over every micro-batch and rank (0-d tensors, each at least 1): the loss's
    normalisers, fixed before the micro-batch loop, and the measures' denominator."""
    sequences: torch.Tensor  # completions with a token in the loss
    tokens: torch.Tensor  # tokens in the loss (loss_mask)
    policy_tokens: torch.Tensor  # tokens whose policy term counts (policy_mask)
    scored: torch.Tensor  # completion tokens (mask), over which the measures average
    width: int  # max_new_tokens: Dr. GRPO's constant


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


def terms_of(batch, logp: torch.Tensor, entropy: torch.Tensor | None) -> Terms:
    """A micro-batch's Terms, from its completion tokens' log-probs logp [b, N] (with grad)."""
    old_logp = logp.detach() if batch.old_logp is None else batch.old_logp
    log_ratio = logp - old_logp  # [b, N]
    advantages = batch.advantages.float()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # [b, 1]
    return Terms(logp, old_logp, log_ratio, torch.exp(log_ratio), advantages, batch.mask.float(),
                 batch.loss_mask.float(), batch.policy_mask, batch.ref_logp, batch.sampler_logp,
                 entropy)


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
    entropy_quantile: float = 1.0  # < 1: the step marks its high-entropy tokens first
    drops_truncated: bool = False  # the step leaves truncated completions out of the loss
    stateful: list = dataclasses.field(default_factory=list)  # parts with state across steps

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

    def after_step(self) -> dict:
        """After each optimizer step: the stateful parts update -> what they log."""
        return {key: value for part in self.stateful for key, value in part.after_step().items()}

    def state_dict(self) -> dict:
        """The stateful parts' state, by class name: the checkpoint keeps it."""
        return {type(part).__name__: part.state_dict() for part in self.stateful}

    def load_state_dict(self, state: dict):
        for part in self.stateful:
            part.load_state_dict(state[type(part).__name__])


# the ratio (IMPORTANCE_SAMPLING_LEVELS), [b, N] with grad


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

# the policy term: per-token loss [b, N] and measures


def clip(x: Terms, low: float, high: float) -> tuple[torch.Tensor, dict]:
    """PPO's clipped surrogate (DeepSeekMath eq. 3; DAPO's clip-higher, arXiv:2503.14476)."""
    clipped = x.ratio.clamp(1 - low, 1 + high)
    token_loss = -torch.minimum(x.ratio * x.advantages, clipped * x.advantages)
    return token_loss, {"clip_frac_low": summed(x, (x.advantages < 0) & (x.ratio < 1 - low)),
                        "clip_frac_high": summed(x, (x.advantages > 0) & (x.ratio > 1 + high))}


def summed(x: Terms, value: torch.Tensor) -> torch.Tensor:
    """A measure: value's sum over the completion tokens (0-d, no grad)."""
    return (value.detach().float() * x.scored).sum()


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


def vespo(x: Terms, k_pos: float, lambda_pos: float, k_neg: float,
          lambda_neg: float) -> tuple[torch.Tensor, dict]:
    """VESPO (arXiv:2602.10693): no clip; each completion's tokens weigh A log pi_theta by
    phi(w) = e^lam w^k e^(-lam w) (1 at w = 1, no grad), a Gamma-shaped weight of its sequence
    ratio w = prod_t pi_theta / pi_old that fades both ways off-policy; k and lam by the sign of A
    (k_pos, lambda_pos where A >= 0). As TRL's: each token's log-ratio clamped to +-20, log w to
    [log 1e-8, 20]. Measures vespo_phi_mean."""
    log_w = (x.log_ratio.clamp(-20, 20) * x.scored).sum(dim=1, keepdim=True)  # [b, 1]
    log_w = log_w.clamp(math.log(1e-8), 20).detach()
    positive = x.advantages >= 0  # [b, 1] or [b, N]
    k = torch.where(positive, k_pos, k_neg)
    lam = torch.where(positive, lambda_pos, lambda_neg).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * log_w.exp()).nan_to_num(0.0, 0.0, 0.0)
    return -phi * x.advantages * x.logp, {"vespo_phi_mean": summed(x, phi.expand_as(x.logp))}


POLICY_LOSSES = {"clip": clip, "cispo": cispo, "sapo": sapo, "vespo": vespo}

# the policy term's weights, no grad: masks (which tokens carry the policy gradient; the KL still
# applies to them) and the sampler correction


def high_entropy_only(x: Terms) -> tuple[torch.Tensor, dict]:
    """The top-entropy mask (arXiv:2506.01939): only the step's highest-entropy tokens carry the
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
    return ratio.clamp(low, high)


def masked(ratio: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Masked importance sampling: the ratio, or 0 (dropped) outside [low, high]."""
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


IMPORTANCE_SAMPLING_MODES = {"token_truncate": (token_sampler_ratio, truncated),
                             "token_mask": (token_sampler_ratio, masked),
                             "sequence_truncate": (sequence_sampler_ratio, truncated),
                             "sequence_mask": (sequence_sampler_ratio, masked)}


def sampler_correction(x: Terms, ratio_of, bound, low: float, high: float):
    """The policy term weighed by pi_old / pi_sampler bounded to [low, high]: the sampler's numerics
    against the trainer's (Yao et al. 2025)."""
    ratio = ratio_of(x)  # [b, N] or [b, 1]
    weight = bound(ratio, low, high)
    return weight, {"tis_capped_frac": summed(x, (ratio < low) | (ratio > high)),
                    "tis_weight_mean": summed(x, weight)}

# the penalties: per-token terms [b, N] added to the policy term's, and what only measures


def kl_penalty(x: Terms, beta: float, estimator) -> tuple[torch.Tensor, dict]:
    """beta times estimator's per-token KL(pi_theta || pi_ref) (DeepSeekMath eq. 4); logs k3."""
    log_ratio, kl = reference_log_ratio(x)
    return beta * estimator(x, log_ratio, kl), {"kl": summed(x, kl)}


def reference_kl(x: Terms) -> dict:
    """The kl measure alone (kl_estimator="k1_reward": the KL is in the rewards)."""
    return {"kl": summed(x, reference_log_ratio(x)[1])}


def reference_log_ratio(x: Terms) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi_ref / pi_theta [b, N] clamped to +-20 (no fp32 overflow), and k3 = e^it - it - 1."""
    log_ratio = (x.ref_logp - x.logp).clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    return log_ratio, torch.exp(log_ratio) - log_ratio - 1


def k3(x: Terms, log_ratio: torch.Tensor, kl: torch.Tensor) -> torch.Tensor:
    """DeepSeekMath's (Schulman's k3); its gradient: docs/guide.md, "The KL term"."""
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


# the aggregation (LOSS_AGGS) over the tokens in the loss, with the whole step's normalisers


def seq_mean(token_loss: torch.Tensor, mask: torch.Tensor, sizes: Sizes) -> torch.Tensor:
    """DeepSeekMath eq. 3: sum_i (sum_t loss_it / |o_i|) / N."""
    per_row = (token_loss * mask).sum(dim=1)  # [b]
    return (per_row / mask.sum(dim=1).clamp(min=1)).sum() / sizes.sequences


def token_mean(token_loss: torch.Tensor, mask: torch.Tensor, sizes: Sizes) -> torch.Tensor:
    """DAPO (arXiv:2503.14476, eq. 8): the mean over the step's tokens, sum_it loss_it / tokens."""
    return (token_loss * mask).sum(dim=1).sum() / sizes.tokens


def constant(token_loss: torch.Tensor, mask: torch.Tensor, sizes: Sizes) -> torch.Tensor:
    """Dr. GRPO (arXiv:2503.20783): sum_it loss_it / (max_new_tokens * N), no length bias."""
    return (token_loss * mask).sum(dim=1).sum() / (sizes.width * sizes.sequences)


def luspo(token_loss: torch.Tensor, mask: torch.Tensor, sizes: Sizes) -> torch.Tensor:
    """LUSPO (arXiv:2602.05261): each completion's summed loss (GSPO's mean times its length, so
    that long completions are not weighed down), averaged over the completions:
    sum_i sum_t loss_it / N."""
    return (token_loss * mask).sum(dim=1).sum() / sizes.sequences


LOSS_AGGS = {"seq_mean": seq_mean, "token_mean": token_mean, "constant": constant,
             "luspo": luspo}

# the bonuses (the entropy), subtracted from the aggregated loss, and what only measures


def entropy_bonus(x: Terms, sizes: Sizes, coef: float) -> torch.Tensor:
    """coef times the mean entropy of the tokens whose policy term counts, subtracted from the loss
    whatever the aggregation (TRL's: a token mean, so that coef means the same under every
    aggregation). With its gradient: completion_logprobs computes each token's."""
    return coef * (x.entropy * x.policy_mask).sum() / sizes.policy_tokens


class AdaptiveEntropy:
    """The entropy bonus with a coefficient that keeps state (Skywork-OR1, arXiv:2505.22312, as
    TRL's use_adaptive_entropy): the loss less coef times the mean entropy of the tokens whose
    policy term counts, applied only while the last optimizer step's entropy was at most target
    (none before the first); after each optimizer step (after_step) coef climbs by delta if that
    step's entropy was at most target, else falls by delta, within [low, high]."""

    def __init__(self, coef: float, low: float, high: float, delta: float, target: float):
        self.coef, self.low, self.high, self.delta, self.target = coef, low, high, delta, target
        self.last_entropy = math.inf  # the previous optimizer step's, every rank's
        self.sums = torch.zeros(2)  # this optimizer step's entropy sum and token count so far

    def __call__(self, x: Terms, sizes: Sizes) -> torch.Tensor:
        on = x.policy_mask
        self.sums = self.sums.to(x.logp.device) + torch.stack([
            (x.entropy.detach() * on).sum(), on.sum().float()])
        coef = self.coef if self.last_entropy <= self.target else 0.0
        return coef * (x.entropy * on).sum() / sizes.policy_tokens

    def after_step(self) -> dict:
        """The step's entropy (every rank's) moves the coefficient; -> the coefficient, to log."""
        total, count = over_ranks(self.sums).tolist()
        self.last_entropy = total / max(count, 1.0)
        step = self.delta if self.last_entropy <= self.target else -self.delta
        self.coef = min(max(self.coef + step, self.low), self.high)
        self.sums = torch.zeros(2)
        return {"entropy_coef": self.coef}

    def state_dict(self) -> dict:
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict):
        self.coef, self.last_entropy = state["coef"], state["last_entropy"]


def policy_tokens(x: Terms) -> dict:
    """The policy_token_frac measure: the completion tokens whose policy term counts
    (the top-entropy mask's and the truncation mask's policy_mask)."""
    return {"policy_token_frac": summed(x, x.policy_mask)}


def entropy_sum(x: Terms) -> dict:
    return {"entropy": x.entropy}


def entropy_tokens(x: Terms) -> dict:
    """The entropy measure from each token's (an entropy bonus asked for them)."""
    return {"entropy": summed(x, x.entropy)}

# the loss's settings, each declared once (settings.setting), their choices read from the tables
# above; loss_of binds them to the parts


@dataclass
class LossSettings:
    """The loss's settings, named as TRL's GRPOConfig names them where it has them (its
    vllm_importance_sampling_* without the prefix; its loss_type is two settings here, the policy
    term and the aggregation), each switch off by default. What a setting needs of the others is
    in its declaration (needs), checked with its rule."""
    clip_eps: float = setting(0.2, "the ratio is clipped to [1 - clip_eps, 1 + clip_eps_high] "
                              "(PPO's, DeepSeekMath's 0.2)", within(0, 1))
    clip_eps_high: float | None = setting(None, "None: clip_eps; larger for DAPO's clip-higher "
                                          "(0.28)", optional(AT_LEAST_0))
    delta: float | None = setting(
        None, "INTELLECT-2's cap of the ratio above the clip, which bounds a negative advantage's "
        "term", optional(AT_LEAST_1), switch=True, needs=Rule(
            lambda v, s: v is None or (s.policy_loss == "clip" and v > 1 + clip_high(s)),
            "PPO's clip as the policy term, and a number above 1 + clip_eps_high"))
    policy_loss: str = setting(
        "clip", "the policy term (POLICY_LOSSES): clip (PPO's, GRPO's), cispo (MiniMax-M1), sapo "
        "(a soft gate), vespo (a Gamma-shaped sequence weight)",
        one_of(POLICY_LOSSES), switch=True,
        needs=Rule(lambda v, s: v != "vespo" or (s.importance_sampling_level == "token"
                                                 and correction_mode(s) is None),
                   "the token level and no sampler correction when it is 'vespo' (VESPO weighs "
                   "each completion by its own sequence ratio; TRL folds a token-level "
                   "correction into that weight, this repo does not)"))
    sapo_temperature_pos: float = setting(1.0, "SAPO's tau where the advantage is > 0", POSITIVE)
    sapo_temperature_neg: float = setting(1.05, "SAPO's tau where the advantage is <= 0", POSITIVE)
    vespo_k_pos: float = setting(2.0, "VESPO's power k where the advantage is >= 0", AT_LEAST_0)
    vespo_lambda_pos: float = setting(3.0, "VESPO's decay lambda where the advantage is >= 0",
                                      AT_LEAST_0)
    vespo_k_neg: float = setting(3.0, "VESPO's power k where the advantage is < 0", AT_LEAST_0)
    vespo_lambda_neg: float = setting(2.0, "VESPO's decay lambda where the advantage is < 0",
                                      AT_LEAST_0)
    beta: float = setting(0.04, "the KL weight; 0: no reference model at all", AT_LEAST_0)
    kl_estimator: str = setting("k3", "KL_ESTIMATORS: k3 (DeepSeekMath's), k3_is, k2, or "
                                "k1_reward (in the rewards)", one_of(KL_ESTIMATORS))
    loss_agg: str = setting("seq_mean", "LOSS_AGGS: seq_mean (GRPO), token_mean (DAPO), constant "
                            "(Dr. GRPO, / max_new_tokens), luspo (each completion's sum)",
                            one_of(LOSS_AGGS))
    importance_sampling_level: str = setting(
        "token", "token (a ratio per token) or sequence (GSPO, arXiv:2507.18071: the geometric "
        "mean of its tokens'; it clips far tighter: clip_eps 3e-4, clip_eps_high 4e-4)",
        one_of(IMPORTANCE_SAMPLING_LEVELS))
    importance_sampling_correction: bool = setting(
        False, "the sampler correction (Yao et al. 2025): each token's policy term weighed by "
        "pi_old / pi_sampler, bounded, no grad (TRL's is on by default)", switch=True)
    importance_sampling_mode: str = setting(
        "sequence_mask", "the correction's ratio and bound: token_truncate, token_mask, "
        "sequence_truncate or sequence_mask (one ratio per completion)",
        one_of(IMPORTANCE_SAMPLING_MODES))
    importance_sampling_clip_max: float | None = setting(
        3.0, "the correction's upper bound", optional(AT_LEAST_1), needs=Rule(
            lambda v, s: v is not None or s.importance_sampling_clip_min is not None,
            "a number, or a lower bound: the correction bounds the ratio on one side at least"))
    importance_sampling_clip_min: float | None = setting(None, "the correction's lower bound",
                                                         optional(PROBABILITY))
    tis_cap: float | None = setting(
        None, "C: the correction, token_truncate at C (this repo's name before TRL's)",
        optional(AT_LEAST_1), switch=True, needs=Rule(
            lambda v, s: v is None or not s.importance_sampling_correction,
            "the correction's own switch off: it is that switch, token_truncate at C; set one"))
    off_policy_mask_threshold: float | None = setting(
        None, "DeepSeek-V3.2: a completion with A < 0 whose mean log(pi_sampler / pi_theta) "
        "passes this leaves the policy term (0.5, say)", optional(AT_LEAST_0), switch=True)
    top_entropy_quantile: float = setting(
        1.0, "only this top share of the step's tokens by entropy carries the policy gradient "
        "(arXiv:2506.01939: 0.2)", PROBABILITY, switch=True)
    entropy_coef: float = setting(
        0.0, "an entropy bonus: the loss less this times the tokens' mean entropy (TRL's); "
        "adaptive: its start", AT_LEAST_0, switch=True)
    use_adaptive_entropy: bool = setting(
        False, "Skywork-OR1 (arXiv:2505.22312): after each optimizer step the coefficient "
        "climbs by entropy_coef_delta while the entropy is at most entropy_target, else falls; "
        "applied only then", switch=True)
    entropy_coef_min: float = setting(0.0, "the adaptive coefficient's floor", AT_LEAST_0)
    entropy_coef_max: float = setting(1.0, "the adaptive coefficient's ceiling", AT_LEAST_0,
                                      needs=Rule(lambda v, s: v >= s.entropy_coef_min,
                                                 "a number at least the floor"))
    entropy_coef_delta: float = setting(0.005, "the adaptive coefficient's step", AT_LEAST_0)
    entropy_target: float = setting(0.2, "the mean token entropy (nats) the adaptive coefficient "
                                    "holds the policy at or above", AT_LEAST_0)
    mask_truncated_completions: bool = setting(
        False, "DAPO: completions cut at max_new_tokens leave the loss (not their group's "
        "advantages)", switch=True)


def loss_of(cfg) -> Loss:
    """The Loss cfg's loss settings ask for (a TrainConfig, a LossSettings, or any object with
    them), each part's settings bound: built once at set-up."""
    high = clip_high(cfg)
    settings = {  # each policy term's
        clip: dict(low=cfg.clip_eps, high=high), cispo: dict(high=high),
        sapo: dict(positive=cfg.sapo_temperature_pos, negative=cfg.sapo_temperature_neg),
        vespo: dict(k_pos=cfg.vespo_k_pos, lambda_pos=cfg.vespo_lambda_pos, k_neg=cfg.vespo_k_neg,
                    lambda_neg=cfg.vespo_lambda_neg)}
    policy = POLICY_LOSSES[cfg.policy_loss]
    policy = partial(policy, **settings[policy])
    if cfg.delta is not None:
        policy = partial(two_sided_clip, low=cfg.clip_eps, high=high, delta=cfg.delta)
    weights = []
    quantile = cfg.top_entropy_quantile
    truncated = cfg.mask_truncated_completions
    if quantile < 1:
        weights.append(high_entropy_only)
    threshold = cfg.off_policy_mask_threshold
    if threshold is not None:
        weights.append(partial(off_policy_sequences, threshold=threshold))
    correction = correction_mode(cfg)
    if correction is not None:
        mode, low, cap = correction
        ratio_of, bound = IMPORTANCE_SAMPLING_MODES[mode]
        weights.append(partial(sampler_correction, ratio_of=ratio_of, bound=bound,
                               low=0.0 if low is None else low,
                               high=math.inf if cap is None else cap))
    penalties, measures, bonuses = [], [], []
    estimator = KL_ESTIMATORS[cfg.kl_estimator]
    if cfg.beta > 0 and estimator is not None:
        penalties.append(partial(kl_penalty, beta=cfg.beta, estimator=estimator))
    elif cfg.beta > 0:
        measures.append(reference_kl)
    coef = cfg.entropy_coef
    if cfg.use_adaptive_entropy:
        bonuses.append(AdaptiveEntropy(coef, cfg.entropy_coef_min, cfg.entropy_coef_max,
                                       cfg.entropy_coef_delta, cfg.entropy_target))
    elif coef > 0:
        bonuses.append(partial(entropy_bonus, coef=coef))
    measures.append(entropy_tokens if bonuses else entropy_sum)
    if quantile < 1 or truncated:
        measures.append(policy_tokens)
    stateful = [part for part in (*weights, *penalties, *bonuses) if hasattr(part, "after_step")]
    return Loss("tokens" if bonuses else "sum", IMPORTANCE_SAMPLING_LEVELS[
        cfg.importance_sampling_level], policy, weights, penalties, LOSS_AGGS[cfg.loss_agg],
        bonuses, measures, quantile, truncated, stateful)


def clip_high(cfg) -> float:
    """The clip's bound above 1 is 1 + this: clip_eps_high, or clip_eps where it is None."""
    return cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high


def correction_mode(cfg) -> tuple | None:
    """The sampler correction cfg asks for, (its mode, lower bound, upper bound), or None; the
    older cap C is ("token_truncate", None, C)."""
    if cfg.tis_cap is not None:
        return "token_truncate", None, cfg.tis_cap
    if cfg.importance_sampling_correction:
        return (cfg.importance_sampling_mode, cfg.importance_sampling_clip_min,
                cfg.importance_sampling_clip_max)
    return None


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, num_sequences=None, num_tokens=None,
              constant_norm=None, sampler_logp=None, *, entropy=None, loss_mask=None,
              loss_state=None, **settings):
    """The loss to minimise (= -J of DeepSeekMath) of one batch (or micro-batch) under these
    settings -> (loss, stats): loss_of's Loss in one call, for a caller outside a run (tests,
    tools/bandit.py). `settings`: any of LossSettings' fields as keywords (the config keys of the
    same names, with the same defaults; dropping truncated completions is loss_mask here), checked
    by their rules.

    logp [B, T]: the sampled tokens' log-probs under the policy, with grad (padding finite: 0).
    old_logp [B, T] or None: under the sampling policy, no grad. None (mu = 1): logp.detach().
    ref_logp [B, T] or None: under the reference model; None only when beta == 0.
    advantages [B] (per sequence) or [B, T] (per token); mask [B, T]: completion tokens.
    sampler_logp [B, T] or None: the sampler's own log-probs, read by the sampler correction and
        the off-policy mask.
    entropy [B, T] or None: each token's entropy under the policy (with grad for a bonus), read by
        the entropy bonus and the top-entropy mask (whose quantile is over this call's tokens).
    loss_mask [B, T] or None: the tokens in the loss (default: mask), e.g. without truncated
        completions.
    loss_state: the state of the loss's parts that keep it (Loss.state_dict), or None: new.
    num_sequences, num_tokens (of the loss mask), constant_norm default to this call's completions
    in the loss, loss tokens and T; under gradient accumulation pass the WHOLE batch's.
    stats (0-d, detached): sums over this call's tokens / their count (num_tokens when given),
    adding up to the batch's means: ratio_mean and each part's measures (kl, clip fractions, ...).
    """
    cfg = LossSettings(**settings, mask_truncated_completions=loss_mask is not None)
    check(cfg)  # each setting's rule and needs
    loss = loss_of(cfg)
    if loss_state is not None:
        loss.load_state_dict(loss_state)
    reads_sampler = [part for part in loss.weights if part is not high_entropy_only]
    if cfg.beta > 0 and ref_logp is None:
        raise ValueError(f"beta={cfg.beta} needs ref_logp; pass beta=0 to train without a "
                         "reference")
    if entropy is None and (loss.bonuses or loss.entropy_quantile < 1):
        raise ValueError("the entropy bonus and the top-entropy mask read each token's entropy: "
                         "pass it")
    if sampler_logp is None and reads_sampler:
        raise ValueError(f"{', '.join(part.func.__name__ for part in reads_sampler)} needs "
                         "sampler_logp, the sampler's log-probs of the tokens")
    mask = mask.bool()
    loss_mask = mask if loss_mask is None else mask & loss_mask.bool()
    policy_mask = loss_mask
    if loss.entropy_quantile < 1:
        floor = entropy_floor(entropy[loss_mask].detach(), loss.entropy_quantile)
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
    batch = types.SimpleNamespace(
        mask=mask, loss_mask=loss_mask, policy_mask=policy_mask, advantages=advantages,
        old_logp=None if old_logp is None else old_logp.float(),
        ref_logp=None if ref_logp is None else ref_logp.float(),
        sampler_logp=None if sampler_logp is None else sampler_logp.float())
    return loss(terms_of(batch, logp.float(), entropy), sizes)


def entropy_floor(values: torch.Tensor, quantile: float):
    """The entropy at or above which the top `quantile` of values [M] lie (torch.quantile's linear
    interpolation, as TRL's); inf when there are none."""
    return torch.quantile(values.float(), 1 - quantile) if values.numel() else math.inf


# -----------------------------------------------------------------------------
# the checks that span several settings, run once when the config loads (config.validate, after
# each setting's own rule)


def check_settings(cfg):
    """A ValueError naming the settings unless cfg's advantage settings suit its method and group
    size, and a method without GRPO's loss leaves every switch off (each setting's rule and needs
    are checked before, by settings.check)."""
    if cfg.method == "ppo":
        check_ppo_settings(cfg)
    else:
        check_group_settings(cfg)
    switched = [key for key, off in defaults(LossSettings, switches=True).items()
                if getattr(cfg, key) != off]
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
                             "scale the advantages by none (Dr. GRPO), or keep a std with a "
                             "loss-side estimator (k3_is)")
    if changed(CriticSettings, cfg):
        raise ValueError(f"{', '.join(changed(CriticSettings, cfg))}: PPO's (method='ppo'); "
                         f"method={cfg.method!r} has no critic")


def check_ppo_settings(cfg):
    """PPO's settings: outcome rewards, no LoRA (the critic copies the whole policy), and none of
    GRPO's advantage settings, which GAE replaces (one process: config.validate)."""
    if changed(AdvantageSettings, cfg):
        raise ValueError(f"{', '.join(changed(AdvantageSettings, cfg))} shape GRPO's group "
                         "advantages; method='ppo' computes GAE on its critic's values instead")
    if cfg.supervision != "outcome" or cfg.lora_rank or cfg.dynamic_sampling:
        raise ValueError("method='ppo' needs supervision='outcome', no LoRA (its critic is a whole "
                         "copy of the policy) and no dynamic_sampling; got "
                         f"{cfg.supervision!r}, lora_rank={cfg.lora_rank}, "
                         f"dynamic_sampling={cfg.dynamic_sampling}")


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
