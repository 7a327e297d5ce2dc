"""configs/demo.py (issue 26): a warm start that mixes direct answers with worked solutions (synthetic_split's
direct_share), so that RL on the final answer alone can make the model work it out more often; the random-reward
control that it is measured against."""
import dataclasses
import hashlib
import json
import os
import random

import pytest
import torch

import rollout
import run as run_module
import train
from conftest import ROOT
from data import answer_only, chain_key, has_worked_solution, load_problems, synthetic_split
from rollout import Samples
from rollout import coin_rewards
from sft import sft_text
from template import CharTokenizer, format_prompt
from train import load_config


def config(*overlays, **overrides):
    cfg = load_config([os.path.join(ROOT, "configs", name) for name in ("demo.py",) + overlays])
    return dataclasses.replace(cfg, **overrides)


def digest(sets) -> str:
    return hashlib.sha256(json.dumps(sets).encode()).hexdigest()


def test_direct_share_0_keeps_the_split_bit_identical():
    # sha256 of the default split's three sets as json.dumps wrote them before direct_share existed (commit 2a301db),
    # i.e. the novel-split demo's sets (docs/experiments.md, 2026-11-23): its runs reproduce
    before = "5d4200c6279daadab7a752e9f11dbf4db37997ce9bd101668507454afb8c7a45"
    assert digest(synthetic_split(1337)) == digest(synthetic_split(1337, direct_share=0.0)) == before


def test_a_seeded_coin_per_warm_problem_makes_its_target_the_answer_alone():
    args = dict(warm_size=2000, rl_size=300, heldout_size=100, warm_ops=(1, 4), warm_mix="any", rl_ops=(3, 4),
                rl_mix="any", max_operand=5, max_start=20)
    worked_only, mixed = synthetic_split(7, **args), synthetic_split(7, direct_share=0.6, **args)
    assert mixed == synthetic_split(7, direct_share=0.6, **args)  # a deterministic function of the seed
    assert mixed[1:] == worked_only[1:]  # the coin changes no RL or held-out row
    coin = random.Random("7:direct")
    for row, original in zip(mixed[0], worked_only[0]):
        assert row["question"] == original["question"] and row["gold"] == original["gold"]
        if coin.random() < 0.6:
            assert row == answer_only(original) and sft_text(row) == f"</think> <answer>{row['gold']}</answer>"
        else:
            assert row == original and "=" in sft_text(row).split("</think>")[0]
    direct = sum(not has_worked_solution(row) for row in mixed[0]) / len(mixed[0])
    assert 0.55 < direct < 0.65
    with pytest.raises(ValueError, match=r"direct_share must be in \[0, 1\)"):
        synthetic_split(7, direct_share=1.0, **args)


def test_the_demo_warm_start_holds_every_rl_length_and_both_behaviours():
    warm, rl, heldout = load_problems(config())
    lines = lambda row: sft_text(row).split("</think>")[0].count("=")
    operations = {sum(map(chain_key(r["question"]).count, "+-")) for r in rl + heldout}
    assert operations == {3, 4}
    # a worked solution of every length the RL family needs: a 4th line RL can reinforce
    assert {lines(r) for r in warm if has_worked_solution(r)} == {1, 2, 3, 4}
    assert 0.57 < sum(lines(r) == 0 for r in warm) / len(warm) < 0.63  # direct_share 0.6
    assert all(r["solution"] == f"#### {r['gold']}" for r in rl + heldout)  # RL rows: the final answer only


def test_answer_only_warm_rows_are_refused_unless_the_config_asks_for_direct_answers():
    cfg = config(synthetic_warm_size=50, synthetic_train_size=20, synthetic_eval_size=4, eval_size=4)
    assert any(not has_worked_solution(row) for row in load_problems(cfg)[0])  # direct_share 0.6: on purpose
    strict = dataclasses.replace(cfg, synthetic_args={**cfg.synthetic_args, "direct_share": 0.0})
    assert all(map(has_worked_solution, load_problems(strict)[0]))


def test_the_demo_warm_start_trains_on_both_behaviours(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(run_module, "warm_start", lambda model, prompts, targets, cfg, *args, **kwargs: seen.update(
        prompts=prompts, targets=targets) or cfg.sft_steps)
    cfg = config(model_args={**config().model_args, "dim": 16, "n_layers": 1, "head_dim": 4, "ffn_dim": 32},
                 synthetic_warm_size=200, synthetic_train_size=50, synthetic_eval_size=8, eval_size=8, eval_every=0,
                 max_steps=0, out_dir=str(tmp_path))
    train.train(cfg)
    tok, (warm, _, _) = CharTokenizer(), load_problems(cfg)
    assert [tok.decode(p) for p in seen["prompts"]] == [format_prompt(r["question"], "plain") for r in warm]
    targets = [tok.decode(t) for t in seen["targets"]]
    direct = [t for t in targets if t.startswith("</think> <answer>")]
    assert 0 < len(direct) < len(targets) and all("=" in t.split("</think>")[0] for t in targets if t not in direct)


def samples(correct: list[float], fmt: list[float]) -> Samples:
    n = len(correct)
    return Samples([[0]] * n, [[1]] * n, [""] * n, [True] * n, [[0.0]] * n,
                   [c + 0.1 * f for c, f in zip(correct, fmt)], {"correctness": correct, "format": fmt}, 0.0, 0.0)


def test_the_random_reward_replaces_correctness_by_a_seeded_coin_of_the_given_rate():
    many = samples([1.0, 0.0] * 5000, [1.0] * 10000)
    rewards = coin_rewards(many, 1.0, 0.3, seed=5)
    coins = [r - 0.1 for r in rewards]  # the format reward stays
    assert set(round(c, 9) for c in coins) == {0.0, 1.0}
    assert abs(sum(coins) / len(coins) - 0.3) < 4 * (0.3 * 0.7 / len(coins)) ** 0.5
    right = [c for c, s in zip(coins, many.components["correctness"]) if s == 1.0]
    wrong = [c for c, s in zip(coins, many.components["correctness"]) if s == 0.0]
    assert abs(sum(right) / len(right) - sum(wrong) / len(wrong)) < 0.05  # independent of the answer
    assert coin_rewards(many, 1.0, 0.3, seed=5) == rewards and coin_rewards(many, 1.0, 0.3, seed=6) != rewards


def test_the_random_reward_control_trains_on_coins_and_logs_the_true_accuracy(tmp_path, monkeypatch):
    from test_guards import tiny
    seen = []
    real = rollout.coin_rewards
    monkeypatch.setattr(rollout, "coin_rewards", lambda *args: seen.append(args) or real(*args))
    train.train(tiny(tmp_path, random_reward=0.5, max_steps=2))
    assert len(seen) == 2 and seen[0][2] == 0.5 and seen[0][3] != seen[1][3]  # a seed per step
    with open(tmp_path / "log.jsonl") as f:
        records = [json.loads(line) for line in f]
    assert all(r["accuracy"] == 0.0 for r in records)  # a random tiny model: nothing right, whatever the coins
    assert config("demo_random.py").random_reward > 0 and config("demo_random.py").method == "grpo"
    with pytest.raises(ValueError, match="random_reward must be a probability"):
        tiny(tmp_path, random_reward=1.5)
    torch.manual_seed(0)


def test_eval_splits_accuracy_between_worked_answers_and_the_others():
    from eval import summarize
    sample = lambda correct, worked: {"correct": correct, "format": True, "worked": worked, "length": 5,
                                      "truncated": False}
    records = [{"samples": [sample(True, True), sample(False, True), sample(True, False)]},
               {"samples": [sample(True, True), sample(False, False), sample(False, False)]}]
    result = summarize(records, n=3, ks=(1,), temperature=1.0)
    assert result["worked_rate"] == 0.5 and result["accuracy_worked"] == 2 / 3 and result["accuracy_unworked"] == 1 / 3
    assert summarize(records[:1], 3, (1,), 1.0)["accuracy_unworked"] == 1.0
    none_worked = [{"samples": [sample(True, False)]}]
    assert summarize(none_worked, 1, (1,), 0.0)["accuracy_worked"] is None
