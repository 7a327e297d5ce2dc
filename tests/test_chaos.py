"""Issue 35's exactness under chaos, fast: a tiny run stopped once in each phase (warm start, rollout, update,
evaluation, checkpoint write, export), alternately by SIGTERM and SIGKILL, restarted with the same command each
time, ends with the weights and logs of an uninterrupted run. `python chaos.py` does it at length."""
import dataclasses
import os

import torch

import chaos
from test_guards import tiny


def test_a_run_stopped_in_every_phase_ends_as_an_uninterrupted_one(tmp_path):
    cfg = tiny(tmp_path / "unused", sft_steps=8, sft_batch_size=4, sft_checkpoint_every=3, max_steps=8, eval_every=2,
               checkpoint_every=2, sample_every=2)
    config = tmp_path / "tiny_config.py"
    config.write_text("".join(f"{key} = {value!r}\n" for key, value in dataclasses.asdict(cfg).items()
                              if key not in ("out_dir", "resume")))
    seconds = {"warm start": 0.005, "rollout": 0.005, "update": 0.005, "evaluation": 0.002, "checkpoint write": 0.0,
               "export": 0.005}
    result = chaos.chaos([str(config)], stops=6, seed=0, work=str(tmp_path), seconds=seconds)
    assert [phase for phase, _, _, _ in result["stops"]] == list(chaos.PHASES)
    assert [signal for _, signal, _, _ in result["stops"]] == ["SIGTERM", "SIGKILL"] * 3
    assert all(reached for _, _, _, reached in result["stops"]), result  # every stop reached the run
    assert result["differ"] == [], result


def test_same_run_names_a_checkpoint_of_another_size_instead_of_failing(tmp_path):
    """tools/same_runs.py --compare across a config that changed the model's depth (configs/demo_aha.py's 4 -> 3
    layers): the checkpoints differ in their keys, and same_run says so."""
    layer = {"w": torch.ones(2), "v": torch.zeros(3)}
    for name, layers in (("a", 2), ("b", 1)):
        os.makedirs(tmp_path / name)
        model = {f"layers.{i}.{k}": t for i in range(layers) for k, t in layer.items()}
        state = {i: {"exp_avg": torch.zeros(2), "step": torch.tensor(1.0)} for i in range(2 * layers)}
        torch.save({"model": model, "optimizer": {"state": state}, "step": 3}, tmp_path / name / "ckpt.pt")
    assert chaos.same_run(str(tmp_path / "a"), str(tmp_path / "b")) == ["ckpt.pt"]
    assert chaos.same_run(str(tmp_path / "a"), str(tmp_path / "a")) == []
