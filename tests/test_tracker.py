"""Issue 25: wandb and TensorBoard are optional; asked for, they get every log.jsonl and eval.jsonl record."""
import json
import sys
import types

import pytest

import config
import train
from test_guards import tiny


class FakeWandb(types.ModuleType):
    """Stands in for the wandb package: records init, log and finish."""

    def __init__(self):
        super().__init__("wandb")
        self.calls = []

    def init(self, **kwargs):
        self.calls.append(("init", kwargs))
        return self

    def log(self, values, step):
        self.calls.append(("log", step, values))

    def finish(self, exit_code=None):
        self.calls.append(("finish", exit_code))


def test_a_tracker_asked_for_but_missing_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "installed", lambda package: False)
    with pytest.raises(ValueError, match=r"wandb_project asks for wandb, which is not installed: pip install wandb"):
        tiny(tmp_path, wandb_project="nano")
    with pytest.raises(ValueError, match=r"tensorboard asks for tensorboard, which is not installed"):
        tiny(tmp_path, tensorboard=True)


def test_wandb_gets_every_record_and_a_resumed_run_goes_on_in_the_same_wandb_run(tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr(config, "installed", lambda package: True)
    train.train(tiny(tmp_path, max_steps=2, eval_every=2, wandb_project="nano"))
    init = fake.calls[0]
    assert init[0] == "init" and init[1]["project"] == "nano" and init[1]["resume"] == "allow"
    logged = [(step, values) for kind, *rest in fake.calls if kind == "log" for step, values in [rest]]
    with open(tmp_path / "log.jsonl") as f:
        steps = [json.loads(line) for line in f]
    assert [s for s, v in logged if "train/reward" in v] == [1, 2] and [s for s, v in logged if "eval/pass@1" in v] == [0, 2]
    assert logged[1][1]["train/reward"] == steps[0]["reward"] and fake.calls[-1] == ("finish", 0)
    train.train(tiny(tmp_path, max_steps=3, eval_every=0, wandb_project="nano", resume=True))
    assert [c for c in fake.calls if c[0] == "init"][1][1]["id"] == init[1]["id"]


def test_tensorboard_writes_scalars(tmp_path, monkeypatch):
    written = []

    class FakeWriter:
        def __init__(self, log_dir, purge_step=None):
            written.append(("dir", log_dir, purge_step))

        def add_scalar(self, key, value, step):
            written.append((key, value, step))

        def close(self):
            written.append(("closed",))
    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = FakeWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    monkeypatch.setattr(config, "installed", lambda package: True)
    train.train(tiny(tmp_path, max_steps=2, tensorboard=True))
    assert written[0] == ("dir", str(tmp_path / "tb"), None) and written[-1] == ("closed",)
    assert {(key, step) for key, _, step in written[1:-1]} >= {("train/reward", 1), ("train/kl", 2)}
    written.clear()
    train.train(tiny(tmp_path, max_steps=3, tensorboard=True, resume=True))  # points after step 2 are redone
    assert written[0] == ("dir", str(tmp_path / "tb"), 3) and {step for *_, step in written[1:-1]} == {3}
