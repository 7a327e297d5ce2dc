"""Issue 55: each switch of the loss (grpo.loss_of's tables) computed by hand on a small batch, the loss mask apart from
the mask that scores and normalises, and what stops a run whose loss or gradient is not a finite number. TRL's own
loss on the same inputs: tests/test_trl_parity.py."""
import json
import math
import os
import sys

import pytest
import torch

import grpo
import update
import train
from config import TrainConfig
from grpo import grpo_loss, loss_of
from update import add_logprobs, make_micro_batches, policy_gradient, set_rows
from records import step_record
from test_guards import log_steps, saved_step, tiny
from test_train import random_rows, tiny_model

NO_AUTOCAST = torch.autocast("cpu", enabled=False)


def on_policy(values):
    """Log-probs [B, T] with grad; mu = 1, so the ratio is 1 in value."""
    return torch.tensor(values).requires_grad_()

# -----------------------------------------------------------------------------
# the sampler correction: four modes, two bounds


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_the_sampler_correction_weighs_the_policy_term_by_hand(mode):
    """Two completions of 3 and 2 tokens, on-policy (ratio 1), advantages +1 and -1, bounds [0.8, 1.5]. The sampler's
    log-probs lie below the trainer's by d: pi_old / pi_sampler = e^d per token, e^(sum d) per completion."""
    logp = on_policy([[-1.0, -2.0, -0.5], [-1.5, -0.7, 0.0]])
    d = torch.tensor([[0.1, 0.6, -0.5], [0.2, -0.1, 0.0]])  # e^d: 1.105, 1.822 (above), 0.607 (below); 1.221, 0.905
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0])
    r = d.exp()
    if mode == "token_truncate":
        w = r.clamp(0.8, 1.5)
    elif mode == "token_mask":
        w = torch.where((r < 0.8) | (r > 1.5), 0.0, r)
    else:  # one ratio per completion: e^0.2 = 1.221 and e^0.1 = 1.105, both inside; then row 0 pushed out below
        d[0, 2] = -1.0  # e^(0.1 + 0.6 - 1.0) = e^-0.3 = 0.741 < 0.8
        r = d.masked_fill(~mask, 0).sum(1, keepdim=True).exp().expand(2, 3)
        w = r.clamp(0.8, 1.5) if mode == "sequence_truncate" else torch.where(r < 0.8, 0.0, r)
    loss, stats = grpo_loss(logp, None, None, adv, mask, beta=0.0, sampler_logp=logp.detach() - d,
                            importance_sampling_correction=True, importance_sampling_mode=mode,
                            importance_sampling_clip_min=0.8, importance_sampling_clip_max=1.5)
    # seq_mean: sum_i (sum_t -A_i w_it / |o_i|) / N
    expected = (-w[0].sum() / 3 + w[1, :2].sum() / 2) / 2
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    loss.backward()
    grad = (-adv[:, None] / torch.tensor([[3.0], [2.0]]) / 2) * w * mask  # w is a constant: no gradient through it
    assert torch.allclose(logp.grad, grad, atol=1e-7)
    outside = ((r < 0.8) | (r > 1.5)) & mask
    assert stats["tis_capped_frac"].item() == pytest.approx(outside.sum().item() / 5)
    assert stats["tis_weight_mean"].item() == pytest.approx((w * mask).sum().item() / 5, rel=1e-6)


def test_tis_cap_is_token_truncate_with_that_cap():
    logp, d = on_policy([[-1.0, -2.0], [-0.3, -0.9]]), torch.tensor([[0.5, -0.4], [1.2, 0.1]])
    mask, adv = torch.ones(2, 2, dtype=torch.bool), torch.tensor([0.7, -0.4])
    a, _ = grpo_loss(logp, None, None, adv, mask, beta=0.0, sampler_logp=logp.detach() - d, tis_cap=1.5)
    b, _ = grpo_loss(logp, None, None, adv, mask, beta=0.0, sampler_logp=logp.detach() - d,
                     importance_sampling_correction=True, importance_sampling_mode="token_truncate",
                     importance_sampling_clip_max=1.5)
    assert torch.equal(a, b)
    cfg = TrainConfig(tis_cap=1.5)
    assert grpo.correction_mode(cfg) == ("token_truncate", None, 1.5) and not cfg.importance_sampling_correction

# -----------------------------------------------------------------------------
# the policy terms: CISPO, SAPO, the two-sided clip


def test_cispo_keeps_the_gradient_of_a_capped_token_weighed_by_the_cap():
    """Ratios e^0.5 = 1.65 (above the cap 1 + 0.2) and e^-0.1 = 0.90, advantages +1 and -2, token_mean over 2 tokens:
    the loss is -w A log pi with w = min(r, 1.2) detached, so d/d logp = -w A / 2, where PPO's clip gives 0 for the
    first token."""
    old = torch.tensor([[-1.0], [-1.0]])
    logp = (old + torch.tensor([[0.5], [-0.1]])).requires_grad_()
    adv = torch.tensor([1.0, -2.0])
    loss, stats = grpo_loss(logp, old, None, adv, torch.ones(2, 1), beta=0.0, policy_loss="cispo",
                            clip_eps_high=0.2, loss_agg="token_mean")
    w = torch.tensor([[1.2], [math.exp(-0.1)]])
    assert loss.item() == pytest.approx((-(w[:, 0] * adv * logp.detach()[:, 0]).sum() / 2).item(), rel=1e-6)
    loss.backward()
    assert torch.allclose(logp.grad, -w * adv[:, None] / 2, atol=1e-7) and logp.grad[0, 0] != 0
    assert stats["clip_frac_high"].item() == 0.5
    clipped = logp.detach().clone().requires_grad_()
    grpo_loss(clipped, old, None, adv, torch.ones(2, 1), beta=0.0, loss_agg="token_mean")[0].backward()
    assert clipped.grad[0, 0] == 0  # PPO's clip: no gradient past the clip


def test_sapo_is_a_soft_gate_with_the_ratio_gradient_on_policy():
    """f(r) = sigmoid(tau (r - 1)) 4 / tau, tau 1.0 for A > 0 and 1.05 for A <= 0: the loss is -f(r) A, its gradient
    -4 sigmoid'(tau (r - 1)) r A per token (dr / d logp = r), which is -A at r = 1, PPO's."""
    old = torch.zeros(3, 1)
    log_r = torch.tensor([[0.0], [0.7], [-0.4]])
    adv = torch.tensor([1.0, 1.0, -1.0])
    logp = (old + log_r).requires_grad_()
    loss, stats = grpo_loss(logp, old, None, adv, torch.ones(3, 1), beta=0.0, policy_loss="sapo",
                            loss_agg="token_mean")
    r, tau = log_r.exp()[:, 0], torch.tensor([1.0, 1.0, 1.05])
    gate = torch.sigmoid(tau * (r - 1))
    assert stats["sapo_gate_mean"].item() == pytest.approx((4 * gate * (1 - gate)).mean().item())  # 1 on-policy
    assert loss.item() == pytest.approx((-(gate * 4 / tau * adv).sum() / 3).item(), rel=1e-6)
    loss.backward()
    expected = -4 * gate * (1 - gate) * r * adv / 3
    assert torch.allclose(logp.grad[:, 0], expected, atol=1e-7) and logp.grad[0, 0].item() == pytest.approx(-1 / 3)
    assert 0 < -logp.grad[1, 0] < 1 / 3 * r[1]  # off-policy, the gate fades below r A's gradient


def test_delta_caps_the_ratio_of_a_negative_advantage():
    """A = -1, ratio 2: PPO's term -min(2 A, 1.2 A) = 2, with gradient; INTELLECT-2's delta 1.5 caps it at 1.5, no
    gradient. A positive advantage above the clip is clipped at 1.2 either way."""
    old = torch.zeros(2, 1)
    for delta, loss_value, grad in ((None, (2.0 - 1.2) / 2, -2.0 / 2), (1.5, (1.5 - 1.2) / 2, 0.0)):
        logp = (old + math.log(2.0)).requires_grad_()
        loss, stats = grpo_loss(logp, old, None, torch.tensor([-1.0, 1.0]), torch.ones(2, 1), beta=0.0,
                                delta=delta)
        loss.backward()
        assert loss.item() == pytest.approx(loss_value) and logp.grad[0, 0].item() == pytest.approx(-grad)
        assert stats.get("delta_capped_frac", "off") == ("off" if delta is None else 0.5)  # 1 of 2 tokens
        assert logp.grad[1, 0] == 0

# -----------------------------------------------------------------------------
# the masks of the policy term


def test_the_off_policy_mask_drops_negative_completions_that_drifted():
    """Threshold 0.1 on the mean of log pi_sampler - log pi_theta: row 0 (A < 0, drift 0.3) is dropped, row 1 (A < 0,
    drift 0.05) kept, row 2 (A > 0, drift 0.3) kept; the KL still applies to row 0."""
    logp = on_policy([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    drift = torch.tensor([[0.2, 0.4], [0.05, 0.05], [0.3, 0.3]])
    adv = torch.tensor([-1.0, -1.0, 1.0])
    loss, stats = grpo_loss(logp, None, logp.detach() + 0.1, adv, torch.ones(3, 2), beta=0.5,
                            sampler_logp=logp.detach() + drift, off_policy_mask_threshold=0.1)
    loss.backward()
    k3_grad = 0.5 * (1 - math.exp(0.1)) / 2 / 3  # d/dlogp of beta (e^(ref - logp) - (ref - logp) - 1), seq_mean
    assert logp.grad[0].tolist() == pytest.approx([k3_grad] * 2)
    assert logp.grad[1].tolist() == pytest.approx([1 / 6 + k3_grad] * 2)
    assert logp.grad[2].tolist() == pytest.approx([-1 / 6 + k3_grad] * 2)
    assert stats["off_policy_masked_frac"].item() == pytest.approx(2 / 6)


def test_top_entropy_quantile_keeps_the_policy_gradient_of_the_highest_entropy_tokens_only():
    """Entropies 0.1 .. 1.0 over ten tokens, quantile 0.3: the floor is torch.quantile(., 0.7) = 0.73, so tokens
    0.8, 0.9, 1.0 carry the policy gradient; the KL reaches all ten."""
    logp = on_policy([[-1.0] * 5, [-1.0] * 5])
    entropy = torch.arange(1, 11, dtype=torch.float32).view(2, 5) / 10
    loss, stats = grpo_loss(logp, None, logp.detach() - 0.2, torch.tensor([1.0, 1.0]), torch.ones(2, 5), beta=0.1,
                            entropy=entropy, top_entropy_quantile=0.3)
    assert stats["policy_token_frac"] == pytest.approx(0.3)  # 3 of the 10 tokens
    loss.backward()
    k3_grad = 0.1 * (1 - math.exp(-0.2)) / 5 / 2
    policy_part = logp.grad - k3_grad
    assert torch.allclose(policy_part, torch.tensor([[0.0] * 5, [0.0, 0.0, -0.1, -0.1, -0.1]]), atol=1e-7)

# -----------------------------------------------------------------------------
# the penalties and the bonus


def test_the_entropy_bonus_is_a_token_mean_with_its_gradient_whatever_the_aggregation():
    """loss = policy term - coef * mean entropy over the 5 tokens: d loss / d entropy = -coef / 5 on each token, under
    seq_mean as under token_mean; off, no entropy gradient at all."""
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    entropy = torch.tensor([[0.5, 1.0, 2.0], [0.2, 0.3, 9.9]])
    for loss_agg in ("seq_mean", "token_mean"):
        h = entropy.clone().requires_grad_()
        base, _ = grpo_loss(on_policy([[-1.0] * 3] * 2), None, None, torch.tensor([0.5, -0.5]), mask, beta=0.0,
                            loss_agg=loss_agg, entropy=h.detach())
        loss, stats = grpo_loss(on_policy([[-1.0] * 3] * 2), None, None, torch.tensor([0.5, -0.5]), mask, beta=0.0,
                                loss_agg=loss_agg, entropy=h, entropy_coef=0.1)
        assert loss.item() == pytest.approx(base.item() - 0.1 * 4.0 / 5)
        loss.backward()
        assert torch.allclose(h.grad, -0.1 / 5 * mask.float())
        assert stats["entropy"].item() == pytest.approx(4.0 / 5)


def test_a_run_computes_each_tokens_entropy_with_grad_only_when_the_bonus_reads_it(tmp_path, monkeypatch):
    asked = []
    real = update.completion_logprobs

    def spy(model, batch, temperature, chunk, entropy=None):
        asked.append((entropy, torch.is_grad_enabled()))
        return real(model, batch, temperature, chunk, entropy)
    monkeypatch.setattr(update, "completion_logprobs", spy)
    train.train(tiny(tmp_path / "off", max_steps=1, beta=0.1))
    assert {mode for mode, grad in asked if grad} == {"sum"}  # the update: the summed entropy, for the log
    assert {mode for mode, grad in asked if not grad} == {None}  # the reference's pass computes none
    asked.clear()
    train.train(tiny(tmp_path / "on", max_steps=1, entropy_coef=0.01))
    assert {mode for mode, grad in asked if grad} == {"tokens"}
    with open(tmp_path / "on" / "log.jsonl") as f:
        assert json.loads(f.readline())["entropy"] > 0


def test_the_kl_is_measured_only_where_there_is_a_reference():
    logp = on_policy([[-1.0, -2.0]])
    _, stats = grpo_loss(logp, None, None, torch.ones(1), torch.ones(1, 2), beta=0.0)
    assert "kl" not in stats
    _, stats = grpo_loss(logp, None, logp.detach() + 0.5, torch.ones(1), torch.ones(1, 2), beta=0.1,
                         kl_estimator="k1_reward")  # in the rewards: measured, no loss term
    assert stats["kl"].item() == pytest.approx(math.exp(0.5) - 1.5)

# -----------------------------------------------------------------------------
# advantages: scale_rewards


def test_scale_rewards_batch_divides_by_the_std_of_every_reward():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 1.0, 1.0])
    centred = torch.tensor([0.5, -0.5, -0.5, 0.5, 1.5, -0.5, -0.5, -0.5])
    std = rewards.std()  # unbiased, over all eight
    assert torch.allclose(grpo.group_advantages(rewards, 4, scale="batch", eps=0.0), centred / std)
    assert torch.equal(grpo.group_advantages(torch.tensor([0.7] * 4 + [0.0, 1.0, 0.0, 1.0]), 4, scale="batch")[:4],
                       torch.zeros(4))  # a group of equal rewards: exactly 0
    for keys, scale in ((dict(), "std"), (dict(scale_rewards="batch"), "batch"), (dict(scale_rewards="none"), "none"),
                        (dict(adv_scale="none"), "none")):
        assert grpo.reward_scale(TrainConfig(**keys)) == scale


@pytest.mark.parametrize("setting, message", [
    (dict(adv_scale="none", scale_rewards="batch"), "adv_scale='none' needs no batch std: it is the scale's older name"),
    (dict(scale_rewards="std"), r"scale_rewards must be one of \('group', 'batch', 'none'\)"),
    (dict(adv_baseline="none", scale_rewards="batch"), "scale='batch' needs a baseline"),
    (dict(tis_cap=2.0, importance_sampling_correction=True), "tis_cap=2.0 needs the correction's own switch off"),
    (dict(importance_sampling_correction=True, importance_sampling_clip_max=0.5), "importance_sampling_clip_max must be"),
    (dict(importance_sampling_correction=True, importance_sampling_clip_max=None), "importance_sampling_clip_max=None needs a number, or a lower bound"),
    (dict(importance_sampling_mode="sequence"), "importance_sampling_mode must be one of"),
    (dict(policy_loss="ppo"), r"policy_loss must be one of \('clip', 'cispo', 'sapo', 'vespo'\)"),
    (dict(delta=1.1), r"delta=1.1 needs PPO's clip as the policy term, and a number above 1 \+ clip_eps_high"),
    (dict(delta=2.0, policy_loss="cispo"), "delta=2.0 needs PPO's clip"),
    (dict(top_entropy_quantile=1.5), r"top_entropy_quantile must be a number in \[0, 1\]"),
    (dict(entropy_coef=-0.1), "entropy_coef must be a finite number >= 0"),
    (dict(off_policy_mask_threshold=-1.0), "off_policy_mask_threshold must be None"),
    (dict(sapo_temperature_neg=0.0), "sapo_temperature_neg must be a finite number > 0"),
    (dict(policy_loss="vespo", importance_sampling_level="sequence"), "policy_loss='vespo' needs the token level"),
    (dict(policy_loss="vespo", tis_cap=2.0), "no sampler correction"),
    (dict(entropy_coef_min=0.5, entropy_coef_max=0.1), "entropy_coef_max=0.1 needs a number at least the floor"),
    (dict(multi_objective_aggregation="sum"), "multi_objective_aggregation must be one of"),
    (dict(multi_objective_aggregation="normalize_then_sum", scale_rewards="none"), "multi_objective_aggregation='normalize_then_sum' needs .*GDPO"),
    (dict(multi_objective_aggregation="normalize_then_sum", overlong_buffer_len=4), "multi_objective_aggregation='normalize_then_sum' needs .*no shaping"),
    (dict(sync_ref_model=True, beta=0.0), "the reference's sync"),
    (dict(sync_ref_model=True, lora_rank=4, beta=0.1), "with LoRA the reference is the policy with its adapters"),
    (dict(ref_model_mixup_alpha=0.0), r"ref_model_mixup_alpha must be a number in \(0, 1\]"),
    (dict(method="rft", use_adaptive_entropy=True), "use_adaptive_entropy shape GRPO's loss"),
    (dict(method="rft", entropy_coef=0.1), "entropy_coef shape GRPO's loss; method='rft'"),
    (dict(method="sft_more", mask_truncated_completions=True), "mask_truncated_completions shape GRPO's loss"),
])
def test_the_switches_are_checked_when_the_config_loads(tmp_path, setting, message):
    with pytest.raises(ValueError, match=message):
        tiny(tmp_path, **setting)

# -----------------------------------------------------------------------------
# the loss mask, apart from the mask that scores and normalises


def test_truncated_completions_leave_the_loss_and_its_normalisers_but_stay_measured():
    """mask_truncated_completions: make_micro_batches keeps every completion token in `mask` (scored, measured) and
    only the kept rows' in loss_mask; the update's gradient equals the kept rows' alone, under any split, with the
    kept tokens as the token_mean normaliser, and a micro-batch of truncated rows only gives zero gradient."""
    prompts, completions = random_rows(6, seed=3)
    trained = [True, False, True, True, False, False]
    advantages = torch.randn(6, generator=torch.Generator().manual_seed(0))
    cfg = TrainConfig(loss_agg="token_mean", beta=0.1, logprob_chunk=4, mask_truncated_completions=True)
    grads = []
    for size, rows, kept in ((6, range(6), trained), (2, range(6), trained), (6, [0, 2, 3], None)):
        model, reference = tiny_model(), tiny_model(seed=1)
        batches = make_micro_batches([prompts[i] for i in rows], [completions[i] for i in rows], size, 0, "cpu",
                                     trained=kept)
        set_rows(batches, "advantages", advantages[list(rows)])
        add_logprobs(reference, batches, "ref_logp", 1.0, 4, NO_AUTOCAST)
        stats = policy_gradient(model, batches, loss_of(cfg), cfg, NO_AUTOCAST)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        if kept:
            assert sum(b.mask.sum() for b in batches) == sum(len(c) for c in completions)  # every token scored
            assert sum(b.loss_mask.sum() for b in batches) == sum(len(completions[i]) for i in (0, 2, 3))
            assert stats["kl"] > 0 and torch.isfinite(stats["loss"])
            kept_tokens = sum(len(completions[i]) for i in (0, 2, 3)) / sum(len(c) for c in completions)
            assert stats["policy_token_frac"].item() == pytest.approx(kept_tokens)
    assert torch.allclose(grads[0], grads[2], atol=1e-6) and torch.allclose(grads[1], grads[2], atol=1e-6)


def test_a_step_whose_completions_are_all_masked_gives_zero_gradient_not_a_crash():
    prompts, completions = random_rows(4, seed=4)
    cfg = TrainConfig(beta=0.0, logprob_chunk=4, mask_truncated_completions=True)
    model = tiny_model()
    batches = make_micro_batches(prompts, completions, 2, 0, "cpu", trained=[False] * 4)
    set_rows(batches, "advantages", torch.tensor([1.0, -1.0, 0.5, -0.5]))
    stats = policy_gradient(model, batches, loss_of(cfg), cfg, NO_AUTOCAST)
    assert stats["loss"] == 0 and all(p.grad is not None and not p.grad.any() for p in model.parameters())
    assert stats["entropy"] > 0  # still measured over the completion tokens


def test_mask_truncated_completions_reaches_the_run(tmp_path, monkeypatch):
    seen = []
    real = train.make_micro_batches
    monkeypatch.setattr(train, "make_micro_batches", lambda *args: seen.append(args[6]) or real(*args))
    train.train(tiny(tmp_path, max_steps=1, mask_truncated_completions=True, max_new_tokens=3))
    assert seen and not all(seen[0])  # 3 new tokens: completions cut, left out of the loss

# -----------------------------------------------------------------------------
# a loss or gradient that is not a finite number


def test_a_nan_advantage_stops_the_run_before_the_update_and_keeps_the_last_good_step(tmp_path, monkeypatch):
    real, calls = grpo.group_advantages, []

    def nan_at_step_2(*args, **kwargs):
        calls.append(1)
        values = real(*args, **kwargs)
        return values * float("nan") if len(calls) == 2 else values
    monkeypatch.setattr(grpo, "group_advantages", nan_at_step_2)
    with pytest.raises(FloatingPointError, match=r"step 2: the loss is nan .*an advantage.*stopped before the update, "
                                                 r"so .*keeps the last good weights, those of step 1"):
        train.train(tiny(tmp_path, max_steps=3, checkpoint_every=0, beta=0.0))
    assert saved_step(tmp_path) == 1 and log_steps(tmp_path) == [1]
    with open(tmp_path / "log.jsonl") as f:
        assert None not in json.loads(f.readline()).values()  # numbers only: no "kl": null without a reference


def test_a_finite_gradient_with_a_nan_loss_still_stops_the_update():
    model = tiny_model()
    model.lm_head.weight.grad = torch.zeros_like(model.lm_head.weight)
    optimizer = update.configure_optimizer(model, 1e-3)
    before = model.lm_head.weight.detach().clone()
    with pytest.raises(FloatingPointError, match="the loss is nan"):
        update.optimizer_step(model, optimizer, 1e-3, 1.0, loss=torch.tensor(float("nan")))
    assert torch.equal(model.lm_head.weight, before)


def test_a_record_holds_numbers_only():
    with pytest.raises(FloatingPointError, match="ratio_mean is inf"):
        step_record(3, None, {"loss": 0.1, "ratio_mean": float("inf")}, TrainConfig(), None)
    assert step_record(3, None, {"loss": 0.1}, TrainConfig(), None) == {"step": 3, "loss": 0.1}


def test_the_smoke_config_and_every_switch_it_runs_load_as_configs():
    """tools/smoke_switches.py's runs (python tools/smoke_switches.py runs them, about 5 minutes): the smoke config
    after configs/demo.py, and each switch's arguments on it, pass the config's checks and change the config."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
    import smoke_switches
    from config import load_config
    base = load_config(smoke_switches.CONFIG)
    assert base.mu == 2 and base.max_steps == 4 and base.sft_steps > 0 and base.eval_every == 0
    for name, (args, _, _) in smoke_switches.SWITCHES.items():
        assert load_config(smoke_switches.CONFIG + args) != base, name
