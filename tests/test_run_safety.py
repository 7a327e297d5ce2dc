"""Issue 24: a scheduler's SIGTERM, a crash, a second launch or an odd out_dir never costs a finished step or a foreign
file; every check runs before --overwrite deletes anything."""
import dataclasses
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest
import torch

import checkpoint
import sft
import train
from run_management import RunLock
from chaos import same_tensors
from conftest import ROOT
from data import load_gsm8k_file
from rewards import score_completions
from test_guards import log_steps, saved_step, tiny


def same_weights(a, b) -> bool:
    return same_tensors(*(torch.load(os.path.join(d, "ckpt.pt"), weights_only=True)["model"] for d in (a, b)))


def test_sigterm_mid_run_saves_the_last_logged_step_and_resume_ends_as_an_uninterrupted_run(tmp_path):
    """A real process gets SIGTERM after a few steps: it finishes the step, saves, says how to resume, exits 143."""
    config = tmp_path / "tiny.py"
    settings = {k: v for k, v in vars(tiny(tmp_path / "run", max_steps=400, checkpoint_every=0)).items()}
    config.write_text("".join(f"{k} = {v!r}\n" for k, v in settings.items()))
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), str(config)], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = tmp_path / "run" / "log.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.exists() and len(log.read_text().splitlines()) >= 3):
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, output
    assert "SIGTERM: stopping after the current step" in output and "--resume" in output
    steps = log_steps(tmp_path / "run")
    assert 3 <= steps[-1] < 400 and saved_step(tmp_path / "run") == steps[-1] and steps == list(range(1, steps[-1] + 1))
    end = steps[-1] + 2
    train.train(tiny(tmp_path / "run", max_steps=end, checkpoint_every=0, resume=True))
    train.train(tiny(tmp_path / "straight", max_steps=end, checkpoint_every=0))
    assert same_weights(tmp_path / "run", tmp_path / "straight") and log_steps(tmp_path / "run") == list(range(1, end + 1))


def test_a_signal_during_the_warm_start_saves_it_and_resume_goes_on_exactly(tmp_path, monkeypatch, capsys):
    real, calls, handler = sft.sft_loss_backward, [], signal.getsignal(signal.SIGTERM)

    def term_at_the_second_sft_step(*args):
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGTERM)
        return real(*args)
    monkeypatch.setattr(sft, "sft_loss_backward", term_at_the_second_sft_step)
    settings = dict(sft_steps=6, sft_batch_size=4, sft_checkpoint_every=4)
    summary = train.train(tiny(tmp_path / "run", **settings))
    assert summary["interrupted"] == "SIGTERM" and len(calls) == 2 and summary["step"] == 0
    out = capsys.readouterr().out
    assert f"SIGTERM: stopped after warm-start step 2; {tmp_path / 'run' / 'ckpt.pt'} holds it. Continue with: " in out
    assert out.rstrip().endswith("--resume") and signal.getsignal(signal.SIGTERM) is handler
    state = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)
    assert state["phase"] == "warm_start" and state["warm_step"] == 2 and state["step"] == 0
    with pytest.raises(FileExistsError, match="already holds a run .*add --resume"):
        train.train(tiny(tmp_path / "run", **settings))
    monkeypatch.setattr(sft, "sft_loss_backward", real)
    train.train(tiny(tmp_path / "run", **settings, resume=True))
    train.train(tiny(tmp_path / "straight", **settings))
    assert same_weights(tmp_path / "run", tmp_path / "straight") and log_steps(tmp_path / "run") == [1, 2]
    for name in ("sft_log.jsonl", "log.jsonl"):
        assert [{k: v for k, v in json.loads(line).items() if not k.startswith(("time_", "tokens_per_s"))}
                for line in open(tmp_path / "run" / name)] == \
            [{k: v for k, v in json.loads(line).items() if not k.startswith(("time_", "tokens_per_s"))}
             for line in open(tmp_path / "straight" / name)], name
    sft_weights = [torch.load(d / "sft.pt", weights_only=True)["model"] for d in (tmp_path / "run", tmp_path / "straight")]
    assert all(torch.equal(sft_weights[0][k], sft_weights[1][k]) for k in sft_weights[0])


def test_resume_starts_a_run_that_saved_nothing_and_refuses_another_runs_start(tmp_path):
    """--resume is the one command a scheduler reruns: with nothing saved it starts the run (in an empty out_dir, or
    one holding only this very config's start); another config's start is refused."""
    train.train(tiny(tmp_path / "fresh", resume=True))
    assert log_steps(tmp_path / "fresh") == [1, 2]
    (tmp_path / "begun").mkdir()
    cfg = tiny(tmp_path / "begun", sft_steps=4, sft_batch_size=4)
    (tmp_path / "begun" / "config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    (tmp_path / "begun" / "sft_log.jsonl").write_text('{"step": 1, "loss": 9.0}\n')  # killed before any save
    train.train(tiny(tmp_path / "begun", sft_steps=4, sft_batch_size=4, resume=True))
    assert [json.loads(line)["step"] for line in open(tmp_path / "begun" / "sft_log.jsonl")] == [1, 2, 3, 4]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps(dataclasses.asdict(tiny(tmp_path / "other", lr=0.5))))
    with pytest.raises(ValueError, match=r"--resume keeps the settings .*config.json was written with, .*lr=0.5 -> "):
        train.train(tiny(tmp_path / "other", resume=True))


def test_a_second_launch_refuses_at_once_naming_the_running_process(tmp_path):
    with RunLock(str(tmp_path)):  # as a running train.py holds it
        with pytest.raises(RuntimeError, match=rf"in use by a running train.py \(pid {os.getpid()} on .*\)"):
            train.train(tiny(tmp_path))
    assert not os.path.exists(tmp_path / "log.jsonl")
    train.train(tiny(tmp_path))  # released: the next run goes ahead
    assert not os.path.exists(tmp_path / "train.lock")  # a clean exit removes it


def test_a_lock_left_by_a_killed_run_is_taken_over_with_a_message(tmp_path, capsys):
    (tmp_path / "train.lock").write_text("pid 4242 on somewhere: train.py configs/demo.py")  # SIGKILL: never wiped
    train.train(tiny(tmp_path))
    assert "(pid 4242 on somewhere: train.py configs/demo.py) is gone without releasing it; taking over" in \
        capsys.readouterr().err
    assert log_steps(tmp_path) == [1, 2]


def test_a_refused_run_leaves_no_directory_behind(tmp_path):
    with pytest.raises(ValueError, match="no train.py config.json"):
        (tmp_path / "data").mkdir()
        (tmp_path / "data" / "heldout.jsonl").write_text("")  # someone's data, under a name a run writes
        train.train(tiny(tmp_path / "data"))
    assert sorted(os.listdir(tmp_path / "data")) == ["heldout.jsonl"]
    with pytest.raises(Exception):  # a check inside setup: the tokenizer
        train.train(tiny(tmp_path / "new", tokenizer=str(tmp_path / "no_such_tokenizer")))
    assert not os.path.exists(tmp_path / "new")


def test_an_out_dir_with_glob_characters_deletes_nothing_of_its_siblings(tmp_path):
    for name in ("exp1", "exp[1]"):
        train.train(tiny(tmp_path / name, eval_every=2))
    train.train(tiny(tmp_path / "exp[1]", overwrite=True, eval_every=2))
    train.train(tiny(tmp_path / "*", eval_every=2))
    train.train(tiny(tmp_path / "*", overwrite=True, eval_every=0))
    assert os.path.isfile(tmp_path / "exp1" / "eval_00002.jsonl") and os.path.isfile(tmp_path / "exp[1]" / "eval_00002.jsonl")
    assert not os.path.exists(tmp_path / "*" / "eval_00002.jsonl")


def test_a_model_directory_is_never_an_out_dir(tmp_path):
    train.train(tiny(tmp_path / "run"))
    model = str(tmp_path / "run" / "hf")
    config = (tmp_path / "run" / "hf" / "config.json").read_text()
    for out_dir in (model, model + "/", str(tmp_path / "run" / ".." / "run" / "hf")):
        with pytest.raises(ValueError, match="is the model's directory"):
            train.train(tiny(out_dir, model=model, model_args={}, overwrite=True))
    with pytest.raises(ValueError, match="hf holds config.json but no train.py config.json: not a run directory"):
        train.train(tiny(model, overwrite=True))  # the same directory, trained from scratch
    assert (tmp_path / "run" / "hf" / "config.json").read_text() == config
    with pytest.raises(ValueError, match="is the repository itself"):
        train.train(tiny(ROOT))
    with pytest.raises(ValueError, match="is a filesystem root"):
        train.train(tiny("/"))


def test_overwrite_deletes_only_the_runs_own_files(tmp_path):
    train.train(tiny(tmp_path))
    for name in ("notes.txt", "ckpt.pt.tmp"):
        (tmp_path / name).write_text("x")
    (tmp_path / "ckpt_eval").mkdir()
    (tmp_path / "ckpt_eval" / "summary.json").write_text("{}")
    train.train(tiny(tmp_path, max_steps=1, overwrite=True))
    assert (tmp_path / "notes.txt").read_text() == "x" and not os.path.exists(tmp_path / "ckpt_eval")
    assert not os.path.exists(tmp_path / "ckpt.pt.tmp") and log_steps(tmp_path) == [1]


@pytest.mark.parametrize("late", [dict(model_args=dict(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8,
                                                       ffn_dim=32, max_seq_len=40)),  # the context check
                                  dict(tokenizer="no/such/tokenizer_dir")])
def test_overwrite_deletes_nothing_when_a_later_check_fails(tmp_path, late):
    train.train(tiny(tmp_path, eval_every=2))
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(Exception):
        train.train(tiny(tmp_path, overwrite=True, **late))
    assert sorted(os.listdir(tmp_path)) == before and log_steps(tmp_path) == [1, 2] and saved_step(tmp_path) == 2


def test_a_moved_run_resumes_from_its_new_place(tmp_path):
    train.train(tiny(tmp_path / "old", max_steps=2, checkpoint_every=0))
    os.rename(tmp_path / "old", tmp_path / "new")
    train.train(tiny(str(tmp_path / "new") + "/", max_steps=3, resume=True, checkpoint_every=0))
    train.train(tiny(tmp_path / "straight", max_steps=3, checkpoint_every=0))
    assert same_weights(tmp_path / "new", tmp_path / "straight") and log_steps(tmp_path / "new") == [1, 2, 3]


def test_resume_below_the_checkpoint_step_says_so(tmp_path):
    train.train(tiny(tmp_path, max_steps=2))
    with pytest.raises(ValueError, match=r"ckpt.pt is at step 2, beyond max_steps=1: nothing to do"):
        train.train(tiny(tmp_path, max_steps=1, resume=True))


def test_resuming_a_step_0_checkpoint_writes_one_step_0_evaluation(tmp_path):
    train.train(tiny(tmp_path, max_steps=0, eval_every=1))
    train.train(tiny(tmp_path, max_steps=1, eval_every=1, resume=True))
    with open(tmp_path / "eval.jsonl") as f:
        assert [json.loads(line)["step"] for line in f] == [0, 1]


def test_a_new_run_never_deletes_the_checkpoint_it_starts_from(tmp_path):
    train.train(tiny(tmp_path, max_steps=1))
    with pytest.raises(ValueError, match="init_from=.*ckpt.pt' lies in out_dir=.*whose run files a new run deletes"):
        train.train(tiny(tmp_path, init_from=str(tmp_path / "ckpt.pt"), overwrite=True))
    assert saved_step(tmp_path) == 1 and log_steps(tmp_path) == [1]


def test_a_warm_start_whose_checkpoint_is_gone_is_kept_without_overwrite(tmp_path):
    train.train(tiny(tmp_path, sft_steps=2, sft_batch_size=4, max_steps=0))
    os.remove(tmp_path / "ckpt.pt")  # to save disk, say
    with pytest.raises(FileExistsError, match=r"already holds a run \(.*sft.pt.*\): add --resume"):
        train.train(tiny(tmp_path, sft_steps=2, sft_batch_size=4))
    assert os.path.isfile(tmp_path / "sft.pt")


def test_a_failure_in_the_first_evaluation_keeps_the_warm_start_and_resume_evaluates_once(tmp_path, monkeypatch):
    real = train.held_out_eval

    def out_of_memory(*args):
        raise RuntimeError("CUDA out of memory (as if)")
    monkeypatch.setattr(train, "held_out_eval", out_of_memory)
    with pytest.raises(RuntimeError, match="out of memory"):
        train.train(tiny(tmp_path, sft_steps=2, sft_batch_size=4, eval_every=1))
    assert saved_step(tmp_path) == 0 and os.path.isfile(tmp_path / "sft.pt")  # the warm start is kept
    monkeypatch.setattr(train, "held_out_eval", real)
    train.train(tiny(tmp_path, sft_steps=2, sft_batch_size=4, eval_every=1, resume=True))
    with open(tmp_path / "eval.jsonl") as f:
        assert [json.loads(line)["step"] for line in f] == [0, 1, 2]


def test_a_signal_in_the_last_step_stops_nothing(tmp_path, monkeypatch):
    real = train.grpo_step

    def step_then_sigterm(run, cfg, step):
        out = real(run, cfg, step)
        if step == cfg.max_steps:
            signal.raise_signal(signal.SIGTERM)
        return out
    monkeypatch.setattr(train, "grpo_step", step_then_sigterm)
    summary = train.train(tiny(tmp_path, max_steps=2))
    assert summary["interrupted"] is False and summary["step"] == 2 and saved_step(tmp_path) == 2


def test_a_disk_too_small_for_the_runs_checkpoints_is_refused_before_any_work(tmp_path, monkeypatch):
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: usage._replace(free=10))
    with pytest.raises(OSError, match=r"disk too small: .* needs about \d.\d\d MB for this run's checkpoints \(ckpt.pt "
                                      r"\d.\d\d MB, .*and 0.00 MB is free there; free some space or choose another"):
        train.train(tiny(tmp_path / "run", max_steps=1))
    assert not os.path.exists(tmp_path / "run")  # nothing written


def test_the_disk_check_of_each_write_refuses_before_writing(tmp_path, monkeypatch):
    usage, calls = shutil.disk_usage(tmp_path), []

    def enough_for_the_preflight_only(path):
        calls.append(path)
        return usage if len(calls) == 1 else usage._replace(free=10)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", enough_for_the_preflight_only)
    with pytest.raises(OSError, match=r"disk full: .*ckpt.pt needs about \d.\d\d MB but 0.00 MB is free there"):
        train.train(tiny(tmp_path, max_steps=1))
    assert not os.path.exists(tmp_path / "ckpt.pt") and not os.path.exists(tmp_path / "ckpt.pt.tmp")


def test_a_failed_write_removes_its_temporary_file_and_says_disk_full(tmp_path, monkeypatch):
    train.train(tiny(tmp_path, max_steps=1))
    kept = (tmp_path / "ckpt.pt").read_bytes()
    usage = shutil.disk_usage(tmp_path)

    def full_disk(state, path):
        with open(path, "wb") as f:
            f.write(b"\0" * 1000)
        monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: usage._replace(free=0))
        raise RuntimeError("[enforce fail at inline_container.cc] . PytorchStreamWriter failed writing file: "
                           "basic_ios::clear: iostream error")
    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    with pytest.raises(OSError, match=r"disk full: writing .*ckpt.pt failed after 0.00 MB of about \d.\d\d MB, with "
                                      r"0.00 MB free there \(RuntimeError: .*iostream error\); the partial file is removed"):
        train.train(tiny(tmp_path, max_steps=2, resume=True))
    assert not os.path.exists(tmp_path / "ckpt.pt.tmp") and (tmp_path / "ckpt.pt").read_bytes() == kept


@pytest.mark.parametrize("setting, message", [
    (dict(model_args=dict(dim=0, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, ffn_dim=32, max_seq_len=160)),
     r"model sizes must be whole numbers >= 1, got dim=0"),
    (dict(model_args=dict(dim=-16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, ffn_dim=32, max_seq_len=160)),
     r"got dim=-16"),
    (dict(synthetic_args={"max_operand": -3}), r"max_operand >= 1"),
    (dict(dataset="synthetic_split", synthetic_args={"max_start": 0}), r"max_start >= 1"),
    (dict(synthetic_args={"max_operand": "9"}), r"config: "),
    (dict(out_dir=""), "out_dir is empty"),
])
def test_bad_sizes_are_named_when_the_config_loads(tmp_path, setting, message):
    with pytest.raises(ValueError, match=message):
        tiny(setting.pop("out_dir", tmp_path), **setting)


def test_a_data_row_without_a_question_is_named_and_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"question": "Tom has 3 apples.", "answer": "#### 3"}).encode() + b"\n")
    assert load_gsm8k_file(str(path))[0]["question"] == "Tom has 3 apples."
    path.write_text(json.dumps({"question": "q", "answer": "#### 3"}) + "\n" + json.dumps({"question": None, "answer": "#### 1"}))
    with pytest.raises(ValueError, match=r"rows.jsonl: row 2: 'question' must be non-empty text, got None"):
        load_gsm8k_file(str(path))


def test_a_reward_total_that_overflows_is_named(tmp_path):
    with pytest.raises(RuntimeError, match=r"weighted reward total is inf .*overflow"):
        score_completions(["<think>3</think> <answer>3</answer>"], ["3"], [False], {"correctness": 1e308, "format": 1e308})


def test_the_hf_export_of_a_char_run_evaluates_like_its_checkpoint(tmp_path):
    import eval as eval_cli
    train.train(tiny(tmp_path, eval_every=2))
    data = str(tmp_path / "heldout.jsonl")
    from_ckpt = eval_cli.main(["--model", str(tmp_path / "ckpt.pt"), "--data", data, "--out", str(tmp_path / "a")])
    from_hf = eval_cli.main(["--model", str(tmp_path / "hf"), "--data", data, "--template", "plain",
                             "--max_new_tokens", "8", "--out", str(tmp_path / "b")])
    assert from_hf["pass@1"] == from_ckpt["pass@1"] and from_hf["response_length"] == from_ckpt["response_length"]
    mode = stat.S_IMODE(os.stat(tmp_path / "hf" / "model.safetensors").st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask  # readable by the group and others, as the config.json beside it


def test_save_checkpoints_false_writes_no_checkpoint_and_says_so_when_stopped(tmp_path, monkeypatch, capsys):
    """Issue 42: a throwaway run (tools/bench.py's gsm8k_shapes wrote ~37 GB of checkpoints) writes its logs but no
    ckpt.pt, sft.pt or hf/, needs no disk for them, and a stop says nothing was saved; --resume is refused with it."""
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: usage._replace(free=10))  # room for logs only
    train.train(tiny(tmp_path / "run", sft_steps=2, sft_batch_size=4, max_steps=2, save_checkpoints=False))
    assert log_steps(tmp_path / "run") == [1, 2]
    assert not {"ckpt.pt", "sft.pt", "hf", "ckpt.pt.tmp"} & set(os.listdir(tmp_path / "run"))
    real = train.grpo_step

    def step_then_sigterm(run, cfg, step):
        out = real(run, cfg, step)
        signal.raise_signal(signal.SIGTERM)
        return out
    monkeypatch.setattr(train, "grpo_step", step_then_sigterm)
    summary = train.train(tiny(tmp_path / "stopped", max_steps=3, save_checkpoints=False))
    assert summary["interrupted"] == "SIGTERM" and summary["step"] == 1
    assert "SIGTERM: stopped after step 1; nothing was saved (save_checkpoints=False)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="save_checkpoints=False writes none"):
        tiny(tmp_path / "stopped", resume=True, save_checkpoints=False)
