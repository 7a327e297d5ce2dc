import math

import pytest
import torch

from grpo import LOSS_AGGS, group_advantages, grpo_loss, process_advantages, zero_std_group_fraction


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 1.0, 1.0])
    # group [1,0,0,1]: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3) -> +-0.5 * sqrt(3) = +-0.8660
    # group [3,1,1,1]: mean 1.5, unbiased std sqrt((2.25 + 3 * 0.25) / 3) = 1 -> [1.5, -0.5, -0.5, -0.5]
    s3 = 0.5 * math.sqrt(3)
    grpo = group_advantages(rewards, 4, eps=0.0)
    assert torch.allclose(grpo, torch.tensor([s3, -s3, -s3, s3, 1.5, -0.5, -0.5, -0.5]))
    # Dr. GRPO: r - mean
    dr = group_advantages(rewards, 4, scale="none")
    assert torch.allclose(dr, torch.tensor([0.5, -0.5, -0.5, 0.5, 1.5, -0.5, -0.5, -0.5]))
    # RLOO: r_i - mean of the other three; 1 - 1/3, 0 - 2/3; 3 - 1, 1 - 5/3
    rloo = group_advantages(rewards, 4, baseline="rloo", scale="none")
    assert torch.allclose(rloo, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 2.0, -2 / 3, -2 / 3, -2 / 3]))
    # REINFORCE: the raw reward
    assert torch.equal(group_advantages(rewards, 4, baseline="none", scale="none"), rewards)


def test_equal_reward_group_gets_exactly_zero_and_no_policy_gradient():
    # seven 0.7s: in fp32 r - mean is ~6e-8, not 0, which divided by (std + eps) would be ~0.06 of noise
    rewards = torch.tensor([0.7] * 7 + [1.0] + [0.0] * 6)
    for baseline, scale in (("mean", "std"), ("mean", "none"), ("rloo", "none")):
        adv = group_advantages(rewards, 7, baseline=baseline, scale=scale)
        assert torch.all(adv[:7] == 0) and torch.all(adv[7:] != 0)
    assert zero_std_group_fraction(rewards, 7).item() == 0.5

    adv = group_advantages(rewards, 7)
    logp = (-torch.rand(14, 5)).requires_grad_()
    old_logp = logp.detach() + 0.1 * torch.randn(14, 5)
    loss, _ = grpo_loss(logp, old_logp, None, adv, torch.ones(14, 5), beta=0.0)
    loss.backward()
    assert torch.all(logp.grad[:7] == 0) and logp.grad[7:].abs().sum() > 0


def _hand_case():
    # row 0, A=+1, ratios [1.0, 1.5, 0.5] -> objective [1.0, 1.2 (high clip), 0.5 (min keeps ratio*A)]
    # row 1, A=-1, ratios [0.5, 1.5, pad] -> objective [-0.8 (low clip), -1.5 (min keeps ratio*A: no clip)];
    # the pad ratio 100 must not count
    ratio = torch.tensor([[1.0, 1.5, 0.5], [0.5, 1.5, 100.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    return ratio.log(), torch.zeros(2, 3), torch.tensor([1.0, -1.0]), mask


@pytest.mark.parametrize("loss_agg, expected", [
    ("seq_mean", 0.125),                 # row losses -(1+1.2+0.5)/3 = -0.9 and (0.8+1.5)/2 = 1.15; mean 0.125
    ("token_mean", -0.08),               # (-2.7 + 2.3) / 5 tokens
    ("constant", -0.4 / 6),              # (-2.7 + 2.3) / (constant_norm 3 * 2 sequences)
])
def test_loss_by_hand(loss_agg, expected):
    logp, old_logp, adv, mask = _hand_case()
    loss, stats = grpo_loss(logp, old_logp, None, adv, mask, clip_eps=0.2, beta=0.0, loss_agg=loss_agg)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["clip_frac_low"].item() == pytest.approx(0.2)   # row 1 token 0 of 5 tokens
    assert stats["clip_frac_high"].item() == pytest.approx(0.2)  # row 0 token 1 (row 1 token 1 has A < 0)
    assert stats["ratio_mean"].item() == pytest.approx(1.0)  # (1 + 1.5 + 0.5 + 0.5 + 1.5) / 5
    assert "kl" not in stats  # no reference: nothing measured, no nan to log
    assert all(v.dim() == 0 and not v.requires_grad for v in stats.values())


def test_kl_value_sign_and_pull_toward_reference():
    # ref - logp = ln 2 everywhere: k3 = 2 - ln 2 - 1; A = 0, so the loss is +beta * k3 (added, not subtracted)
    logp, mask = torch.zeros(2, 3), torch.ones(2, 3)
    loss, stats = grpo_loss(logp, None, logp + math.log(2), torch.zeros(2), mask, beta=0.1)
    assert loss.item() == pytest.approx(0.1 * (1 - math.log(2)))
    assert stats["kl"].item() == pytest.approx(1 - math.log(2))

    ref = torch.zeros(2, 3)
    logp = torch.tensor([[0.5, 1.0, 2.0], [-0.5, -1.0, -2.0]], requires_grad=True)  # above and below ref
    loss, _ = grpo_loss(logp, None, ref, torch.zeros(2), mask, beta=0.1)
    loss.backward()
    stepped = logp.detach() - 0.1 * logp.grad
    assert torch.all((stepped - ref).abs() < (logp.detach() - ref).abs())


def test_kl_is_nonnegative_zero_at_reference_and_finite_at_extremes():
    logp, ref, mask = -5 * torch.rand(4, 6), -5 * torch.rand(4, 6), torch.ones(4, 6)
    assert grpo_loss(logp, None, ref, torch.zeros(4), mask)[1]["kl"] > 0
    assert grpo_loss(logp, None, logp, torch.zeros(4), mask)[1]["kl"] == 0
    for gap in (-1e4, 1e4):  # exp(1e4) overflows fp32 unless the log-ratio is clamped
        logp = torch.zeros(1, 2, dtype=torch.bfloat16, requires_grad=True)
        loss, stats = grpo_loss(logp, None, torch.full((1, 2), gap), torch.zeros(1), torch.ones(1, 2))
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(stats["kl"]) and torch.isfinite(logp.grad).all()


def _random_batch(B=7, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([1, 6, 3, 2, 5, 4, 2])[:B]
    mask = torch.arange(T) < lengths[:, None]
    logp = -torch.rand(B, T, generator=g) * 3
    old_logp = logp + 0.3 * torch.randn(B, T, generator=g)  # ratios both inside and outside the clip range
    ref_logp = logp + 0.5 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    return logp, old_logp, ref_logp, adv, mask


@pytest.mark.parametrize("loss_agg", LOSS_AGGS)
def test_micro_batches_sum_to_full_batch(loss_agg):
    logp, old_logp, ref_logp, adv, mask = _random_batch()
    B, T = logp.shape
    whole = dict(num_sequences=B, num_tokens=mask.sum(), constant_norm=T, loss_agg=loss_agg, beta=0.04)
    full_logp = logp.clone().requires_grad_()
    full_loss, _ = grpo_loss(full_logp, old_logp, ref_logp, adv, mask, loss_agg=loss_agg)
    full_loss.backward()

    micro_logp = logp.clone().requires_grad_()
    total = 0.0
    for rows in (slice(0, 2), slice(2, 3), slice(3, 7)):
        width = int(mask[rows].sum(1).max())  # each micro-batch trimmed to its own longest row
        cols = (rows, slice(0, width))
        loss, _ = grpo_loss(micro_logp[cols], old_logp[cols], ref_logp[cols], adv[rows], mask[cols], **whole)
        loss.backward()
        total = total + loss.detach()
    assert torch.allclose(total, full_loss.detach(), atol=1e-6)
    assert torch.allclose(micro_logp.grad, full_logp.grad, atol=1e-7)


def test_micro_batches_with_local_normalisers_would_differ():
    # guards the test above: the uneven split really does reweight if the normalisers are left at default
    logp, old_logp, ref_logp, adv, mask = _random_batch()
    full, _ = grpo_loss(logp, old_logp, ref_logp, adv, mask, loss_agg="token_mean")
    parts = [grpo_loss(logp[r], old_logp[r], ref_logp[r], adv[r], mask[r], loss_agg="token_mean")[0]
             for r in (slice(0, 2), slice(2, 3), slice(3, 7))]
    assert not torch.allclose(sum(parts), full, atol=1e-3)


def test_single_update_is_plain_policy_gradient():
    logp, _, _, adv, mask = _random_batch()
    logp.requires_grad_()
    loss, stats = grpo_loss(logp, None, None, adv, mask, beta=0.0, loss_agg="seq_mean")
    assert loss.item() == pytest.approx(-adv.mean().item(), abs=1e-6)
    assert stats["ratio_mean"].item() == 1.0
    loss.backward()
    # d/d logp of -(1/N) sum_i (1/|o_i|) sum_t A_i logp_it
    expected = -adv[:, None] * mask / mask.sum(1, keepdim=True) / logp.shape[0]
    assert torch.allclose(logp.grad, expected, atol=1e-7)


def test_clip_higher_only_changes_positive_advantages_above_the_clip():
    g = torch.Generator().manual_seed(1)
    B, T = 64, 8
    ratio = 0.6 + 0.9 * torch.rand(B, T, generator=g)  # 0.6 .. 1.5
    adv = torch.randn(B, T, generator=g)
    mask = torch.ones(B, T)

    def run(clip_eps_high):
        logp = ratio.log().requires_grad_()
        loss, stats = grpo_loss(logp, torch.zeros(B, T), None, adv, mask, clip_eps=0.2,
                                clip_eps_high=clip_eps_high, beta=0.0, loss_agg="token_mean")
        loss.backward()
        return loss.detach(), logp.grad, stats

    loss_sym, grad_sym, stats_sym = run(None)
    loss_high, grad_high, stats_high = run(0.28)
    positive_above = (adv > 0) & (ratio > 1.2)
    # objective per token goes from 1.2*A to min(ratio, 1.28)*A on those tokens and nowhere else
    gain = ((torch.minimum(ratio, torch.tensor(1.28)) - 1.2) * adv * positive_above).sum() / (B * T)
    assert torch.allclose(loss_sym - loss_high, gain, atol=1e-6) and gain > 0
    grad_changed = grad_sym != grad_high
    assert torch.equal(grad_changed, positive_above & (ratio < 1.28))
    assert stats_high["clip_frac_low"] == stats_sym["clip_frac_low"]
    assert stats_high["clip_frac_high"] < stats_sym["clip_frac_high"]


def test_process_advantages_by_hand():
    # group 1 (rows 0, 1): steps with rewards [1, 0] ending at tokens [1, 4], and [0] ending at token 3.
    # all three steps together: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    # -> 1 becomes (2/3) * sqrt(3) = 1.1547, 0 becomes -(1/3) * sqrt(3) = -0.5774.
    # row 0: tokens 0-1 see both steps (0.5774), tokens 2-4 only the last (-0.5774);
    # row 1: tokens 0-3 see its one step (-0.5774), token 4 comes after it (0).
    # group 2 (rows 2, 3): every step reward is 0.5 -> exactly 0 everywhere. Padded entries hold junk.
    claim_rewards = torch.tensor([[1.0, 0.0], [0.0, float("nan")], [0.5, 0.5], [0.5, 7.0]])
    claim_ends = torch.tensor([[1, 4], [3, 99], [2, 4], [0, 99]])
    claim_mask = torch.tensor([[True, True], [True, False], [True, True], [True, False]])
    adv = process_advantages(claim_rewards, claim_ends, group_size=2, seq_len=5, claim_mask=claim_mask, eps=0.0)
    a, b = 1 / math.sqrt(3), -1 / math.sqrt(3)
    expected = torch.tensor([[a, a, b, b, b], [b, b, b, b, 0.0], [0.0] * 5, [0.0] * 5])
    assert torch.allclose(adv, expected, atol=1e-6)
    assert torch.all(adv[2:] == 0)


def test_bad_inputs_are_refused():
    with pytest.raises(RuntimeError, match="invalid for input of size 6"):  # a ragged batch: no groups of 4
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="baseline must be one of"):
        group_advantages(torch.zeros(8), 4, baseline="median")
    with pytest.raises(ValueError, match="needs ref_logp"):
        grpo_loss(torch.zeros(2, 3), None, None, torch.zeros(2), torch.ones(2, 3), beta=0.04)
    with pytest.raises(ValueError, match="loss_agg"):
        grpo_loss(torch.zeros(2, 3), None, None, torch.zeros(2), torch.ones(2, 3), beta=0.0, loss_agg="mean")
    with pytest.raises(ValueError, match="claim_ends must lie"):
        process_advantages(torch.zeros(2, 1), torch.tensor([[0], [5]]), group_size=2, seq_len=5)


def test_truncated_importance_sampling_by_hand():
    """Issue 43: tis_cap weighs each token's clipped policy-gradient term by w = min(exp(old - sampler), cap),
    detached, and leaves the KL term alone. Two completions of 3 and 2 tokens, mu = 1 (old = logp.detach(): ratio 1),
    advantages +1 and -0.5, cap 2, beta 0.1 with the reference equal to the policy (k3 = 0, but its gradient is
    checked through a reference apart). Sampler log-probs lie below the trainer's by 0.1, 1.0 (capped: e^1 > 2),
    0.0 / 0.5, -0.2; the third token of row 1 is padding."""
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, 0.0]], requires_grad=True)
    sampler = logp.detach() - torch.tensor([[0.1, 1.0, 0.0], [0.5, -0.2, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, -0.5])
    w = torch.tensor([[math.exp(0.1), 2.0, 1.0], [math.exp(0.5), math.exp(-0.2), 0.0]])
    loss, stats = grpo_loss(logp, None, None, adv, mask, beta=0.0, sampler_logp=sampler, tis_cap=2.0)
    # seq_mean: sum_i (sum_t -A_i w_it / |o_i|) / N, the ratio being 1
    expected = (-(w[0].sum()) / 3 + 0.5 * (w[1, 0] + w[1, 1]) / 2) / 2
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    loss.backward()
    grad = torch.tensor([[-1 / 3 / 2] * 3, [0.5 / 2 / 2] * 2 + [0.0]]) * w  # w is a constant: no gradient through it
    assert torch.allclose(logp.grad, grad, atol=1e-7)
    assert stats["tis_capped_frac"].item() == pytest.approx(1 / 5) and stats["tis_weight_mean"].item() == pytest.approx(
        (w[0].sum() + w[1, 0] + w[1, 1]).item() / 5)
    plain, plain_stats = grpo_loss(logp, None, None, adv, mask, beta=0.0, sampler_logp=sampler)  # off: the default
    assert plain.item() == pytest.approx(((-3 / 3) + 0.5 * 2 / 2) / 2) and "tis_capped_frac" not in plain_stats
    # the KL term is not weighted: with a reference apart, the loss adds beta * k3 unweighted
    ref = logp.detach() + 0.3
    with_kl, _ = grpo_loss(logp, None, ref, adv, mask, beta=0.1, sampler_logp=sampler, tis_cap=2.0)
    k3 = math.exp(0.3) - 0.3 - 1
    assert with_kl.item() == pytest.approx(expected.item() + 0.1 * k3, rel=1e-6)
    with pytest.raises(ValueError, match="needs sampler_logp"):
        grpo_loss(logp, None, None, adv, mask, beta=0.0, tis_cap=2.0)


def test_tis_cap_is_a_config_key_checked_once_and_logged_when_on(tmp_path):
    import json
    import train
    from config import TrainConfig
    from test_guards import tiny
    assert TrainConfig().tis_cap is None
    with pytest.raises(ValueError, match="tis_cap must be None"):
        TrainConfig(tis_cap=0.5)
    train.train(tiny(tmp_path, max_steps=1, tis_cap=2.0))
    with open(tmp_path / "log.jsonl") as f:
        record = json.loads(f.readline())
    assert 0 <= record["tis_capped_frac"] <= 1 and record["tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)
