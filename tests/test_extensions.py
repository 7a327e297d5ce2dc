"""Issue 32's extension points, each pinned: the loss's settings object and GSPO, the post-sampling stage (Samples'
select/concat, DAPO's overlong penalty and dynamic sampling with its seeds), what a reward may read, the metrics'
one home, and bring-your-own data."""
import dataclasses
import json
import math
import os

import pytest
import torch

import config
import grpo
import rollout
import run as run_module
import train
from config import TrainConfig
from data import load_problems
from grpo import grpo_loss
from rewards import score_completions
from settings import fields_of
from rollout import QuestionStream, informative_groups, overlong_penalty
from rollout import Samples, rollout_seed, sample_groups
from test_guards import log_steps, tiny


def samples_of(rewards, lengths=None, correct=None, problems=None):
    """A Samples of len(rewards) rows; completion i has lengths[i] tokens."""
    n = len(rewards)
    lengths = lengths or [1] * n
    return Samples(prompts=[[7, i] for i in range(n)], completions=[[1] * k for k in lengths], texts=["x"] * n,
                   stopped=[True] * n, logprobs=[[-0.5] * k for k in lengths], rewards=list(rewards),
                   components={"correctness": list(correct or rewards), "format": [0.0] * n}, seconds_sampling=1.0,
                   seconds_scoring=0.5, problems=problems or list(range(n)))

# -----------------------------------------------------------------------------
# the loss's settings: declared once (grpo.LossSettings), every list derived from them


LOSS_KEYS = [f.name for f in fields_of(grpo.LossSettings)]


def test_the_loss_settings_are_config_keys_with_the_same_defaults_and_build_the_runs_loss(tmp_path, monkeypatch):
    """The loss's settings are declared once (grpo.LossSettings: a default, a doc and a rule each) and are config
    keys with the same defaults; grpo_loss takes each as a keyword with that default (mask_truncated_completions
    as its loss_mask); loss_of reads every one of them; the run's loss is loss_of of its config; --help prints each
    with its doc and its choices."""
    assert len(LOSS_KEYS) > 20 and {"policy_loss", "vespo_k_pos", "use_adaptive_entropy"} <= set(LOSS_KEYS)
    assert all(getattr(TrainConfig(), f.name) == f.default for f in fields_of(grpo.LossSettings))
    assert all(f.metadata["doc"] for f in fields_of(grpo.LossSettings))
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    defaults = {f.name: f.default for f in fields_of(grpo.LossSettings) if f.name != "mask_truncated_completions"}
    explicit, _ = grpo_loss(logp, None, logp.detach() - 0.1, torch.ones(1), torch.ones(1, 2), **defaults)
    implicit, _ = grpo_loss(logp, None, logp.detach() - 0.1, torch.ones(1), torch.ones(1, 2))
    assert torch.equal(explicit, implicit)

    class Reading:  # records which settings loss_of reads
        def __init__(self, **settings):
            self.settings, self.read = settings, set()

        def __getattr__(self, name):
            self.read.add(name)
            return self.settings[name]
    defaults = {f.name: f.default for f in fields_of(grpo.LossSettings)}
    for changed in ({}, {"tis_cap": None, "importance_sampling_correction": True}, {"tis_cap": 2.0},
                    {"policy_loss": "sapo"}, {"policy_loss": "vespo"}, {"delta": 2.0}, {"top_entropy_quantile": 0.5},
                    {"off_policy_mask_threshold": 0.5}, {"entropy_coef": 0.1}, {"use_adaptive_entropy": True},
                    {"mask_truncated_completions": True}):
        settings = Reading(**{**defaults, **changed})
        grpo.loss_of(settings)
        assert settings.read >= set(changed), changed
    read = set()
    for every in ({"importance_sampling_correction": True, "policy_loss": "sapo"}, {"policy_loss": "vespo"},
                  {"use_adaptive_entropy": True}):
        settings = Reading(**{**defaults, **every})
        grpo.loss_of(settings)
        read |= settings.read
    assert read == set(LOSS_KEYS)
    seen = []
    real = run_module.loss_of
    monkeypatch.setattr(run_module, "loss_of", lambda cfg: seen.append(cfg) or real(cfg))
    cfg = tiny(tmp_path, max_steps=1, clip_eps=0.1, clip_eps_high=0.3, beta=0.05, kl_estimator="k2",
               loss_agg="token_mean", importance_sampling_level="sequence", tis_cap=1.5)
    train.train(cfg)
    assert seen == [cfg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'clip'"):
        grpo_loss(torch.zeros(1, 1), None, None, torch.zeros(1), torch.ones(1, 1), clip=0.1, beta=0.0)
    with pytest.raises(ValueError, match="config: importance_sampling_level must be one of"):
        TrainConfig(importance_sampling_level="group")
    with pytest.raises(ValueError, match="^sapo_temperature_pos must be a finite number > 0"):
        grpo_loss(torch.zeros(1, 1), None, None, torch.zeros(1), torch.ones(1, 1), beta=0.0, sapo_temperature_pos=0)
    shown = config.help_text()
    for f in fields_of(grpo.LossSettings) + fields_of(grpo.AdvantageSettings):
        line = next(line for line in shown.splitlines() if line.startswith(f"  --{f.name}="))
        assert f.metadata["doc"] in line
    assert all(name in shown for name in ("cispo", "sapo", "vespo", "sequence_mask", "luspo", "normalize_then_sum"))


# -----------------------------------------------------------------------------
# GSPO


def test_gspo_takes_one_clipped_ratio_per_sequence_hand_computed():
    """Three sequences (the last one's third token padding), advantages +1, -1, +1, clip 0.2. Token log-ratios:
    row 0 (0.1, -0.2, 0.4): s0 = exp(0.1), inside the clip range although token 3's own ratio exp(0.4) is not;
    row 1 (0.3, 0.1): s1 = exp(0.2) > 1.2 with A < 0, unclipped side chosen; row 2 (0.3, 0.3, 0.3): s2 = exp(0.3)
    > 1.2 with A > 0: clipped, no gradient."""
    old = torch.zeros(3, 3)
    diff = torch.tensor([[0.1, -0.2, 0.4], [0.3, 0.1, 0.0], [0.3, 0.3, 0.3]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]]).bool()
    advantages = torch.tensor([1.0, -1.0, 1.0])
    s0, s1 = math.exp(0.1), math.exp(0.2)
    logp = (old + diff).requires_grad_()
    loss, stats = grpo_loss(logp, old, None, advantages, mask, beta=0.0, importance_sampling_level="sequence")
    # seq_mean: each sequence's loss is -min(s A, clip(s) A) on every token, so its mean is that, over 3 sequences
    assert loss.item() == pytest.approx((-s0 + s1 - 1.2) / 3, abs=1e-6)
    loss.backward()
    # d loss / d logp_t = -A s / (|o| N) on each token of an unclipped sequence, 0 when clipped
    expected = torch.tensor([[-s0 / 9] * 3, [s1 / 6, s1 / 6, 0.0], [0.0] * 3])
    assert torch.allclose(logp.grad, expected, atol=1e-6)
    assert stats["clip_frac_high"].item() == pytest.approx(3 / 8)  # row 2's three tokens of 8
    token_logp = (old + diff).requires_grad_()  # the token level clips row 0's third token: no gradient there
    grpo_loss(token_logp, old, None, advantages, mask, beta=0.0)[0].backward()
    assert token_logp.grad[0, 2] == 0 and logp.grad[0, 2] != 0


def test_gspo_on_policy_has_the_token_levels_gradient_with_seq_mean():
    g = torch.Generator().manual_seed(0)
    base, mask = torch.randn(6, 5, generator=g), torch.rand(6, 5, generator=g) > 0.3
    mask[:, 0] = True
    advantages = torch.randn(6, generator=g)
    grads = []
    for level in ("token", "sequence"):
        logp = base.clone().requires_grad_()
        grpo_loss(logp, None, None, advantages, mask, beta=0.0, importance_sampling_level=level)[0].backward()
        grads.append(logp.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-7)

# -----------------------------------------------------------------------------
# the post-sampling stage


def test_samples_select_and_concat_keep_every_row_field_aligned():
    a, b = samples_of([0.0, 1.0, 2.0], lengths=[1, 2, 3]), samples_of([3.0], lengths=[4], problems=[9])
    a.stats = {"x": 1}
    picked = a.select([2, 0])
    assert picked.rewards == [2.0, 0.0] and picked.lengths == [3, 1] and picked.prompts == [[7, 2], [7, 0]]
    assert picked.components["correctness"] == [2.0, 0.0] and picked.problems == [2, 0] and picked.stats == {"x": 1}
    both = Samples.concat([picked, b])
    assert both.rewards == [2.0, 0.0, 3.0] and both.lengths == [3, 1, 4] and both.problems == [2, 0, 9]
    assert both.logprobs == [[-0.5] * 3, [-0.5], [-0.5] * 4] and both.seconds_sampling == 2.0
    assert Samples.concat([a, dataclasses.replace(b, logprobs=None)]).logprobs is None  # absent in one part


def test_a_fast_path_counts_as_run_only_if_it_decoded_every_part():
    """Issue 46: dynamic sampling's draws and torchrun's ranks are concatenated; a fallback in any of them shows."""
    a, b = samples_of([0.0], lengths=[1]), samples_of([1.0], lengths=[2])
    a.fast_paths, b.fast_paths = {"cuda_graphs": True, "fused_sampling": True}, {"cuda_graphs": False}
    assert Samples.concat([a, b]).fast_paths == {"cuda_graphs": False, "fused_sampling": False}
    assert Samples.concat([a, a]).fast_paths == a.fast_paths and a.select([0]).fast_paths == a.fast_paths


def test_dapo_overlong_penalty_hand_computed():
    """DAPO eq. 13 with L_max = 16, L_cache = 4: no penalty up to 12 tokens, then linear down to -1 at 16."""
    cfg = tiny("unused", max_new_tokens=16, overlong_buffer_len=4, overlong_penalty_factor=1.0)
    samples = samples_of([1.0, 1.0, 0.0, 1.0, 0.0], lengths=[3, 12, 13, 14, 16])
    overlong_penalty(samples, cfg, seed=0)
    assert samples.components["overlong"] == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert samples.rewards == [1.0, 1.0, -0.25, 0.5, -1.0]
    half = samples_of([1.0], lengths=[14])
    overlong_penalty(half, dataclasses.replace(cfg, overlong_penalty_factor=0.5), seed=0)
    assert half.rewards == [0.75]
    with pytest.raises(ValueError, match="overlong_buffer_len=16 must be below max_new_tokens=16"):
        tiny("unused", max_new_tokens=16, overlong_buffer_len=16)


def test_the_overlong_penalty_is_logged_as_its_own_reward_column(tmp_path):
    train.train(tiny(tmp_path, max_new_tokens=8, overlong_buffer_len=4, overlong_penalty_factor=0.5))
    records = [json.loads(line) for line in open(tmp_path / "log.jsonl")]
    assert all(-0.5 <= r["reward_overlong"] <= 0 for r in records)
    assert all(r["reward"] == pytest.approx(0.1 * r["reward_format"] + r["reward_overlong"] + r["accuracy"])
               for r in records)  # correctness 1, format 0.1, plus the penalty


def test_informative_groups_are_those_whose_rewards_differ():
    assert informative_groups([1, 1, 0, 1, 0, 0, 0.5, 0.5000001], 2) == [False, True, False, True]


def test_dynamic_sampling_keeps_informative_groups_draws_more_and_fills_up_at_the_cap(monkeypatch):
    """prompts_per_step 4, groups of 2, at most 3 draws. Informative groups per draw: draw 0 (yes, no, no, yes),
    draw 1 (no, yes, no, no), draw 2 none: 3 kept, then the first dropped group fills the batch."""
    pattern = [[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 0]]
    seeds = []

    def scored_groups(run, cfg, picked, seed):
        seeds.append(seed)
        draw = len(seeds) - 1
        rewards = [r for g in range(4) for r in ((0.0, 1.0) if pattern[draw][g] else (1.0, 1.0))]
        return samples_of(rewards, problems=[q for q in picked for _ in range(2)])
    monkeypatch.setattr(rollout, "scored_groups", scored_groups)
    cfg = tiny("unused", group_size=2, prompts_per_step=4, dynamic_sampling=True, max_num_gen_batches=3, seed=5)
    run = type("Run", (), {"stream": QuestionStream(100, 0)})()
    order = QuestionStream(100, 0).next(12)
    samples = sample_groups(run, cfg, step=7)
    assert seeds == [rollout_seed(5, 7, draw) for draw in range(3)] and len(set(seeds)) == 3
    assert seeds[0] == rollout_seed(5, 7)  # the first draw samples as a run without dynamic sampling does
    kept = [order[0], order[3], order[5], order[1]]  # draw 0's 1st and 4th, draw 1's 2nd, then draw 0's 2nd (filled)
    assert samples.problems == [q for q in kept for _ in range(2)]
    assert samples.stats == {"dynamic_draws": 3, "dynamic_dropped_frac": 9 / 12, "dynamic_filled": 1,
                             "accuracy_sampled": sum(sum(r for r in ((0.0, 1.0) if p else (1.0, 1.0)))
                                                     for row in pattern for p in row) / 24}
    assert run.stream.cursor == 12  # three draws of 4 questions


def test_dynamic_sampling_stops_drawing_once_the_batch_is_full(monkeypatch):
    monkeypatch.setattr(rollout, "scored_groups", lambda run, cfg, picked, seed: samples_of(
        [0.0, 1.0] * len(picked), problems=[q for q in picked for _ in range(2)]))
    cfg = tiny("unused", group_size=2, prompts_per_step=4, dynamic_sampling=True, max_num_gen_batches=3)
    run = type("Run", (), {"stream": QuestionStream(100, 0)})()
    samples = sample_groups(run, cfg, step=1)
    assert samples.stats["dynamic_draws"] == 1 and samples.stats["dynamic_filled"] == 0 and run.stream.cursor == 4


PARITY = "def parity(completion, gold):\n    return float(len(completion) % 2)\n"


def test_dynamic_sampling_resumes_exactly_and_logs_its_draws(tmp_path):
    """A tiny model with a reward that some groups split: the run draws more questions in some steps; stopped after
    step 2 and resumed, it equals the uninterrupted run (every draw's seed is a function of the step and draw)."""
    (tmp_path / "parity.py").write_text(PARITY)
    settings = dict(dynamic_sampling=True, max_num_gen_batches=3, reward_weights={f"{tmp_path}/parity.py:parity": 1.0},
                    group_size=2, prompts_per_step=4, max_new_tokens=6, max_steps=4)
    train.train(tiny(tmp_path / "straight", **settings))
    train.train(tiny(tmp_path / "resumed", **{**settings, "max_steps": 2}))
    train.train(tiny(tmp_path / "resumed", **settings, resume=True))
    logs = [[{k: v for k, v in json.loads(line).items() if not k.startswith(("time_", "tokens_per_s"))}
             for line in open(tmp_path / run / "log.jsonl")] for run in ("straight", "resumed")]
    assert logs[0] == logs[1] and len(logs[0]) == 4
    assert all(1 <= r["dynamic_draws"] <= 3 and r["zero_std_frac"] * 4 == r["dynamic_filled"] for r in logs[0])
    assert any(r["dynamic_draws"] > 1 for r in logs[0])  # extra draws happened, and resumed exactly
    weights = [torch.load(tmp_path / run / "ckpt.pt", weights_only=True)["model"] for run in ("straight", "resumed")]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    with pytest.raises(ValueError, match="dynamic_sampling .* needs method='grpo' and supervision='outcome'"):
        tiny(tmp_path, dynamic_sampling=True, supervision="process")

# -----------------------------------------------------------------------------
# what a reward reads


def test_a_reward_may_read_token_lengths_the_truncated_flag_and_max_new_tokens():
    def short(completion, gold, length, truncated, max_new_tokens):
        return -1.0 if truncated else 1 - length / max_new_tokens

    def batched(completions, golds, questions, lengths, max_new_tokens):
        return [n / max_new_tokens for n in lengths]
    batched.batched = True

    def everything(completion, gold, **info):
        return float(sorted(info) == ["length", "max_new_tokens", "question", "template", "truncated"])
    totals, parts = score_completions(["a", "b"], ["1", "1"], [False, True], {"s": 1.0, "b": 1.0, "e": 1.0},
                                      questions=["q", "q"], functions={"s": short, "b": batched, "e": everything},
                                      lengths=[4, 16], max_new_tokens=16)
    assert parts == {"s": [0.75, -1.0], "b": [0.25, 1.0], "e": [1.0, 1.0]}
    with pytest.raises(ValueError, match="reward 's' reads the length: pass lengths="):
        score_completions(["a"], ["1"], [False], {"s": 1.0}, functions={"s": short}, max_new_tokens=16)

# -----------------------------------------------------------------------------
# the metrics' one home


def test_a_new_metric_is_one_function_and_reaches_the_log_and_the_progress_bar(tmp_path, monkeypatch):
    import records

    def answer_chars(samples, cfg, template):
        return {"answer_chars": sum(map(len, samples.texts)) / len(samples.texts)}
    monkeypatch.setattr(records, "METRICS", records.METRICS + (answer_chars,))
    train.train(tiny(tmp_path, progress_keys=("answer_chars",)))
    logged = [json.loads(line) for line in open(tmp_path / "log.jsonl")]
    assert all(r["answer_chars"] >= 0 for r in logged)
    assert not any("reward_overlong" in r for r in logged)  # the overlong penalty only when asked
    assert records.progress({"answer_chars": 3.14159, "loss": None}, ("answer_chars", "loss", "nope")) == \
        {"answer_chars": "3.142"}


def test_the_baselines_log_through_the_same_metrics(tmp_path):
    train.train(tiny(tmp_path, method="rft"))
    record = json.loads(open(tmp_path / "log.jsonl").readline())
    assert {"reward", "accuracy", "worked_rate", "response_length", "zero_std_frac", "kept_fraction"} <= set(record)

# -----------------------------------------------------------------------------
# your own data


def test_dataset_jsonl_reads_your_own_gsm8k_format_files(tmp_path):
    rows = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(5)]
    (tmp_path / "mine").mkdir()
    for split, part in (("train", rows[:3]), ("test", rows[3:])):
        (tmp_path / "mine" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    cfg = tiny(tmp_path / "run", dataset="jsonl", data_dir=str(tmp_path / "mine"), synthetic_args={})
    warm, problems, heldout = load_problems(cfg)
    assert [p["gold"] for p in problems] == ["1", "2", "3"] and [p["gold"] for p in heldout] == ["4", "5"]
    with pytest.raises(FileNotFoundError, match="dataset='jsonl' reads data_dir/"):
        load_problems(dataclasses.replace(cfg, data_dir=str(tmp_path / "nowhere")))
    train.train(cfg)
    assert log_steps(tmp_path / "run") == [1, 2]


def test_synthetic_args_are_checked_only_for_the_synthetic_datasets(tmp_path):
    assert TrainConfig(dataset="jsonl", synthetic_args={"max_operand": 5, "warm_ops": (1, 2)}).dataset == "jsonl"
    with pytest.raises(ValueError, match="synthetic_args has unknown key"):
        tiny(tmp_path, synthetic_args={"warm_ops": (1, 2)})  # synthetic_problems has no warm_ops
    assert os.path.isfile(os.path.join(os.path.dirname(__file__), "..", "configs", "demo.py"))
