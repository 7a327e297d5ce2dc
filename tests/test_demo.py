"""dataset="synthetic_split" (issue 12; configs/demo.py since issue 26): three synthetic families (a warm start with
worked solutions, RL and held-out answer only), a strictly novel held-out split, the baselines (RFT, answers-only SFT,
more warm start) run by the same loop, and init_from, which starts every method from one shared warm start. The warm
start's direct answers are tests/test_demo_direct.py's."""
import dataclasses
import inspect
import json
import os
import re

import pytest
import torch

import sft
import data
import rollout
import run as run_module
import train
from data import chain_key, load_gsm8k, load_problems, main as data_main, synthetic_problems, synthetic_split
from sft import sft_text
from template import CharTokenizer, format_prompt
from train import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPLIT_DEFAULTS = {name: p.default for name, p in inspect.signature(synthetic_split).parameters.items()}
CLAUSE = re.compile(r"(buys|finds|gets|gives away|loses|sells) (\d+)")
SIGN = {"buys": "+", "finds": "+", "gets": "+", "gives away": "-", "loses": "-", "sells": "-"}


def chain_of(question: str) -> str:
    """The chain written independently of data.chain_key: start amount, then each operation and operand."""
    start = re.search(r" has (\d+) ", question).group(1)
    return start + "".join(SIGN[verb] + amount for verb, amount in CLAUSE.findall(question))


def solution_lines(row: dict) -> list[str]:
    return [line for line in row["solution"].splitlines() if not line.startswith("####")]


# the novel-split demo's data (configs/demo_novel.py until the redesign; docs/experiments.md, 2026-11-23): the
# defaults of synthetic_split, every warm-start solution worked
NOVEL = dict(synthetic_args={}, synthetic_warm_size=5000, synthetic_train_size=5000, synthetic_eval_size=300,
             eval_size=300)


def demo_config(*files, novel=True, **overrides):
    """configs/demo.py (with overlays), on the novel split's data unless novel=False."""
    cfg = load_config([os.path.join(ROOT, "configs", name) for name in ("demo.py",) + files])
    return dataclasses.replace(cfg, **{**(NOVEL if novel else {}), **overrides})

# -----------------------------------------------------------------------------
# the split


# overlapping lengths, few chains
CROWDED = dict(warm_ops=(1, 3), rl_ops=(2, 3), max_operand=4, max_start=4, warm_mix="any", rl_mix="any")


@pytest.mark.parametrize("which", ["novel", "demo.py", "crowded"])
def test_heldout_chains_occur_in_neither_the_warm_start_nor_the_rl_set(which):
    if which == "crowded":
        ops, (warm, rl, heldout) = CROWDED, synthetic_split(5, warm_size=800, rl_size=300, heldout_size=100, **CROWDED)
    else:
        cfg = demo_config(novel=which == "novel")
        ops, (warm, rl, heldout) = {**SPLIT_DEFAULTS, **cfg.synthetic_args}, load_problems(cfg)
        assert len(heldout) == cfg.eval_size == {"novel": 300, "demo.py": 200}[which]
    warm_chains, rl_chains = {chain_of(r["question"]) for r in warm}, [chain_of(r["question"]) for r in rl]
    heldout_chains = [chain_of(r["question"]) for r in heldout]
    assert not set(heldout_chains) & (warm_chains | set(rl_chains))
    assert not set(rl_chains) & warm_chains  # no RL problem's solution is among the warm start's
    assert len(set(heldout_chains)) == len(heldout) and len(set(rl_chains)) == len(rl)
    for rows, (low, high) in ((warm, ops["warm_ops"]), (rl, ops["rl_ops"]), (heldout, ops["rl_ops"])):
        assert all(low <= len(CLAUSE.findall(r["question"])) <= high for r in rows)
        assert all(1 <= int(re.search(r" has (\d+) ", r["question"]).group(1)) <= ops["max_start"] for r in rows)
    if which == "crowded":  # here the filter has work to do: the family drawn freely repeats the other sets' chains
        free = synthetic_problems(300, seed=9, min_ops=2, max_ops=3, max_operand=4, max_start=4)
        assert len({chain_of(r["question"]) for r in free} & (warm_chains | set(rl_chains))) > 50


def test_the_mix_keys_choose_chains_of_one_kind_or_of_both():
    warm, rl, heldout = synthetic_split(4, warm_size=300, rl_size=300, heldout_size=100, warm_ops=(1, 4), rl_ops=(2, 4),
                                   warm_mix="one", rl_mix="both")
    kinds = lambda row: {SIGN[verb] for verb, _ in CLAUSE.findall(row["question"])}
    assert all(len(kinds(r)) == 1 for r in warm) and all(kinds(r) == {"+", "-"} for r in rl + heldout)
    assert {"+"} in map(kinds, warm) and {"-"} in map(kinds, warm)
    free = synthetic_split(4, warm_size=300, rl_size=300, heldout_size=100, warm_ops=(1, 4), rl_ops=(2, 4),
                      warm_mix="any", rl_mix="any")
    assert any(len(kinds(r)) == 2 for r in free[0]) and any(len(kinds(r)) == 1 for r in free[1])
    with pytest.raises(ValueError, match="rl_mix must be one of .*'both' needs 2 or more operations"):
        synthetic_split(1, rl_ops=(1, 1), rl_mix="both")
    with pytest.raises(ValueError, match="warm_mix must be one of"):
        synthetic_split(1, warm_mix="some")


def test_chain_key_is_the_chain_of_the_worked_solution():
    for row in synthetic_problems(200, seed=2, min_ops=1, max_ops=4, max_operand=9):
        steps = [re.fullmatch(r"(\d+)([+-])(\d+)=\d+", line).groups() for line in solution_lines(row)]
        from_solution = steps[0][0] + "".join(op + amount for _, op, amount in steps)
        assert chain_key(row["question"]) == chain_of(row["question"]) == from_solution
    with pytest.raises(ValueError, match="not a synthetic question"):
        chain_key("Natalia sold clips to 48 of her friends in April.")


def test_rl_and_heldout_rows_carry_the_answer_only():
    warm, rl, heldout = synthetic_split(3, warm_size=200, rl_size=200, heldout_size=50)
    assert all(len(solution_lines(r)) >= 1 for r in warm)  # worked solutions
    for row in rl + heldout:
        assert row["solution"] == f"#### {row['gold']}" and sft_text(row) == f"</think> <answer>{row['gold']}</answer>"
    assert synthetic_split(3, 200, 200, 50) == (warm, rl, heldout)
    assert synthetic_split(3, 200, 300, 50)[0] == warm  # another RL size leaves the warm start's draws alone


def test_a_family_too_small_for_novel_heldout_chains_is_named():
    with pytest.raises(ValueError, match=r"found only \d+ of 100 held-out problems with a new chain"):
        synthetic_split(1, warm_size=10, rl_size=10, heldout_size=100, warm_ops=(2, 2), rl_ops=(1, 1), max_operand=3,
                   max_start=3, warm_mix="any", rl_mix="any")
    with pytest.raises(ValueError, match=r"rl_ops must be \(min, max\)"):
        synthetic_split(1, rl_ops=(4, 3))


@pytest.mark.parametrize("novel", [True, False])
def test_data_cli_writes_the_sets_train_py_uses(tmp_path, novel):
    cfg = demo_config(novel=novel)
    data_main(["synthetic_split", "--seed", str(cfg.seed), "--warm_size", str(cfg.synthetic_warm_size), "--rl_size",
               str(cfg.synthetic_train_size), "--heldout_size", str(cfg.synthetic_eval_size), "--out", str(tmp_path)]
              + [f"--{k}={v}" for k, v in cfg.synthetic_args.items()])
    sets = [load_gsm8k(str(tmp_path), name) for name in ("warm", "rl", "heldout")]
    assert list(load_problems(cfg)) == sets  # direct answers too: a "#### N" row reads back as answer_only's
    if novel:  # the CLI's defaults are synthetic_split's, the novel split's
        data_main(["synthetic_split", "--out", str(tmp_path / "defaults")])
        assert [load_gsm8k(str(tmp_path / "defaults"), name) for name in ("warm", "rl", "heldout")] == sets

# -----------------------------------------------------------------------------
# runs


def tiny_config(out_dir, *files, **overrides):
    tiny = dict(model_args=dict(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, ffn_dim=32, max_seq_len=200),
                synthetic_warm_size=30, synthetic_train_size=20, synthetic_eval_size=4, eval_size=4, eval_every=2,
                eval_batch_size=4, sft_steps=1, sft_batch_size=4, group_size=2, prompts_per_step=2, max_new_tokens=8,
                micro_batch_size=4, max_steps=2, sample_every=1, checkpoint_every=0, out_dir=str(out_dir))
    return demo_config(*files, **{**tiny, **overrides})


def test_the_warm_start_sees_only_warm_start_solutions(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(run_module, "warm_start", lambda model, prompts, targets, cfg, *args, **kwargs: seen.update(
        prompts=prompts, targets=targets) or cfg.sft_steps)
    cfg = tiny_config(tmp_path, max_steps=0)
    train.train(cfg)
    tok, (warm, rl, heldout) = CharTokenizer(), load_problems(cfg)
    prompts = {tok.decode(p) for p in seen["prompts"]}
    assert prompts == {format_prompt(r["question"], "plain") for r in warm}
    assert not prompts & {format_prompt(r["question"], "plain") for r in rl + heldout}
    targets = [tok.decode(t) for t in seen["targets"]]
    assert targets == [sft_text(r) for r in warm] and all("=" in t.split("</think>")[0] for t in targets)


def test_a_warm_start_set_without_worked_solutions_is_refused(tmp_path, monkeypatch):
    real = data.synthetic_split

    def answer_only_warm(*args, **kwargs):
        warm, rl, heldout = real(*args, **kwargs)
        return rl, rl, heldout
    cfg = tiny_config(tmp_path)
    monkeypatch.setattr(data, "synthetic_split", answer_only_warm)
    with pytest.raises(ValueError, match="the warm start needs worked solutions"):
        train.train(cfg)


def test_a_warm_start_prompt_longer_than_the_context_is_named_before_the_warm_start(tmp_path, monkeypatch):
    monkeypatch.setattr(run_module, "warm_start", lambda *args: pytest.fail("the warm start ran"))
    split = {"warm_ops": (6, 6), "warm_mix": "any", "rl_ops": (1, 1), "rl_mix": "any", "max_operand": 9,
             "max_start": 50, "restate": True}  # warm questions of six clauses, RL and held-out of one
    tiny = tiny_config(tmp_path, synthetic_args=split)
    longest = max(len(format_prompt(r["question"], "plain")) for r in load_problems(tiny)[0])
    cfg = dataclasses.replace(tiny, model_args={**tiny.model_args, "max_seq_len": longest + tiny.max_new_tokens - 1})
    rl_and_heldout = load_problems(cfg)[1:]
    assert max(len(format_prompt(r["question"], "plain")) for rows in rl_and_heldout for r in rows) < longest - 20
    with pytest.raises(ValueError, match=rf"is {longest} tokens; with max_new_tokens={cfg.max_new_tokens}"):
        train.train(cfg)


def test_rft_trains_on_the_correct_samples_only(tmp_path, monkeypatch):
    real_sample, real_sft = rollout.sample_and_score, sft.sft_loss_backward
    verdicts = {1: [1.0, 0.0, 0.0, 1.0], 2: [0.0, 0.0, 0.0, 0.0]}  # per step: 2 questions x 2 samples
    sampled, trained = [], []

    def known_correctness(*args, **kwargs):
        samples = real_sample(*args, **kwargs)
        samples.components["correctness"] = verdicts[len(sampled) + 1]  # eval_every=0: only training samples
        sampled.append(samples)
        return samples

    def record_targets(model, prompts, targets, *args):
        trained.append((prompts, targets))
        return real_sft(model, prompts, targets, *args)
    monkeypatch.setattr(rollout, "sample_and_score", known_correctness)
    monkeypatch.setattr(sft, "sft_loss_backward", record_targets)
    train.train(tiny_config(tmp_path, "demo_rft.py", sft_steps=0, eval_every=0))
    assert len(sampled) == 2 and len(trained) == 1  # step 2 had nothing correct: no update
    assert trained[0][1] == [sampled[0].completions[0], sampled[0].completions[3]]
    with open(tmp_path / "log.jsonl") as f:
        log = [json.loads(line) for line in f]
    assert [r["kept_fraction"] for r in log] == [0.5, 0.0] and [r["accuracy"] for r in log] == [0.5, 0.0]
    assert log[0]["loss"] > 0 and log[1]["loss"] is None and log[1]["grad_norm"] is None


@pytest.mark.parametrize("files, method", [((), "grpo"), (("demo_rft.py",), "rft"),
                                              (("demo_sft_answers.py",), "sft_answers"),
                                              (("demo_sft_more.py",), "sft_more")])
def test_each_demo_config_runs_two_steps(tmp_path, monkeypatch, files, method):
    real_update, targets = sft.supervised_update, []

    def record_targets(run, cfg, step, prompts, batch_targets):  # a baseline step's update (not the warm start's)
        targets.extend(CharTokenizer().decode(t) for t in batch_targets)
        return real_update(run, cfg, step, prompts, batch_targets)
    monkeypatch.setattr(sft, "supervised_update", record_targets)
    cfg = tiny_config(tmp_path, *files)
    assert cfg.method == method and cfg.out_dir == str(tmp_path)
    train.train(cfg)
    with open(tmp_path / "log.jsonl") as f:
        log = [json.loads(line) for line in f]
    assert [r["step"] for r in log] == [1, 2] and os.path.isfile(tmp_path / "ckpt.pt")
    if method in ("grpo", "rft"):  # sampled: the R1-Zero curves' keys
        assert all({"reward", "accuracy", "response_length"} <= set(r) for r in log)
    else:
        assert all(r["loss"] > 0 for r in log) and len(targets) == 2 * cfg.prompts_per_step * cfg.group_size
        if method == "sft_more":  # worked solutions of the warm start's family
            assert all("=" in t.split("</think>")[0] for t in targets)
        else:  # the answer alone
            assert all(t.startswith("</think> <answer>") and t.endswith("</answer>") for t in targets)
    with open(tmp_path / "eval.jsonl") as f:
        assert [json.loads(line)["step"] for line in f] == [0, 2]


def test_eval_cli_scores_the_demo_heldout_file_with_pass_at_k(tmp_path):
    import eval as eval_cli
    train.train(tiny_config(tmp_path, eval_every=0))
    summary = eval_cli.main(["--model", str(tmp_path / "ckpt.pt"), "--data", str(tmp_path / "heldout.jsonl"),
                             "--n", "4", "--k", "1,4", "--max_new_tokens", "8", "--out", str(tmp_path / "scored")])
    assert summary["questions"] == 4 and summary["pass@1_stderr"] >= 0 and "pass@4" in summary
    assert summary["pass@1"] <= summary["pass@4"] <= 1


def test_an_unknown_method_is_named(tmp_path):
    with pytest.raises(ValueError, match="method must be one of .*'ppo', 'rft'.*got 'dpo'"):
        tiny_config(tmp_path, method="dpo")


def test_only_grpo_and_ppo_keep_a_reference_model(tmp_path):
    for files, has_reference in (((), True), (("demo_rft.py",), False), (("demo_ppo.py",), True)):  # RFT has no use for one
        out = tmp_path / "_".join(files or ("grpo",))
        train.train(tiny_config(out, *files, sft_steps=0, eval_every=0, max_steps=1, beta=0.04))
        state = torch.load(out / "ckpt.pt", weights_only=True)
        assert (state["reference"] is not None) == has_reference


def test_the_baselines_refuse_torchrun_and_grpo_accepts_it(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for files in (("demo_rft.py",), ("demo_sft_answers.py",), ("demo_sft_more.py",)):
        with pytest.raises(ValueError, match=r"runs in one process only .*without torchrun \(WORLD_SIZE=2\)"):
            tiny_config(tmp_path, *files)
    assert tiny_config(tmp_path).method == "grpo"  # validate() passes: GRPO splits its groups over the ranks

# -----------------------------------------------------------------------------
# init_from: every method and seed from one warm start


def test_init_from_starts_from_the_checkpoint_weights_without_a_warm_start(tmp_path, monkeypatch):
    train.train(tiny_config(tmp_path / "warm", max_steps=0, sft_steps=3))
    warm = torch.load(tmp_path / "warm" / "sft.pt", weights_only=True)["model"]
    monkeypatch.setattr(run_module, "warm_start", lambda *args: pytest.fail("init_from must skip the warm start"))
    for files in ((), ("demo_sft_answers.py",)):
        out = tmp_path / "_".join(files or ("grpo",))
        train.train(tiny_config(out, *files, init_from=str(tmp_path / "warm" / "sft.pt"), max_steps=0, seed=7,
                                data_seed=1337))
        start = torch.load(out / "ckpt.pt", weights_only=True)["model"]
        assert start.keys() == warm.keys() and all(torch.equal(start[k], warm[k]) for k in warm)
        assert not os.path.exists(out / "sft.pt") and not os.path.exists(out / "sft_log.jsonl")
    with open(tmp_path / "warm" / "eval.jsonl") as f, open(tmp_path / "grpo" / "eval.jsonl") as g:
        assert json.loads(f.readline())["pass@1"] == json.loads(g.readline())["pass@1"]


def test_init_from_names_a_missing_file_and_a_model_of_another_shape(tmp_path):
    with pytest.raises(ValueError, match=r"init_from='.*nowhere\.pt': no such file"):
        tiny_config(tmp_path, init_from=str(tmp_path / "nowhere.pt"))
    train.train(tiny_config(tmp_path / "warm", max_steps=0, eval_every=0))
    wider = tiny_config(tmp_path / "wider", init_from=str(tmp_path / "warm" / "sft.pt"))
    wider = dataclasses.replace(wider, model_args={**wider.model_args, "ffn_dim": 48})
    with pytest.raises(ValueError, match=r"holds a model of another shape: ffn_dim 32 \(this run: 48\)"):
        train.train(wider)


def test_init_from_refuses_a_warm_start_of_another_split_and_data_seed_shares_one(tmp_path):
    train.train(tiny_config(tmp_path / "warm", max_steps=0, eval_every=0, seed=11))
    warm_ckpt = str(tmp_path / "warm" / "sft.pt")
    with pytest.raises(ValueError, match="was warm-started on another set than this run.s .*set data_seed to its run.s seed"):
        train.train(tiny_config(tmp_path / "other", init_from=warm_ckpt, seed=12))
    shared = tiny_config(tmp_path / "shared", init_from=warm_ckpt, seed=12, data_seed=11, max_steps=1)
    assert load_problems(shared) == load_problems(tiny_config(tmp_path, seed=11))
    assert load_problems(shared) != load_problems(tiny_config(tmp_path, seed=12))
    train.train(shared)
    with open(tmp_path / "shared" / "log.jsonl") as f:
        assert [json.loads(line)["step"] for line in f] == [1]
    shorter = {**shared.synthetic_args, "rl_ops": (2, 3)}  # another RL family, the same warm-start set: accepted
    train.train(dataclasses.replace(shared, synthetic_args=shorter, out_dir=str(tmp_path / "shorter")))
    wider = {**shared.synthetic_args, "warm_ops": (1, 3)}  # another warm-start family: refused
    with pytest.raises(ValueError, match="was warm-started on another set"):
        train.train(dataclasses.replace(shared, synthetic_args=wider, out_dir=str(tmp_path / "wider")))


@pytest.mark.parametrize("decay", [False, True])
def test_sft_lr_decay_lowers_the_warm_starts_learning_rate_linearly(tmp_path, monkeypatch, decay):
    lrs = []
    real = sft.optimizer_step
    monkeypatch.setattr(sft, "optimizer_step", lambda model, optimizer, lr, *args, **kwargs:
                        lrs.append(lr) or real(model, optimizer, lr, *args, **kwargs))
    train.train(tiny_config(tmp_path, sft_steps=4, sft_lr=1e-3, warmup_steps=2, max_steps=0,
                            sft_lr_decay=decay))
    ramp = [5e-4, 1e-3, 1e-3, 1e-3]  # the warm-up, then sft_lr
    expected = [lr * (1 - i / 4) for i, lr in enumerate(ramp)] if decay else ramp
    assert lrs == pytest.approx(expected)
