"""Issue 11's guards: a run is never lost or silently wrong, and a bad setting fails before any work."""
import json
import os
import signal

import pytest
import torch

import update
import rollout
import train
from model import ModelConfig, Transformer
from train import TrainConfig, load_config


def tiny(out_dir, **overrides) -> TrainConfig:
    """A char-level model on synthetic problems: a whole run takes a second or two."""
    return TrainConfig(**{**dict(
        model="scratch", tokenizer="char", template="plain", dataset="synthetic", synthetic_train_size=20,
        synthetic_eval_size=4, eval_size=4, synthetic_args={"max_operand": 9},
        model_args=dict(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, ffn_dim=32, max_seq_len=160),
        group_size=2, prompts_per_step=2, max_new_tokens=8, micro_batch_size=4, lr=1e-3, warmup_steps=1,
        max_steps=2, eval_every=0, sample_every=0, checkpoint_every=1, out_dir=str(out_dir), device="cpu"),
        **overrides})


def log_steps(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line)["step"] for line in f]


def saved_step(out_dir):
    return torch.load(os.path.join(out_dir, "ckpt.pt"), weights_only=True)["step"]


def test_rerun_without_resume_refuses_and_overwrite_starts_clean(tmp_path):
    train.train(tiny(tmp_path, eval_every=1))
    assert log_steps(tmp_path) == [1, 2] and os.path.isfile(tmp_path / "eval_00002.jsonl")
    with pytest.raises(FileExistsError, match=r"already holds a run \(ckpt.pt, .* and \d more\): add --resume .* --overwrite"):
        train.train(tiny(tmp_path))
    assert log_steps(tmp_path) == [1, 2] and saved_step(tmp_path) == 2  # untouched
    train.train(tiny(tmp_path, max_steps=1, overwrite=True))
    assert log_steps(tmp_path) == [1] and not os.path.exists(tmp_path / "eval_00002.jsonl")


def test_resume_keeps_the_checkpoint_config_and_allows_only_safe_changes(tmp_path):
    train.train(tiny(tmp_path, beta=0.0))
    for change in (dict(lr=0.5), dict(group_size=4), dict(beta=0.04), dict(synthetic_train_size=30)):
        key = next(iter(change))
        with pytest.raises(ValueError, match=f"--resume keeps the settings .*changes {key}="):
            train.train(tiny(tmp_path, **{"beta": 0.0, "resume": True, "max_steps": 3, **change}))
    assert log_steps(tmp_path) == [1, 2]
    train.train(tiny(tmp_path, beta=0.0, resume=True, max_steps=3, eval_every=3, micro_batch_size=1))
    assert log_steps(tmp_path) == [1, 2, 3]
    with open(tmp_path / "config.json") as f:
        assert json.load(f)["beta"] == 0.0


@pytest.mark.parametrize("setting, message", [
    (dict(temperature=0.0), "temperature must be > 0"),
    (dict(temperature=-1.0), "temperature must be > 0"),
    (dict(group_size=1), "baseline 'mean' needs group_size >= 2"),
    (dict(adv_baseline="none", adv_scale="std"), "scale='std' needs a baseline"),
    (dict(reward_weights={"correctness": 1.0, "lenght": 0.1}), "reward_weights must name rewards from"),
    (dict(reward_weights={}), "reward_weights must name rewards from"),
    (dict(model_args={"dimm": 16}), r"model_args has unknown key\(s\) \['dimm'\]"),
    (dict(synthetic_args={"max_operands": 9}), r"synthetic_args has unknown key\(s\) \['max_operands'\]"),
    (dict(checkpoint_every=-1), "checkpoint_every must be >= 0"),
    (dict(threads=-2), "threads must be >= 0"),
    (dict(eval_size=0, eval_every=5), "eval_size=0 with eval_every > 0"),
    (dict(tokenizer=""), "model='scratch' needs a tokenizer"),
    (dict(template="chatty"), "unknown prompt template 'chatty'"),
    (dict(resume=True, overwrite=True), "resume and overwrite exclude each other"),
    (dict(random_reward=0.3, method="rft"), "random_reward replaces the correctness reward of GRPO's samples"),
    (dict(random_reward=0.3, reward_weights={"format": 1.0}), "random_reward replaces the correctness reward"),
    (dict(kl_estimator="k1_reward", beta=0.1), "k1_reward' with adv_scale='std': in a group whose rewards are all"),
    (dict(kl_estimator="k1_reward", beta=0.1, adv_scale="none", supervision="process"),
     "k1_reward' puts the KL in the outcome rewards, which supervision='process' does not use"),
])
def test_every_setting_is_checked_when_the_config_loads(tmp_path, setting, message):
    with pytest.raises(ValueError, match=message):
        tiny(tmp_path, **setting)
    assert not os.path.exists(tmp_path / "log.jsonl")


def test_absurd_lr_stops_at_the_first_non_finite_gradient_and_keeps_the_last_good_checkpoint(tmp_path):
    with pytest.raises(FloatingPointError, match=r"step \d+: gradient norm is (nan|inf).*lower lr or grad_clip.*; "
                                                 r"stopped before the update, so .*keeps the last good weights") as info:
        train.train(tiny(tmp_path, lr=1e30, weight_decay=0.1, max_steps=6, checkpoint_every=0))  # decay blows up
    failed = int(str(info.value).split(":")[0].removeprefix("step "))
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert failed > 1 and state["step"] == failed - 1 == log_steps(tmp_path)[-1]  # the last complete step is kept
    assert all(torch.isfinite(t).all() for t in state["model"].values())


def test_ctrl_c_finishes_the_step_saves_and_resumes(tmp_path, monkeypatch):
    real_step, handler = train.grpo_step, signal.getsignal(signal.SIGINT)  # SIG_IGN when pytest runs in the background

    def step_then_ctrl_c(run, cfg, step):
        out = real_step(run, cfg, step)
        if step == 2:
            signal.raise_signal(signal.SIGINT)  # as if the user pressed Ctrl-C during step 2
        return out
    monkeypatch.setattr(train, "grpo_step", step_then_ctrl_c)
    summary = train.train(tiny(tmp_path, max_steps=5, checkpoint_every=0))
    assert summary["interrupted"] and summary["step"] == 2
    assert saved_step(tmp_path) == 2 and log_steps(tmp_path) == [1, 2]
    monkeypatch.setattr(train, "grpo_step", real_step)
    assert signal.getsignal(signal.SIGINT) is handler  # the handler was put back
    train.train(tiny(tmp_path, max_steps=3, checkpoint_every=0, resume=True))
    assert log_steps(tmp_path) == [1, 2, 3]


def test_empty_data_is_named_before_any_work(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("")
    (data / "test.jsonl").write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n")
    with pytest.raises(ValueError, match=r"train.jsonl is empty"):
        train.train(tiny(tmp_path / "out", dataset="gsm8k", data_dir=str(data)))


def test_reward_without_correctness_still_logs_accuracy(tmp_path):
    train.train(tiny(tmp_path, reward_weights={"format": 1.0}, sample_every=1))
    with open(tmp_path / "log.jsonl") as f:
        record = json.loads(f.readline())
    assert 0 <= record["accuracy"] <= 1 and "reward_correctness" not in record and "reward_format" in record


def test_checkpoint_every_zero_saves_only_at_the_end(tmp_path):
    train.train(tiny(tmp_path, checkpoint_every=0, max_steps=3))
    assert saved_step(tmp_path) == 3


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", "dict"])
def test_a_damaged_checkpoint_is_named(tmp_path, content):
    train.train(tiny(tmp_path, max_steps=1))
    if content == "dict":
        torch.save({"model": {}}, tmp_path / "ckpt.pt")
    else:
        (tmp_path / "ckpt.pt").write_bytes(content)
    with pytest.raises(ValueError, match=r"checkpoint .*ckpt.pt (cannot be read|is not a train.py checkpoint)"):
        train.train(tiny(tmp_path, max_steps=2, resume=True))


def test_a_torn_last_log_line_does_not_block_resume(tmp_path):
    train.train(tiny(tmp_path, max_steps=2))
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write('{"step": 3, "rew')  # killed mid-write
    train.train(tiny(tmp_path, max_steps=3, resume=True))
    assert log_steps(tmp_path) == [1, 2, 3]


def test_missing_model_dir_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        train.train(tiny(tmp_path, model=str(tmp_path / "no" / "such" / "dir"), model_args={}))


def test_help_lists_the_keys_on_stdout_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_config(["configs/demo.py", "--help"])
    assert exit_info.value.code == 0  # `python train.py --help | less` works
    printed = capsys.readouterr()
    assert "--group_size=8" in printed.out and "--resume=False" in printed.out
    assert printed.err == ""


def test_eval_cli_rejects_bad_arguments(tmp_path, capsys):
    import eval as eval_cli
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n")
    for argv, message in ((["--limit", "-5"], "--limit >= 0"), (["--k", "1,x"], "comma-separated whole numbers"),
                          (["--n", "2", "--k", "3"], "every k between 1 and n=2")):
        with pytest.raises(SystemExit):
            eval_cli.main(["--model", "x.pt", "--data", str(data)] + argv)
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        eval_cli.main(["--model", "x.pt", "--data", str(tmp_path / "missing.jsonl")])
    err = capsys.readouterr().err
    assert "missing.jsonl: no such file" in err and "data.py gsm8k" not in err


def test_sampled_pass_at_k_does_not_depend_on_the_batch_size(tmp_path):
    from data import synthetic_problems
    from template import CharTokenizer
    from eval import evaluate
    from model import ModelConfig, Transformer
    from rollout import Scoring, sampling_of
    from template import template_of
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=len(CharTokenizer()), dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                    head_dim=16, ffn_dim=64, max_seq_len=160))
    problems = synthetic_problems(6, seed=3, max_operand=9)

    def completions(batch_size, seed):
        path = tmp_path / f"{batch_size}_{seed}.jsonl"
        plain = template_of("plain")
        evaluate(model, CharTokenizer(), problems, sampling_of(CharTokenizer(), plain, 10, 1.0), Scoring(plain, {}),
                 n=4, ks=(1, 4), batch_size=batch_size, seed=seed, progress=False, out_path=str(path))
        return path.read_text()
    assert completions(4, seed=5) == completions(24, seed=5)  # each question's samples keep their seeds
    assert completions(4, seed=5) != completions(4, seed=6)


def reward_first_token_parity(monkeypatch):
    """A random model earns no real reward, so no gradient: give the groups a signal (first token id even)."""
    real = rollout.sample_and_score

    def parity_reward(*args, **kwargs):
        samples = real(*args, **kwargs)
        samples.rewards = [float(c[0] % 2) for c in samples.completions]
        return samples
    monkeypatch.setattr(rollout, "sample_and_score", parity_reward)


def test_lora_run_trains_only_adapters_resumes_exactly_and_exports(tmp_path, monkeypatch):
    from model import Transformer
    reward_first_token_parity(monkeypatch)
    lora = dict(lora_rank=4, lora_targets=("q_proj", "v_proj", "gate_proj"), beta=0.1, lr=1e-2)
    straight, split = tmp_path / "straight", tmp_path / "split"
    train.train(tiny(straight, max_steps=3, **lora))
    train.train(tiny(split, max_steps=2, **lora))
    train.train(tiny(split, max_steps=3, resume=True, **lora))
    ends = [torch.load(d / "ckpt.pt", weights_only=True) for d in (straight, split)]
    assert ends[0]["model"].keys() == ends[1]["model"].keys()
    for name, tensor in ends[0]["model"].items():
        assert torch.equal(tensor, ends[1]["model"][name]), name
    assert ends[0]["reference"] is None  # no second copy: the reference is the policy with its adapters off
    adapters = [n for n in ends[0]["model"] if "lora_" in n]
    assert len(adapters) == 2 * 3 and {k for s in ends[0]["optimizer"]["state"].values() for k in s}
    assert len(ends[0]["optimizer"]["state"]) == len(adapters)  # AdamW holds state for the adapters only
    with open(straight / "log.jsonl") as f:
        assert json.loads(f.readlines()[-1])["kl"] > 0  # the adapters moved the policy away from the base

    exported = Transformer.from_pretrained(str(straight / "hf"))
    from checkpoint import read_checkpoint, model_from_checkpoint
    policy = model_from_checkpoint(read_checkpoint(str(straight / "ckpt.pt")))
    ids = torch.randint(3, 90, (2, 12))
    with torch.no_grad():
        assert torch.allclose(exported(ids), policy(ids), atol=1e-5)
        with policy.adapters_disabled():
            assert not torch.allclose(exported(ids), policy(ids), atol=1e-5)


def test_a_checkpoint_saved_under_old_key_names_is_refused_naming_them(tmp_path):
    """No renamed-key shims: a checkpoint whose config has a key this code does not know was written by other code;
    --resume refuses it, naming the key, instead of resuming with that key's setting dropped."""
    train.train(tiny(tmp_path, max_steps=1))
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    state["config"]["algorithm"] = state["config"].pop("method")  # as a run from before the rename saved it
    torch.save(state, tmp_path / "ckpt.pt")
    with pytest.raises(ValueError, match=r"written by other code: its config has key\(s\) \['algorithm'\]"):
        train.train(tiny(tmp_path, max_steps=2, resume=True))
    assert log_steps(tmp_path) == [1]


def test_an_exception_inside_a_step_saves_the_last_complete_step_and_resume_redoes_it(tmp_path, monkeypatch):
    """A reward that raises in step 3 (after two complete steps, no periodic checkpoint): ckpt.pt holds step 2 with
    the question order of step 2's end, so --resume redoes step 3 and ends where an uninterrupted run ends."""
    real, calls = rollout.sample_and_score, []

    def fails_in_step_3(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("reward server unreachable")
        return real(*args, **kwargs)
    monkeypatch.setattr(rollout, "sample_and_score", fails_in_step_3)
    with pytest.raises(RuntimeError, match="reward server unreachable"):
        train.train(tiny(tmp_path / "cut", max_steps=4, checkpoint_every=0))
    assert saved_step(tmp_path / "cut") == 2 and log_steps(tmp_path / "cut") == [1, 2]
    monkeypatch.setattr(rollout, "sample_and_score", real)
    train.train(tiny(tmp_path / "cut", max_steps=4, checkpoint_every=0, resume=True))
    train.train(tiny(tmp_path / "straight", max_steps=4, checkpoint_every=0))
    ends = [torch.load(tmp_path / d / "ckpt.pt", weights_only=True) for d in ("cut", "straight")]
    assert all(torch.equal(ends[0]["model"][k], ends[1]["model"][k]) for k in ends[1]["model"])
    assert log_steps(tmp_path / "cut") == [1, 2, 3, 4]


def test_a_failure_after_the_first_of_mu_updates_saves_nothing_new(tmp_path, monkeypatch):
    real, calls = update.optimizer_step, []

    def second_update_fails(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # step 2's second update (mu=2): its first already moved the weights
            raise FloatingPointError("gradient norm is nan")
        return real(*args, **kwargs)
    monkeypatch.setattr(update, "optimizer_step", second_update_fails)
    with pytest.raises(FloatingPointError, match="step 2: .*the step had updated the weights, so .*keeps the last "
                                                 "checkpoint written"):
        train.train(tiny(tmp_path, mu=2, max_steps=3, checkpoint_every=0))
    assert saved_step(tmp_path) == 0 and log_steps(tmp_path) == [1]


def test_the_step_leaves_the_sampler_and_scoring_checks_to_set_up(tmp_path, monkeypatch):
    """Issue 55: train.py checks every prompt, the stops, the memory and the reward names once, at set-up, so the
    step's (and its held-out evaluations') generate and score_completions skip their own checks (check=False); a
    direct call still makes them."""
    import rewards
    import sample
    calls = []
    monkeypatch.setattr(sample, "_check_request", lambda *args: calls.append("generate"))
    monkeypatch.setattr(rewards, "_check_scoring", lambda *args: calls.append("score"))
    train.train(tiny(tmp_path, max_steps=2, eval_every=1))
    assert calls == []
    model = Transformer(ModelConfig(vocab_size=11, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8,
                                    ffn_dim=32, max_seq_len=32))
    sample.generate(model, [[1, 2]], 2, seed=0)
    rewards.score_completions(["x"], ["1"], [False], {"format": 1.0})
    assert calls == ["generate", "score"]
