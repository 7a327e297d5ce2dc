import math

import pytest
import torch

from bandit import ALGORITHMS, BASELINE_DECAY, rewards_of, run
from grpo import group_advantages, grpo_loss


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_raises_the_expected_reward_on_the_single_peak(algorithm):
    curves = run("single", algorithm, seed=0, steps=60)
    start, end = curves["expected_reward"][0].item(), curves["expected_reward"][-1].item()
    assert start == pytest.approx(rewards_of("single").mean().item())  # uniform start
    assert end > start + 0.2, (start, end)


def test_large_beta_keeps_grpo_closer_to_the_reference():
    free = run("single", "grpo", seed=0, steps=100, beta=0.0)
    held = run("single", "grpo", seed=0, steps=100, beta=1.0)
    assert held["kl"][-1] < 0.5 * free["kl"][-1], (held["kl"][-1], free["kl"][-1])


def test_metrics_are_exact_sums_over_the_ten_actions():
    curves = run("double", "grpo", seed=3, steps=20)
    p, reward = curves["policy"][-1], curves["reward"]
    dist, uniform = torch.distributions.Categorical(probs=p), torch.distributions.Categorical(logits=torch.zeros(10))
    assert curves["expected_reward"][-1].item() == pytest.approx((p * reward).sum().item(), abs=1e-6)
    assert curves["pi_best"][-1].item() == pytest.approx(p[7].item(), abs=1e-6)  # action 8
    assert curves["kl"][-1].item() == pytest.approx(torch.distributions.kl_divergence(dist, uniform).item(), abs=1e-5)
    assert curves["entropy"][-1].item() == pytest.approx(dist.entropy().item(), abs=1e-5)
    assert curves["kl"][-1].item() > 0.1  # the policy has moved, so the comparison above is not 0 == 0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_seed_gives_the_same_run_twice_and_other_seeds_differ(algorithm):
    first, again, other = (run("linear", algorithm, seed=s, steps=30) for s in (5, 5, 6))
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["policy"], other["policy"])


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="unknown landscape 'triple'"):
        run("triple", "grpo")
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'"):
        run("single", "ppo")
    with pytest.raises(ValueError, match="grpo needs group_size >= 2"):
        run("single", "grpo", group_size=1)
    with pytest.raises(ValueError, match="peak must be an action in 1..10"):
        run("single", "reinforce", peak=11)
    with pytest.raises(ValueError, match="unknown optimizer 'lion'"):
        run("single", "reinforce", optimizer="lion")
    assert run("single", "reinforce", group_size=1, steps=2)["batch_reward"].shape == (2,)  # one sample is fine


def test_reinforce_through_grpo_loss_is_the_plain_policy_gradient():
    logits = torch.randn(10, generator=torch.Generator().manual_seed(0), requires_grad=True)
    actions = torch.tensor([6, 6, 2, 9, 0, 7])
    rewards = rewards_of("single")[actions]
    advantages = group_advantages(rewards, 6, baseline="none", scale="none")
    logp = torch.log_softmax(logits, dim=-1)[actions].unsqueeze(1)
    loss, _ = grpo_loss(logp, None, None, advantages, torch.ones(6, 1), beta=0.0)
    via_grpo = torch.autograd.grad(loss, logits)[0]
    plain = torch.autograd.grad(-(rewards * torch.log_softmax(logits, dim=-1)[actions]).mean(), logits)[0]
    assert torch.allclose(via_grpo, plain, atol=1e-7) and plain.abs().sum() > 0


def test_moving_baseline_uses_only_past_rewards():
    curves = run("single", "reinforce_baseline", seed=1, steps=30)
    batch_reward, baseline = curves["batch_reward"], curves["baseline"]
    moving_mean, expected = 0.0, []
    for t, r in enumerate(batch_reward.tolist()):
        expected.append(moving_mean / (1 - BASELINE_DECAY ** t) if t else 0.0)
        moving_mean = BASELINE_DECAY * moving_mean + (1 - BASELINE_DECAY) * r
    assert baseline[0] == 0 and baseline[1].item() == pytest.approx(batch_reward[0].item())
    assert torch.allclose(baseline, torch.tensor(expected))
    grpo = run("single", "grpo", seed=1, steps=30)
    assert torch.equal(grpo["baseline"], grpo["batch_reward"])  # GRPO's baseline is its own group's mean
    assert torch.all(run("single", "reinforce", seed=1, steps=30)["baseline"] == 0)


def test_clip_bites_only_with_several_updates_per_group():
    # with mu=1 the ratio is exactly 1, so clip_eps cannot matter; with mu=4 the old log-probs stay fixed while
    # the policy moves, so a tight clip changes the run
    def final(mu, clip_eps):
        return run("double", "grpo", seed=0, steps=20, mu=mu, clip_eps=clip_eps, lr=0.2)["policy"][-1]
    assert torch.equal(final(1, 0.05), final(1, 0.5))
    assert not torch.allclose(final(4, 0.05), final(4, 0.5), atol=1e-3)


def test_landscapes_match_the_docstring():
    assert torch.allclose(rewards_of("single", peak=7), torch.tensor([0, 0, 0, .25, .5, .75, 1, .75, .5, .25]))
    assert torch.allclose(rewards_of("double"), torch.tensor([0, .35, .7, .35, 0, 0, .5, 1, .5, 0]))
    assert torch.allclose(rewards_of("linear"), torch.arange(1, 11) / 10)
    assert math.isclose(rewards_of("single", peak=1)[0].item(), 1.0)
