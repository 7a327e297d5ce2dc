"""records.py's curves: one run's figure, several runs on one figure, and the errors that name what is missing."""
import json

import pytest

from records import plot_runs, trailing_mean


def fake_run(out_dir, accuracy: float):
    out_dir.mkdir()
    with open(out_dir / "log.jsonl", "w") as f:
        for step in range(1, 6):
            f.write(json.dumps({"step": step, "accuracy": accuracy, "reward": accuracy, "response_length": 40.0}) + "\n")
    (out_dir / "eval.jsonl").write_text(json.dumps({"step": 0, "pass@1": accuracy}) + "\n")
    return str(out_dir)


def test_trailing_mean():
    assert trailing_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


def test_one_run_or_several_on_one_figure(tmp_path):
    pytest.importorskip("matplotlib")
    grpo, rft = fake_run(tmp_path / "grpo", 0.3), fake_run(tmp_path / "rft", 0.2)
    assert plot_runs([grpo]) == f"{grpo}/curves.png" and (tmp_path / "grpo" / "curves.png").stat().st_size > 0
    assert plot_runs([grpo, rft], str(tmp_path / "both.png")) == str(tmp_path / "both.png")
    assert (tmp_path / "both.png").stat().st_size > 0
    with pytest.raises(ValueError, match="several and the path of the figure"):
        plot_runs([grpo, rft])
    with pytest.raises(FileNotFoundError, match="no log.jsonl or eval.jsonl in .*missing"):
        plot_runs([grpo, str(tmp_path / "missing")], str(tmp_path / "x.png"))
