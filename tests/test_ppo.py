"""Issue 57: PPO with a learned critic (method="ppo"): GAE and its returns and the clipped value loss by hand and against
verl's own functions (read from the installed verl package's source, not imported: its import needs ray and more), the
per-token KL in the rewards, the settings checked once, the critic saved, stopped and resumed bit for bit, and the
metrics a PPO user reads."""
import ast
import importlib.metadata
import importlib.util
import json
import math
import os
import signal
import types
import typing

import pytest
import torch

import grpo
from settings import defaults
import run as run_module
import train
from grpo import gae, token_rewards, value_loss, whitened
from test_guards import log_steps, tiny

VERL_VERSION = "0.9.1"


def ppo(out_dir, **overrides):
    """A tiny PPO run (classic: one completion per prompt, as many prompts as GRPO's rows); the KL in the rewards,
    so that the critic has returns to learn even while every reward is 0."""
    return tiny(out_dir, **{**dict(method="ppo", group_size=1, prompts_per_step=4, beta=0.5,
                                   kl_estimator="k1_reward", loss_agg="token_mean"), **overrides})

# -----------------------------------------------------------------------------
# GAE, its returns, the value loss: by hand


def test_gae_and_returns_by_hand():
    """Row 0: three tokens, reward 1 at the last; row 1: two tokens (the third is padding), reward -1. gamma 0.9,
    lam 0.8. delta_t = r_t + gamma V_{t+1} - V_t (V after the last token 0), A_t = delta_t + gamma lam A_{t+1}."""
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()
    rewards = token_rewards(torch.tensor([1.0, -1.0]), mask)
    assert rewards.tolist() == [[0.0, 0.0, 1.0], [0.0, -1.0, 0.0]]
    values = torch.tensor([[0.5, 0.2, 0.4], [0.1, -0.3, 7.0]])  # row 1's padded value must not count
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    d2 = 1.0 + 0 - 0.4
    d1 = 0.0 + 0.9 * 0.4 - 0.2
    d0 = 0.0 + 0.9 * 0.2 - 0.5
    a2, a1 = d2, d1 + 0.72 * d2
    row0 = [d0 + 0.72 * a1, a1, a2]
    e1 = -1.0 + 0 - (-0.3)
    e0 = 0.0 + 0.9 * (-0.3) - 0.1
    row1 = [e0 + 0.72 * e1, e1]
    assert advantages[0].tolist() == pytest.approx(row0) and advantages[1, :2].tolist() == pytest.approx(row1)
    assert torch.allclose(returns, advantages + values)
    # gamma = lam = 1 (verl's defaults): A_t = the reward still to come less V_t
    advantages, _ = gae(rewards, values, mask, 1.0, 1.0)
    assert advantages[0].tolist() == pytest.approx([0.5, 0.8, 0.6]) and advantages[1, :2].tolist() == pytest.approx(
        [-1.1, -0.7])


def test_the_kl_in_the_rewards_is_beta_times_each_tokens_log_ratio():
    mask = torch.tensor([[1, 1, 0]]).bool()
    log_ratio = torch.tensor([[0.2, -0.1, 5.0]])  # log pi_sampler - log pi_ref; the padding's must not count
    assert token_rewards(torch.tensor([2.0]), mask, log_ratio, beta=0.5)[0].tolist() == pytest.approx([-0.1, 2.05, 0.0])


def test_whitening_over_the_masked_tokens():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]]).float()
    out = whitened(x, mask)
    kept = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert out[mask.bool()].tolist() == pytest.approx(((kept - kept.mean()) / kept.std()).tolist(), rel=1e-6)


def test_the_clipped_value_loss_by_hand():
    """cliprange 0.5, returns 1: V 2.0 from V_old 1.0 is clipped to 1.5 (its term 0.25 against 1.0: the unclipped is
    larger, kept); V -1.0 from V_old 0.0 clipped to -0.5 (2.25 against 4.0: kept); V 0.9 from V_old 0.0 clipped to 0.5
    (0.25 against 0.01: the clipped one, larger, counts, and its gradient is 0). 0.5 x sum / 3 tokens."""
    values = torch.tensor([[2.0, -1.0, 0.9]], requires_grad=True)
    old, returns, mask = torch.tensor([[1.0, 0.0, 0.0]]), torch.ones(1, 3), torch.ones(1, 3)
    loss, clipped = value_loss(values, old, returns, mask, torch.tensor(3), 0.5)
    assert loss.item() == pytest.approx(0.5 * (1.0 + 4.0 + 0.25) / 3) and clipped.item() == pytest.approx(1 / 3)
    loss.backward()
    assert values.grad[0].tolist() == pytest.approx([1.0 / 3, -2.0 / 3, 0.0])

# -----------------------------------------------------------------------------
# against verl's own functions


@pytest.fixture(scope="module")
def verl():
    """verl's compute_gae_advantage_return and compute_value_loss with the helpers they call, from the installed
    package's source (verl/trainer/ppo/core_algos.py, verl/utils/torch_functional.py), decorators stripped."""
    spec = importlib.util.find_spec("verl")
    if spec is None:
        pytest.skip(f"needs verl: pip install --no-deps verl=={VERL_VERSION} (in requirements-test-nodeps.txt)")
    if importlib.metadata.version("verl") != VERL_VERSION:
        pytest.skip(f"needs verl {VERL_VERSION}: pip install --no-deps verl=={VERL_VERSION}")
    folder = spec.submodule_search_locations[0]

    def functions(path, names, namespace):
        tree = ast.parse(open(os.path.join(folder, path)).read())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in names:
                node.decorator_list = []
                exec(compile(ast.Module([node], []), path, "exec"), namespace)
        return namespace
    helpers = functions("utils/torch_functional.py", {"masked_sum", "masked_mean", "masked_var", "masked_whiten",
                                                      "clip_by_value"}, {"torch": torch})
    namespace = {"torch": torch, "Optional": typing.Optional, "verl_F": types.SimpleNamespace(**helpers)}
    return functions("trainer/ppo/core_algos.py", {"compute_gae_advantage_return", "compute_value_loss", "agg_loss"},
                     namespace)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_returns_and_the_value_loss_equal_verls(verl, seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 5, 7
    lengths = torch.tensor([7, 3, 5, 1, 6])
    mask = (torch.arange(T) < lengths[:, None]).float()
    rewards = token_rewards(torch.randn(B, generator=g), mask.bool(), torch.randn(B, T, generator=g), beta=0.1)
    values = torch.randn(B, T, generator=g)
    for gamma, lam in ((1.0, 1.0), (0.99, 0.95)):
        theirs_advantages, theirs_returns = verl["compute_gae_advantage_return"](rewards, values, mask, gamma, lam)
        advantages, returns = gae(rewards, values, mask, gamma, lam)
        inside = mask.bool()
        torch.testing.assert_close(returns[inside], theirs_returns[inside], atol=1e-6, rtol=1e-6)
        # verl's masked_mean adds 1e-8 to the count: equal up to that
        torch.testing.assert_close(whitened(advantages, mask)[inside], theirs_advantages[inside], atol=1e-5, rtol=1e-5)
    vpreds = values + 0.7 * torch.randn(B, T, generator=g)
    theirs_loss, theirs_clipped = verl["compute_value_loss"](vpreds, returns, values, mask, 0.5)
    loss, clipped = value_loss(vpreds, values, returns, mask, mask.sum(), 0.5)
    assert loss.item() == pytest.approx(theirs_loss.item(), rel=1e-6)
    assert clipped.item() == pytest.approx(theirs_clipped.item(), rel=1e-6)

# -----------------------------------------------------------------------------
# a PPO run


def test_a_ppo_run_logs_what_a_ppo_user_reads_and_trains_its_critic(tmp_path):
    train.train(ppo(tmp_path, max_steps=3))
    with open(tmp_path / "log.jsonl") as f:
        records = [json.loads(line) for line in f]
    wanted = {"value_loss", "value_clip_frac", "explained_variance", "returns_mean", "values_mean",
              "critic_grad_norm", "kl", "loss", "clip_frac_low"}
    assert all(wanted <= set(r) and "zero_std_frac" not in r for r in records)  # groups of one: no group statistic
    assert records[0]["values_mean"] == 0 and records[-1]["values_mean"] != 0  # the head starts at 0, then learns
    assert all(math.isfinite(r["value_loss"]) and r["critic_grad_norm"] > 0 for r in records[1:])
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert state["critic"]["value_head.weight"].abs().sum() > 0 and state["critic_optimizer"]["state"]


def test_the_critic_starts_from_the_warm_start_a_copy_with_a_zero_head(tmp_path, monkeypatch):
    made = []
    real = run_module.Critic

    def making(policy):
        critic = real(policy)
        made.append((policy, critic, {k: v.clone() for k, v in critic.state_dict().items()}))
        return critic
    monkeypatch.setattr(run_module, "Critic", making)
    train.train(ppo(tmp_path, max_steps=1, sft_steps=3))  # a warm start first: the critic starts from its weights
    policy, critic, at_making = made[0]
    warm = torch.load(tmp_path / "sft.pt", weights_only=True)["model"]
    assert warm.keys() == {k.removeprefix("body.") for k in at_making if k.startswith("body.")}
    assert all(torch.equal(warm[k], at_making["body." + k]) for k in warm)
    assert not at_making["value_head.weight"].any() and not at_making["value_head.bias"].any()
    assert not any(p is q for p, q in zip(critic.parameters(), policy.parameters()))  # its own weights


def test_a_ppo_run_stopped_by_sigterm_and_resumed_equals_an_unstopped_one_critic_included(tmp_path, monkeypatch):
    real_step = train.grpo_step

    def step_then_sigterm(run, cfg, step):
        out = real_step(run, cfg, step)
        if step == 2:
            signal.raise_signal(signal.SIGTERM)  # as a scheduler's preemption during step 2
        return out
    monkeypatch.setattr(train, "grpo_step", step_then_sigterm)
    summary = train.train(ppo(tmp_path / "cut", max_steps=4, checkpoint_every=0))
    assert summary["interrupted"] == "SIGTERM" and summary["step"] == 2
    monkeypatch.setattr(train, "grpo_step", real_step)
    train.train(ppo(tmp_path / "cut", max_steps=4, checkpoint_every=0, resume=True))
    train.train(ppo(tmp_path / "straight", max_steps=4, checkpoint_every=0))
    cut, straight = (torch.load(tmp_path / d / "ckpt.pt", weights_only=True) for d in ("cut", "straight"))
    for part in ("model", "critic"):
        assert all(torch.equal(cut[part][k], straight[part][k]) for k in straight[part]), part
    for part in ("optimizer", "critic_optimizer"):
        for index, moments in straight[part]["state"].items():
            assert all(torch.equal(cut[part]["state"][index][k], v) for k, v in moments.items()), part
    assert log_steps(tmp_path / "cut") == [1, 2, 3, 4]
    with open(tmp_path / "cut" / "log.jsonl") as f, open(tmp_path / "straight" / "log.jsonl") as g:
        untimed = [[{k: v for k, v in json.loads(line).items() if not k.startswith(("time", "tokens_per_s"))}
                    for line in log] for log in (f, g)]
    assert untimed[0] == untimed[1]


@pytest.mark.parametrize("setting, message", [
    (dict(adv_baseline="rloo"), r"adv_baseline shape GRPO's group advantages; method='ppo'"),
    (dict(scale_rewards="none"), "shape GRPO's group advantages"),
    (dict(supervision="process"), "method='ppo' needs supervision='outcome', no LoRA"),
    (dict(lora_rank=4), "no LoRA"),
    (dict(gamma=1.5), r"gamma must be a number in \[0, 1\]"),
    (dict(cliprange_value=0.0), "cliprange_value must be a finite number > 0"),
    (dict(critic_lr=-1.0), "critic_lr must be None"),
])
def test_ppo_settings_are_checked_when_the_config_loads(tmp_path, setting, message):
    with pytest.raises(ValueError, match=message):
        ppo(tmp_path, **setting)


def test_the_critics_learning_rate_is_ten_times_the_policys_unless_set(tmp_path):
    assert ppo(tmp_path, lr=2e-3).critic_rate == pytest.approx(2e-2)  # verl's defaults: 1e-5 to the actor's 1e-6
    assert ppo(tmp_path, lr=2e-3, critic_lr=5e-4).critic_rate == 5e-4


def test_ppo_keys_are_refused_for_grpo(tmp_path):
    with pytest.raises(ValueError, match="gamma, cliprange_value: PPO's .*method='grpo' has no critic"):
        tiny(tmp_path, gamma=0.9, cliprange_value=0.2)
    assert set(defaults(grpo.CriticSettings)) == {"gamma", "lam", "cliprange_value", "critic_lr"}
    assert defaults(grpo.CriticSettings) == {k: getattr(tiny(tmp_path), k) for k in defaults(grpo.CriticSettings)}
