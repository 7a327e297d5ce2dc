"""
The update's machinery, feeding grpo.py's objective: a step's rows in micro-batches, the log-probs
of their completion tokens (the reference's, the sampling policy's, the policy's with grad), the mu
optimizer steps over them, PPO's critic's values and its own steps, and AdamW. In the order a step
runs it (train.grpo_step):

    batches = make_micro_batches(prompts, completions, size, pad_id, device, sampler_logprobs)
    add_logprobs(reference, batches, "ref_logp", temperature, chunk, autocast)  # beta > 0: anchor
    set_rows(batches, "advantages", advantages)  # grpo.advantages_of: per completion, or token
    stats = update(policy, optimizer, batches, loss, cfg, lr, autocast)  # mu optimizer steps

The normaliser contract: a micro-batch's loss is divided by the WHOLE batch's sequence or token
count (every rank's under torchrun), fixed before the micro-batch loop (batch_sizes), so the
micro-batches' gradients add up to the whole batch's exactly, however the rows are split. Three
masks: `mask` the completion tokens (scored, measured), `loss_mask` those the loss trains on and
normalises over, `policy_mask` those whose policy term counts. The full-vocabulary logits of a
micro-batch never exist at once: lm_head and log_softmax run a chunk of tokens at a time
(completion_logprobs), each chunk recomputed in the backward instead of stored (on CUDA in bf16 a
Triton kernel, kernels.fused_logprobs). Micro-batches hold rows of similar length (less padding);
the masks come from the lengths, never from token values (Qwen's pad token is its EOS). Each
optimizer step clips the global grad norm and refuses a non-finite norm or loss with a
FloatingPointError before the weights move.
"""
import math
import sys
from dataclasses import dataclass
from functools import partial

import torch
from torch.utils.checkpoint import checkpoint

import kernels
from distributed import accumulating, from_every_rank, over_ranks, whole, world_size
from grpo import Sizes, entropy_floor, gae, terms_of, token_rewards, value_loss, whitened

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
    # masked out: DAPO's truncation mask)
    loss_mask: torch.Tensor | None = None
    # [b, N] bool: the tokens whose policy term counts (loss_mask; the top-entropy mask narrows it)
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
    """Micro-batches of `size` rows of similar length; trained: the rows in the loss (None: all)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(completions[i]))
    batches = []
    for start in range(0, len(order), size):
        rows = order[start:start + size]
        ids, attention_mask, mask, width = pack([prompts[i] for i in rows],
                                                [completions[i] for i in rows], pad_id)
        batch = MicroBatch(ids.to(device), attention_mask.to(device), mask.to(device), width, rows)
        kept = torch.tensor([trained is None or trained[i] for i in rows], device=device)
        batch.loss_mask = batch.policy_mask = batch.mask & kept[:, None]  # the rows in the loss
        if sampler_logprobs is not None:
            flat = torch.tensor([x for i in rows for x in sampler_logprobs[i]])
            batch.sampler_logp = torch.zeros(mask.shape).masked_scatter(mask, flat).to(device)
        batches.append(batch)
    return batches


def pack(prompts: list[list[int]], completions: list[list[int]], pad_id: int):
    """Left-padded prompts + completions -> ids, attention_mask [b, P+N], mask [b, N], P; masks
    from the lengths (Qwen's pad token is its EOS)."""
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
# (mu > 1); set_rows() lays a step's per-row values (advantages, returns) on the micro-batches


@torch.no_grad()
def add_logprobs(model, batches: list[MicroBatch], field: str, temperature: float, chunk: int,
                 autocast):
    """Each micro-batch's `field` ("old_logp", "ref_logp"): its log-probs under model."""
    for batch in batches:
        with autocast:
            setattr(batch, field, completion_logprobs(model, batch, temperature, chunk)[0])


def completion_logprobs(model, batch: MicroBatch, temperature: float, chunk: int,
                        entropy: str | None = None):
    """fp32 log-probs [b, N] of the completion tokens; entropy: None, "sum" or "tokens" [b, N]."""
    hidden = completion_hidden(model, batch)  # [M, dim]
    targets = batch.ids[:, batch.prompt_width:][batch.mask]  # [M]
    pieces = None
    if hidden.device.type in kernels.LOGPROB_DEVICES:  # no [chunk, V] fp32 logits
        pieces = fused_chunks(model.lm_head, hidden, targets, temperature, chunk, entropy)
    if pieces is None:
        piece = (partial(checkpoint, chunk_logprobs, use_reentrant=False)
                 if torch.is_grad_enabled() else chunk_logprobs)
        pieces = [piece(model.lm_head, hidden[i:i + chunk], targets[i:i + chunk], temperature,
                        entropy) for i in range(0, targets.numel(), chunk)]
    logps, entropies = [logp for logp, _ in pieces], [ent for _, ent in pieces]
    logp = _scattered(logps, batch.mask, hidden)
    if entropy == "sum":
        return logp, sum((ent.sum() for ent in entropies), torch.zeros((), device=hidden.device))
    return logp, _scattered(entropies, batch.mask, hidden) if entropy == "tokens" else None


def completion_hidden(model, batch: MicroBatch) -> torch.Tensor:
    """The normed hidden states [M, dim] that predict batch's M completion tokens."""
    hidden = model(batch.ids, attention_mask=batch.attention_mask, return_hidden=True)
    return hidden[:, batch.prompt_width - 1:-1][batch.mask]  # position t scores token t + 1


def chunk_logprobs(lm_head, hidden, targets, temperature, entropy):
    """hidden [M, dim], targets [M] -> (fp32 log-probs [M], entropies [M] or None)."""
    logits = lm_head(hidden).float()  # [M, V]
    if temperature != 1:  # no copy for nothing
        logits = logits / temperature
    log_z = logits.logsumexp(dim=-1)
    chosen = logits.gather(-1, targets[:, None]).squeeze(-1) - log_z
    if entropy is None:
        return chosen, None
    with torch.set_grad_enabled(torch.is_grad_enabled() and entropy == "tokens"):
        return chosen, log_z - (logits.softmax(dim=-1) * logits).sum(dim=-1)


# the line _fall_back said when the fused log-probs failed in this process (off from then on)
FALLEN_BACK = []


def fused_chunks(lm_head, hidden, targets, temperature: float, chunk: int, entropy):
    """completion_logprobs' chunks by kernels.fused_logprobs, one Triton pass each: [(log-probs,
    entropies)], from hidden and lm_head's weight cast once to the dtype it runs in (autocast's,
    with grad); None where it does not run (kernels.logprobs_dtype: bf16 only) or has failed in
    this process (said once; the torch code then computes every chunk)."""
    dtype = None if FALLEN_BACK else kernels.logprobs_dtype(lm_head, hidden)
    if dtype is None:
        return None
    hidden, weight = hidden.to(dtype), lm_head.weight.to(dtype)
    try:
        return [kernels.fused_logprobs(hidden[start:start + chunk], weight,
                                       targets[start:start + chunk], temperature, entropy)
                for start in range(0, targets.numel(), chunk)]
    except Exception as error:  # a compile failure: the torch code, from here on
        _fall_back(error)
        return None


def _fall_back(error: Exception):
    """The fused log-probs failed: say so once, in one line, and keep them off in this process."""
    reason = (str(error).strip().splitlines() or [""])[0][:200]
    FALLEN_BACK.append(f"update.py: the fused log-prob kernel failed ({type(error).__name__}: "
                       f"{reason}); going on with the torch log-probs (lm_head and log_softmax a "
                       "chunk at a time), the same values within bf16's rounding")
    print(FALLEN_BACK[0], file=sys.stderr, flush=True)


def _scattered(pieces: list[torch.Tensor], mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The chunks' values [M] laid out on mask [b, N] (0 elsewhere), fp32."""
    values = torch.cat(pieces) if pieces else like.new_zeros(0, dtype=torch.float32)
    return torch.zeros(mask.shape, device=values.device).masked_scatter(mask, values)


@torch.no_grad()
def mark_high_entropy(policy, batches: list[MicroBatch], quantile: float, temperature: float,
                      chunk: int, autocast):
    """The top-entropy mask (Wang et al. 2025, "Beyond the 80/20 rule", arXiv:2506.01939): each
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


def set_rows(batches: list[MicroBatch], field: str, values: torch.Tensor):
    """Each micro-batch's rows of values [B] or [B, T >= N] (per token) as its `field`."""
    for batch in batches:
        rows = values[batch.rows]
        if values.dim() == 2:  # per token: its N completion columns
            rows = rows[:, :batch.mask.shape[1]]
        setattr(batch, field, rows.to(batch.ids.device))

# -----------------------------------------------------------------------------
# the update: mu optimizer steps on the loss over every micro-batch


def warmup_lr(lr: float, step: int, warmup_steps: int) -> float:
    """Linear warm-up over the first warmup_steps steps (from 1), then constant."""
    return lr * min(1.0, step / max(1, warmup_steps))


def update(policy, optimizer, batches: list[MicroBatch], loss, cfg, lr: float, autocast,
           ddp=None) -> dict[str, float]:
    """cfg.mu optimizer steps on `loss`, each then loss.after_step() -> the stats' means."""
    stats, gap = {}, {}
    for epoch_index in range(cfg.mu):
        epoch = policy_gradient(ddp or policy, batches, loss, cfg, autocast,
                                measure_gap=epoch_index == 0)
        gap.update({key: epoch.pop(key) for key in GAP_STATS if key in epoch})
        norm = optimizer_step(policy, optimizer, lr, cfg.grad_clip, loss=epoch["loss"])
        epoch["grad_norm"] = whole(norm)
        stats = {key: stats.get(key, 0) + value / cfg.mu for key, value in epoch.items()}
        kept = loss.after_step()  # the parts that keep state
    stats.update(gap)
    values = torch.stack(list(stats.values())).tolist()  # one host sync for all of them
    return {**dict(zip(stats, values)), **kept}


def policy_gradient(policy, batches: list[MicroBatch], loss, cfg, autocast,
                    measure_gap: bool = False) -> dict:
    """Forward and backward of `loss` over the micro-batches with whole-batch normalisers."""
    sizes = batch_sizes(batches, cfg.max_new_tokens)
    totals = {}
    gap_max = torch.zeros((), device=sizes.scored.device)
    for i, batch in enumerate(batches):
        with accumulating(policy, last=i == len(batches) - 1):  # DDP syncs in the last
            with autocast:
                logp, entropy = completion_logprobs(policy, batch, cfg.temperature,
                                                    cfg.logprob_chunk, loss.entropy)
            value, stats = loss(terms_of(batch, logp, entropy), sizes)
            # DDP and FSDP2 average the ranks' gradients: summed here
            (value * world_size()).backward()
        if measure_gap:
            gap, batch_max = sampler_gap(logp, batch, sizes.scored)
            stats = {**stats, **gap}
            gap_max = torch.maximum(gap_max, batch_max)
        for key, value in {"loss": value.detach(), **stats}.items():
            totals[key] = totals.get(key, 0) + value
    sums = over_ranks(torch.stack(list(totals.values())))
    totals = dict(zip(totals, sums))
    if measure_gap:
        totals["logprob_gap_max"] = over_ranks(gap_max, "max")
    return totals


def batch_sizes(batches: list[MicroBatch], width: int) -> Sizes:
    """The step's Sizes (every rank's under torchrun: a collective)."""
    counts = torch.stack([sum(b.loss_mask.any(dim=1).sum() for b in batches),
                          sum(b.loss_mask.sum() for b in batches),
                          sum(b.policy_mask.sum() for b in batches),
                          sum(b.mask.sum() for b in batches)])
    return Sizes(*over_ranks(counts).clamp(min=1), width)


@torch.no_grad()
def sampler_gap(logp: torch.Tensor, batch: MicroBatch, n_tok) -> tuple[dict, torch.Tensor]:
    """logp [b, N] against the sampler's: shares of mean |gap|, mean exp(gap); max |gap|."""
    diff = (logp.detach() - batch.sampler_logp).masked_fill(~batch.mask, 0.0)
    shares = {"logprob_gap": diff.abs().sum() / n_tok,
              "sampler_ratio": (diff.exp() * batch.mask).sum() / n_tok}
    return shares, diff.abs().max()

# -----------------------------------------------------------------------------
# PPO's critic (method="ppo"): its values, GAE's advantages and returns from them (grpo.gae), and
# its own optimizer steps on the clipped value loss (grpo.value_loss)


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

# -----------------------------------------------------------------------------
# the optimizer: AdamW over fp32 master weights, the update every training step ends with (GRPO, the
# warm start, the baselines)


def optimizer_step(model, optimizer, lr: float, grad_clip: float,
                   loss: torch.Tensor | None = None) -> torch.Tensor:
    """Clip the grad norm (0: off), step, zero the grads -> the norm; non-finite: an error."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                          grad_clip if grad_clip > 0 else math.inf)
    finite = torch.isfinite(norm) if loss is None else torch.isfinite(norm) & torch.isfinite(loss)
    if not finite:  # one host sync: never nan weights
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
