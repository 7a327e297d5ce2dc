"""Issue 62: TRL 1.16's five switches this repo lacked, each computed by hand (tools/trl_parity.py runs them beside
TRL's own code): VESPO's policy term, LUSPO's aggregation, GDPO's advantages, the adaptive entropy coefficient (a
part that keeps state: stepped after each optimizer step, saved and resumed bit for bit) and the reference's
TR-DPO sync; and the advantages the step logs."""
import json
import math
import signal

import pytest
import torch

import grpo
import train
from distributed import mix_weights
from grpo import grpo_loss
from test_guards import tiny


def test_vespo_weighs_each_completion_by_a_gamma_of_its_sequence_ratio():
    """Two completions: row 0 two tokens with log-ratios 0.1, 0.2 (w = e^0.3), A = +1 (k 2, lambda 3); row 1 one
    token with log-ratio -0.5 (w = e^-0.5), A = -1 (k 3, lambda 2). phi(w) = e^lam w^k e^(-lam w), detached;
    loss = -sum_t phi A log pi / tokens (token_mean); the gradient of log pi is -phi A / tokens."""
    logp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.1, -2.2], [0.0, 0.0]])
    mask = torch.tensor([[True, True], [True, False]])
    adv = torch.tensor([1.0, -1.0])
    loss, stats = grpo_loss(logp, old, None, adv, mask, beta=0.0, policy_loss="vespo", loss_agg="token_mean")
    phi0 = math.exp(3 + 2 * 0.3 - 3 * math.exp(0.3))
    phi1 = math.exp(2 + 3 * -0.5 - 2 * math.exp(-0.5))
    assert loss.item() == pytest.approx(-(phi0 * (-1.0 - 2.0) - phi1 * -0.5) / 3, rel=1e-6)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-phi0 / 3, -phi0 / 3], [phi1 / 3, 0.0]]), atol=1e-7)
    assert stats["vespo_phi_mean"].item() == pytest.approx((2 * phi0 + phi1) / 3, rel=1e-6)
    on_policy, stats = grpo_loss(logp.detach(), None, None, adv, mask, beta=0.0, policy_loss="vespo")
    assert stats["vespo_phi_mean"].item() == pytest.approx(1.0)  # phi(1) = 1: the plain policy gradient


def test_luspo_sums_each_completions_loss_over_its_tokens():
    """On-policy (ratio 1) the clipped term is -A per token: LUSPO's loss is -sum_i A_i |o_i| / N, GSPO's seq_mean
    -sum_i A_i / N."""
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    adv = torch.tensor([0.5, -1.0])
    loss, _ = grpo_loss(logp, None, None, adv, mask, beta=0.0, importance_sampling_level="sequence", loss_agg="luspo")
    assert loss.item() == pytest.approx(-(0.5 * 3 - 1.0 * 1) / 2)
    seq_mean, _ = grpo_loss(logp, None, None, adv, mask, beta=0.0, importance_sampling_level="sequence")
    assert seq_mean.item() == pytest.approx(-(0.5 - 1.0) / 2)


def test_gdpo_normalises_each_reward_in_its_group_then_the_weighted_sum_over_the_batch():
    """Two groups of two, correctness (weight 1) and format (weight 0.5): each reward (r - group mean) / (group std
    + eps), a group of equal rewards 0; the weighted sum s, then (s - mean s) / (std s + eps) over the batch."""
    correct = torch.tensor([1.0, 0.0, 1.0, 1.0])
    form = torch.tensor([0.0, 1.0, 0.2, 0.6])
    advantages, normalised = grpo.normalize_then_sum({"correctness": correct, "format": form},
                                                     {"correctness": 1.0, "format": 0.5}, 2, eps=0.0)
    s = math.sqrt(0.5)  # the unbiased std of two values 1 apart: 1 / sqrt(2); of 0.4 apart: 0.4 / sqrt(2)
    assert torch.allclose(normalised["correctness"], torch.tensor([0.5 / s, -0.5 / s, 0.0, 0.0]))
    assert torch.allclose(normalised["format"], torch.tensor([-0.5 / s, 0.5 / s, -0.2 / (0.4 * s), 0.2 / (0.4 * s)]))
    total = normalised["correctness"] + 0.5 * normalised["format"]
    assert torch.allclose(advantages, (total - total.mean()) / total.std())


def test_a_gdpo_run_logs_each_rewards_normalised_spread(tmp_path):
    train.train(tiny(tmp_path, multi_objective_aggregation="normalize_then_sum", max_steps=1))
    record = json.loads(open(tmp_path / "log.jsonl").readline())
    assert {"adv_abs_mean_correctness", "adv_abs_mean_format", "adv_abs_mean", "adv_std", "adv_zero_frac"} <= set(record)


def test_the_step_logs_its_advantages(tmp_path):
    """mean |A|, their std and the share that are 0, as computed from the step's rewards by hand."""
    seen = []
    real = train.advantages_of

    def spy(samples, batches, cfg):
        out = real(samples, batches, cfg)
        seen.append((torch.tensor(samples.rewards), out))
        return out
    train.advantages_of = spy
    try:
        train.train(tiny(tmp_path, max_steps=1, prompts_per_step=4))
    finally:
        train.advantages_of = real
    rewards, (advantages, stats) = seen[0]
    expected = grpo.group_advantages(rewards, 2)
    assert torch.equal(advantages, expected)
    record = json.loads(open(tmp_path / "log.jsonl").readline())
    assert record["adv_abs_mean"] == pytest.approx(expected.abs().mean().item())
    assert record["adv_std"] == pytest.approx(expected.std().item())
    assert record["adv_zero_frac"] == pytest.approx((expected == 0).float().mean().item())


def test_the_adaptive_entropy_coefficient_by_hand():
    """Start 0.05, target 1.0, step 0.02, within [0.01, 0.08]: no bonus before a step's entropy is known; a step at
    entropy 2 (above): 0.03, no bonus the next step; at 0.5 (below): 0.05, then the bonus 0.05 x the mean entropy;
    it stops at the ceiling."""
    part = grpo.AdaptiveEntropy(0.05, 0.01, 0.08, 0.02, 1.0)
    mask = torch.ones(1, 4, dtype=torch.bool)

    def call(entropy):
        x = type("X", (), {"entropy": torch.full((1, 4), entropy), "policy_mask": mask, "logp": torch.zeros(1, 4)})
        return part(x, type("S", (), {"policy_tokens": torch.tensor(4.0)})).item()
    assert call(2.0) == 0.0
    assert part.after_step() == {"entropy_coef": pytest.approx(0.03)}
    assert call(0.5) == 0.0  # the last step's entropy (2) was above the target
    assert part.after_step() == {"entropy_coef": pytest.approx(0.05)}
    assert call(0.5) == pytest.approx(0.05 * 0.5)
    for _ in range(3):
        part.after_step()
        call(0.5)
    assert part.coef == pytest.approx(0.08)
    assert part.state_dict() == {"coef": pytest.approx(0.08), "last_entropy": 0.5}


def test_an_adaptive_entropy_run_stopped_and_resumed_equals_an_unstopped_one(tmp_path, monkeypatch):
    """The coefficient's state is in ckpt.pt: a run stopped by SIGTERM after step 2 and resumed logs and saves what
    an unstopped run does, the coefficient included."""
    settings = dict(use_adaptive_entropy=True, entropy_target=10.0, entropy_coef_delta=0.01, max_steps=4,
                    checkpoint_every=0, mu=2)
    real_step = train.grpo_step

    def step_then_sigterm(run, cfg, step):
        out = real_step(run, cfg, step)
        if step == 2:
            signal.raise_signal(signal.SIGTERM)
        return out
    monkeypatch.setattr(train, "grpo_step", step_then_sigterm)
    assert train.train(tiny(tmp_path / "cut", **settings))["step"] == 2
    assert torch.load(tmp_path / "cut" / "ckpt.pt", weights_only=True)["loss"]["AdaptiveEntropy"]["coef"] == \
        pytest.approx(0.04)  # two steps of mu = 2 updates below the target
    monkeypatch.setattr(train, "grpo_step", real_step)
    train.train(tiny(tmp_path / "cut", resume=True, **settings))
    train.train(tiny(tmp_path / "straight", **settings))
    cut, straight = (torch.load(tmp_path / d / "ckpt.pt", weights_only=True) for d in ("cut", "straight"))
    assert cut["loss"] == straight["loss"] and straight["loss"]["AdaptiveEntropy"]["coef"] == pytest.approx(0.08)
    assert all(torch.equal(cut["model"][k], straight["model"][k]) for k in straight["model"])
    with open(tmp_path / "cut" / "log.jsonl") as f, open(tmp_path / "straight" / "log.jsonl") as g:
        untimed = [[{k: v for k, v in json.loads(line).items() if not k.startswith(("time", "tokens_per_s"))}
                    for line in log] for log in (f, g)]
    assert untimed[0] == untimed[1]
    assert [r["entropy_coef"] for r in untimed[1]] == pytest.approx([0.02, 0.04, 0.06, 0.08])


def test_the_reference_sync_mixes_the_policy_in_every_n_steps(tmp_path, monkeypatch):
    """mix_weights by hand; in a run with ref_model_sync_steps=2 the reference moves at steps 2 and 4 only, to
    alpha policy + (1 - alpha) reference."""
    target, source = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    before = [p.detach().clone() for p in target.parameters()]
    mix_weights(target, source, 0.25)
    for new, old, policy in zip(target.parameters(), before, source.parameters()):
        assert torch.allclose(new, 0.25 * policy + 0.75 * old)
    mixes = []
    real = train.mix_weights
    monkeypatch.setattr(train, "mix_weights", lambda ref, policy, alpha: mixes.append(alpha) or real(ref, policy, alpha))
    train.train(tiny(tmp_path, beta=0.1, sync_ref_model=True, ref_model_sync_steps=2, ref_model_mixup_alpha=0.3,
                     max_steps=4))
    assert mixes == [0.3, 0.3]
