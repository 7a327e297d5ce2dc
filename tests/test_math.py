"""MATH end to end: the answer checker a run selects (answer_checker) reaching correctness, the template check,
rollouts, training and eval.py; MATH-format data (MATH-500 shipped, the training set downloaded and verified, here
from a file:// URL); dataset="math" with its levels and its held-out problems kept out of training; eval.py's
breakdown by subject and level."""
import hashlib
import json
import os
import re
import sys

import pytest
import torch

import data
import eval as eval_py
import rollout
import train
from config import TrainConfig
from data import download_math, load_problem_file, load_problems, math_rows, problem_key, write_jsonl
from model import ModelConfig, Transformer
from answers import ANSWER_CHECKERS, MATH_FORMS, final_answer
from rewards import check_template, correctness_reward, score_completions
from rollout import Scoring, sampling_of
from sample import Rollout
from sft import sft_text
from template import CharTokenizer, template_of
from test_guards import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATH500_DIR = os.path.join(ROOT, "data", "math500")
MATH500 = os.path.join(MATH500_DIR, "test.jsonl")
PI_HALF = "</think> <answer>\\frac{\\pi}{2}</answer>"
X_11 = "</think> <answer>x = 11</answer>"


def math500_rows() -> list[dict]:
    with open(MATH500) as f:
        return [json.loads(line) for line in f]


def char_friendly(rows: list[dict], n: int) -> list[dict]:
    """n MATH-500 rows whose problem the character tokenizer encodes, short, with a whole-number answer."""
    alphabet = set(CharTokenizer.ALPHABET)
    return [r for r in rows if set(r["problem"]) <= alphabet and len(r["problem"]) <= 80 and r["answer"].isdigit()][:n]


def write_rows(rows: list[dict], path) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return str(path)

# -----------------------------------------------------------------------------
# the checker: by name, everywhere correctness is computed


def test_the_math_checker_credits_latex_spellings_and_the_gsm8k_one_stays_as_it_was():
    for gold in ("\\frac{\\pi}{2}", "\\dfrac{\\pi}{2}"):
        assert correctness_reward(PI_HALF, gold, answer_checker="math") == 1.0
    assert correctness_reward(X_11, "11", answer_checker="math") == 1.0
    assert correctness_reward(X_11, "11", answer_checker="gsm8k") == correctness_reward(X_11, "11") == 0.0
    assert correctness_reward(X_11, "12", answer_checker="math") == 0.0
    assert correctness_reward(X_11, "11", truncated=True, answer_checker="math") == 0.0
    # MATH's forms: the answer tag, \boxed{} (with or without the tag), "the answer is"; no "####", no last sentence
    assert MATH_FORMS == ("answer_tag", "boxed", "answer_is") == ANSWER_CHECKERS["math"].forms
    assert correctness_reward("so x is $\\boxed{\\frac{3}{4}}$.", "0.75", answer_checker="math") == 1.0
    assert correctness_reward("<answer>\\boxed{(3, -1)}</answer>", "(3,-1)", answer_checker="math") == 1.0
    assert correctness_reward("The answer is $\\sqrt{2}$.", "\\sqrt2", answer_checker="math") == 1.0
    assert correctness_reward("#### 5", "5", answer_checker="math") == 0.0 < correctness_reward("#### 5", "5")
    assert correctness_reward("The area is $4\\pi$.", "4\\pi", answer_checker="math") == 0.0  # no marker, no answer
    assert final_answer("The area is $\\pi r^2 = 4\\pi$.") == "r^2 = 4\\pi$."  # what last_sentence would read
    assert final_answer("The area is $\\pi r^2 = 4\\pi$.", answer_checker="math") is None
    with pytest.raises(ValueError, match="unknown answer_checker 'latex'"):
        correctness_reward(X_11, "11", answer_checker="latex")


def test_score_completions_passes_the_checker_to_the_rules_by_name():
    completions, golds = [PI_HALF, X_11], ["\\dfrac{\\pi}{2}", "11"]
    _, math = score_completions(completions, golds, [False] * 2, {"correctness": 1.0}, answer_checker="math")
    _, plain = score_completions(completions, golds, [False] * 2, {"correctness": 1.0})
    assert math["correctness"] == [1.0, 1.0] and plain["correctness"] == [1.0, 0.0]

    def reads_it(completion, gold, answer_checker):
        return float(answer_checker == "math")

    def everything(completion, gold, **info):
        return float("answer_checker" in info)
    _, parts = score_completions(completions, golds, [False] * 2, {"r": 1.0, "e": 1.0},
                                 functions={"r": reads_it, "e": everything}, answer_checker="math")
    assert parts["r"] == [1.0, 1.0] and parts["e"] == [1.0, 1.0]
    _, parts = score_completions(completions, golds, [False] * 2, {"r": 1.0, "e": 1.0},
                                 functions={"r": reads_it, "e": everything})  # not given: "gsm8k", not in **kwargs
    assert parts["r"] == [0.0, 0.0] and parts["e"] == [0.0, 0.0]
    with pytest.raises(ValueError, match="unknown answer_checker"):
        score_completions(completions, golds, [False] * 2, {"correctness": 1.0}, answer_checker="sympy")


def test_the_config_key_defaults_from_the_dataset_and_reaches_the_template_check():
    assert TrainConfig().answer_checker == "gsm8k" and TrainConfig().eval_data_dir == ""
    cfg = TrainConfig(dataset="math")
    assert (cfg.answer_checker, cfg.data_dir, cfg.eval_data_dir, cfg.math_levels) == \
        ("math", "data/math", "data/math500", (3, 4, 5))
    cfg = TrainConfig(dataset="math", answer_checker="gsm8k", data_dir="mine", eval_data_dir="held")
    assert (cfg.answer_checker, cfg.data_dir, cfg.eval_data_dir) == ("gsm8k", "mine", "held")
    assert TrainConfig(dataset="gsm8k", answer_checker="math").answer_checker == "math"
    with pytest.raises(ValueError, match=r"answer_checker must be one of \('auto'"):
        TrainConfig(answer_checker="sympy")
    with pytest.raises(ValueError, match="math_levels must be MATH levels"):
        TrainConfig(dataset="math", math_levels=(0, 3))
    check_template(template_of("r1_zero"), "math")  # a worked and a direct answer in its tags read under MATH's too
    with pytest.raises(ValueError, match="unknown answer_checker"):
        check_template(template_of("r1_zero"), "sympy")

# -----------------------------------------------------------------------------
# MATH-format data


def test_math500_reads_as_math_rows_and_round_trips():
    rows = load_problem_file(MATH500)
    assert len(rows) == 500 and len({problem_key(r["question"]) for r in rows}) == 500
    assert set(rows[0]) == {"question", "solution", "gold", "subject", "level", "unique_id"}
    assert rows[0]["gold"] == "\\left( 3, \\frac{\\pi}{2} \\right)" and rows[0]["level"] == 2
    assert sorted({r["level"] for r in rows}) == [1, 2, 3, 4, 5] and len({r["subject"] for r in rows}) == 7


def test_math_rows_written_by_a_run_read_back_and_original_math_files_read_too(tmp_path):
    rows = load_problem_file(MATH500)[:5]
    write_jsonl(rows, str(tmp_path / "heldout.jsonl"))
    assert load_problem_file(str(tmp_path / "heldout.jsonl")) == rows
    assert set(json.loads(open(tmp_path / "heldout.jsonl").readline())) == \
        {"problem", "solution", "answer", "subject", "level", "unique_id"}
    original = [{"problem": "What is $1+1$?", "level": "Level 2", "type": "Algebra",
                 "solution": "We add: $1+1=\\boxed{2}$."}]  # MATH's own format: the gold is the last \boxed{}
    assert math_rows(original, "x.jsonl")[0] == {"question": "What is $1+1$?", "solution": original[0]["solution"],
                                                 "gold": "2", "subject": "Algebra", "level": 2, "unique_id": ""}
    assert [r["level"] for r in math_rows([{"problem": "p", "answer": "1", "level": level} for level in
                                           ("Level ?", None, 0, "Level 5", 4)], "x.jsonl")] == [None, None, None, 5, 4]
    unanswered = [{"problem": "p", "answer": "1", "level": 1}, {"problem": "p", "solution": "no box", "level": 1}]
    with pytest.raises(ValueError, match=re.escape("x.jsonl: row 2: 'answer' must be non-empty")):
        math_rows(unanswered, "x.jsonl")
    assert len(math_rows(unanswered, "x.jsonl", skip_unanswered=True)) == 1
    assert sft_text(rows[0]) == rows[0]["solution"].strip() + "</think> <answer>" + rows[0]["gold"] + "</answer>"


def training_file(tmp_path) -> tuple[str, str, list[dict]]:
    """A small file in PRM800K's format (file path, its sha256, its rows): ten made-up problems of levels 1-5, one
    MATH-500 problem (level 5) spaced differently, as a copy in another split would be, one of level 4 without an
    answer and one of an unknown level (MATH has two of "Level ?")."""
    own = [{"problem": f"What is ${i} + {i}$?", "solution": f"${i} + {i} = \\boxed{{{2 * i}}}$.", "answer": str(2 * i),
            "subject": "Prealgebra", "level": 1 + i % 5, "unique_id": f"train/prealgebra/{i}.json"} for i in range(10)]
    held = next(r for r in math500_rows() if r["level"] == 5)
    copy = dict(held, problem="  " + held["problem"].replace(" ", "\n", 1), unique_id="train/copy/1.json")
    odd = [dict(own[3], answer="", unique_id="train/odd/1.json"), dict(own[2], level="Level ?", unique_id="train/odd/2.json")]
    path = write_rows(own + [copy] + odd, tmp_path / "upstream" / "train.jsonl")
    return path, hashlib.sha256(open(path, "rb").read()).hexdigest(), own + [copy] + odd


def test_download_math_verifies_writes_atomically_and_says_what_to_do_offline(tmp_path):
    path, sha256, _ = training_file(tmp_path)
    download_math(str(tmp_path / "good"), url="file://" + path, sha256=sha256)
    assert open(tmp_path / "good" / "train.jsonl", "rb").read() == open(path, "rb").read()
    assert "MIT" in (tmp_path / "good" / "SOURCE_AND_LICENSE.txt").read_text()
    with pytest.raises(ValueError, match="sha256 is .*, expected 0+; the download is corrupt or changed"):
        download_math(str(tmp_path / "tampered"), url="file://" + path, sha256="0" * 64)
    assert not os.path.exists(tmp_path / "tampered")  # neither the file nor a temporary
    missing = str(tmp_path / "nowhere" / "train.jsonl")
    with pytest.raises(FileNotFoundError, match=re.escape(f"file://{missing}") + ".*Offline: download that file on a "
                       "machine with a network .* copy it to .*train.jsonl; its sha256 must be " + sha256):
        download_math(str(tmp_path / "offline"), url="file://" + missing, sha256=sha256)
    pointer = write_rows([], tmp_path / "lfs" / "train.jsonl")
    with open(pointer, "w") as f:
        f.write("version https://git-lfs.github.com/spec/v1\noid sha256:" + sha256 + "\nsize 1\n")
    with pytest.raises(ValueError, match="gave a Git LFS pointer, not the file"):
        download_math(str(tmp_path / "lfs_out"), url="file://" + pointer, sha256=sha256)
    assert data.MATH_TRAIN_SHA256 == "90d96daeac3fe343ebb1e22ce93dd99690f75983e957f88de42f87cffe1e8076"
    assert data.MATH_TRAIN_URL.startswith("https://github.com/openai/prm800k/raw/7ecc794703b2877f63226f2477a49b")


def test_dataset_math_downloads_on_first_use_keeps_its_levels_and_drops_held_out_problems(tmp_path, monkeypatch,
                                                                                         capsys):
    path, sha256, rows = training_file(tmp_path)
    monkeypatch.setattr(data, "MATH_TRAIN_URL", "file://" + path)
    monkeypatch.setattr(data, "MATH_TRAIN_SHA256", sha256)
    cfg = TrainConfig(dataset="math", data_dir=str(tmp_path / "math"), eval_data_dir=MATH500_DIR, eval_size=2,
                      sft_steps=10)  # a warm start would train on MATH's solutions
    warm, problems, heldout = load_problems(cfg)  # held out: the shipped MATH-500
    assert os.path.isfile(tmp_path / "math" / "train.jsonl") and warm is problems
    assert [p["unique_id"] for p in problems] == [f"train/prealgebra/{i}.json" for i in (2, 3, 4, 7, 8, 9)]
    assert len(heldout) == 2 and heldout[0]["unique_id"] == "test/precalculus/807.json"
    assert "6 of 13 problems (levels 3, 4, 5; 1 dropped as held-out problems; 1 without a gold answer left out)" in \
        capsys.readouterr().err
    monkeypatch.setattr(data, "MATH_TRAIN_URL", "file:///nowhere")  # the file is there now: no second download
    every = load_problems(TrainConfig(dataset="math", data_dir=str(tmp_path / "math"), eval_data_dir=MATH500_DIR,
                                      math_levels=(1, 2, 3, 4, 5)))
    assert len(every[1]) == 10 and all(set(p) >= {"subject", "level"} for p in every[1])
    with pytest.raises(FileNotFoundError, match="nowhere/test.jsonl not found .*MATH-500 by default"):
        load_problems(TrainConfig(dataset="math", data_dir=str(tmp_path / "math"), eval_data_dir="nowhere"))
    with pytest.raises(FileNotFoundError, match="Offline: download that file"):
        load_problems(TrainConfig(dataset="math", data_dir=str(tmp_path / "empty"), eval_data_dir=MATH500_DIR))

# -----------------------------------------------------------------------------
# eval.py's breakdown, and the checker end to end through sampling, training and eval.py


def scripted(completions: dict[str, str]):
    """A stand-in for sample.generate: each prompt gets the completion of the question it holds, then eos."""
    tok = CharTokenizer()

    def generate(model, prompts, max_new_tokens, **kwargs):
        texts = [completions[max((q for q in completions if q in tok.decode(p)), key=len)] for p in prompts]
        ids = [tok.encode(text) + [tok.eos_token_id] for text in texts]
        n = max(map(len, ids))
        tokens = torch.tensor([row + [tok.pad_token_id] * (n - len(row)) for row in ids])
        return Rollout(tokens, torch.tensor([len(row) for row in ids]), torch.zeros(len(ids), n),
                       torch.ones(len(ids), dtype=torch.bool))
    return generate


def test_eval_scores_math_rows_with_the_chosen_checker_and_breaks_pass1_down(monkeypatch):
    rows = [{"question": "q one", "gold": "\\frac{\\pi}{2}", "subject": "Precalculus", "level": 2},
            {"question": "q two", "gold": "\\dfrac{\\pi}{2}", "subject": "Precalculus", "level": 5},
            {"question": "q three", "gold": "11", "subject": "Algebra", "level": 5}]
    monkeypatch.setattr(rollout, "generate", scripted({"q one": PI_HALF, "q two": PI_HALF, "q three": X_11}))
    model = Transformer(ModelConfig(vocab_size=len(CharTokenizer()), dim=8, n_layers=1, n_heads=1, n_kv_heads=1,
                                    head_dim=8, ffn_dim=8))  # a stand-in: the scripted generate writes the answers
    plain_template = template_of("plain")
    common = dict(model=model, tokenizer=CharTokenizer(), rows=rows, progress=False,
                  sampling=sampling_of(CharTokenizer(), plain_template, 512, 0.0))
    math = eval_py.evaluate(**common, scoring=Scoring(plain_template, {}, "math"))
    plain = eval_py.evaluate(**common, scoring=Scoring(plain_template, {}))
    assert math["pass@1"] == 1.0 and plain["pass@1"] == pytest.approx(2 / 3)
    assert plain["by_level"] == {"2": {"pass@1": 1.0, "pass@1_stderr": pytest.approx(float("nan"), nan_ok=True),
                                       "questions": 1},
                                 "5": {"pass@1": 0.5, "pass@1_stderr": 0.5, "questions": 2}}
    assert list(plain["by_subject"]) == ["Algebra", "Precalculus"] and plain["by_subject"]["Algebra"]["pass@1"] == 0
    assert eval_py.breakdown_lines(plain)[:3] == ["pass@1 by level:", "  level 2" + " " * 18 + "1.0000 ± nan  "
                                                  "(1 questions)", "  level 5" + " " * 18 + "0.5000 ± 0.5000  (2 questions)"]
    assert "by_level" not in eval_py.evaluate(**{**common, "rows": [{"question": "q one", "gold": "1"}]},
                                              scoring=Scoring(plain_template, {}))
    records = [{"level": level, "samples": [{"correct": c}]} for level, c in ((None, True), (5, False), (1, True))]
    assert list(eval_py.breakdown(records, 1, "level")) == ["1", "5", "?"]  # an unknown level last


def test_dataset_math_trains_and_evaluates_with_the_math_checker_end_to_end(tmp_path, monkeypatch, capsys):
    rows = char_friendly(math500_rows(), 16)
    train_rows, held_rows = rows[:12], rows[12:]
    write_rows(train_rows, tmp_path / "math" / "train.jsonl")
    write_rows(held_rows, tmp_path / "held" / "test.jsonl")
    settings = dict(dataset="math", data_dir=str(tmp_path / "math"), eval_data_dir=str(tmp_path / "held"),
                    math_levels=(1, 2, 3, 4, 5), synthetic_args={}, max_new_tokens=40, eval_every=1)
    # a policy that always answers "x = N": correct for the MATH checker, wrong for GSM8K's
    monkeypatch.setattr(rollout, "generate", scripted({r["problem"]: f"</think> <answer>x = {r['answer']}</answer>"
                                                       for r in rows}))
    train.train(tiny(tmp_path / "math_run", **settings))
    train.train(tiny(tmp_path / "gsm8k_run", **settings, answer_checker="gsm8k"))
    for run, accuracy in (("math_run", 1.0), ("gsm8k_run", 0.0)):
        log = [json.loads(line) for line in open(tmp_path / run / "log.jsonl")]
        evals = [json.loads(line) for line in open(tmp_path / run / "eval.jsonl")]
        assert [r["accuracy"] for r in log] == [accuracy] * 2 and [e["pass@1"] for e in evals] == [accuracy] * 3
        assert sum(level["questions"] for level in evals[0]["by_level"].values()) == 4 and "by_subject" in evals[0]
    config = json.load(open(tmp_path / "math_run" / "config.json"))
    assert config["answer_checker"] == "math" and config["eval_data_dir"] == str(tmp_path / "held")
    assert load_problem_file(str(tmp_path / "math_run" / "heldout.jsonl")) == load_problem_file(
        str(tmp_path / "held" / "test.jsonl"))  # heldout.jsonl is MATH-format: eval.py reads it as MATH
    monkeypatch.undo()  # eval.py samples from the tiny model itself
    capsys.readouterr()
    summary = eval_py.main(["--model", str(tmp_path / "math_run" / "ckpt.pt"), "--data",
                            str(tmp_path / "math_run" / "heldout.jsonl"), "--device", "cpu",
                            "--out", str(tmp_path / "ev")])
    printed = capsys.readouterr().out
    assert summary["answer_checker"] == "math" and "answer checker math" in printed
    assert "pass@1 by level:" in printed and "pass@1 by subject:" in printed
    saved = json.load(open(tmp_path / "ev" / "summary.json"))
    assert set(saved["by_level"]) == {str(r["level"]) for r in held_rows} and saved["questions"] == 4
    completion = json.loads(open(tmp_path / "ev" / "completions.jsonl").readline())
    assert {"subject", "level", "answer", "correct"} <= set(completion)
    chosen = eval_py.main(["--model", str(tmp_path / "math_run" / "ckpt.pt"), "--data",
                           str(tmp_path / "math_run" / "heldout.jsonl"), "--device", "cpu", "--answer_checker",
                           "gsm8k", "--out", str(tmp_path / "ev2")])
    assert chosen["answer_checker"] == "gsm8k" and "by_level" in chosen


def test_eval_grades_with_math_verify_beside_the_checker_when_asked(monkeypatch):
    """Issue 43: --grader math_verify|both scores every completion with Math-Verify too (the grader SimpleRL-Zoo and
    Oat-Zero report with), its pass@1 beside the checker's and the share on which they agree. Answers in the tags
    are read from the last answer tag (Math-Verify alone would take 72 from the think block below)."""
    pytest.importorskip("math_verify", reason="the Math-Verify grader needs pip install math-verify (optional)")
    rows = [{"question": "q one", "gold": "\\frac{\\pi}{2}"}, {"question": "q two", "gold": "73"},
            {"question": "q three", "gold": "11"}]
    answers = {"q one": "3*24=72</think> <answer>\\dfrac{\\pi}{2}</answer>",
               "q two": "3*24=72</think> <answer>73</answer>",
               "q three": "3*24=72</think> <answer>\\boxed{x = 11}</answer>"}
    monkeypatch.setattr(rollout, "generate", scripted(answers))
    model = Transformer(ModelConfig(vocab_size=len(CharTokenizer()), dim=8, n_layers=1, n_heads=1, n_kv_heads=1,
                                    head_dim=8, ffn_dim=8))
    plain_template = template_of("plain")
    summary = eval_py.evaluate(model, CharTokenizer(), rows, sampling_of(CharTokenizer(), plain_template, 512, 0.0),
                               Scoring(plain_template, {}), progress=False, math_verify=eval_py.math_verify_grader())
    # the GSM8K checker reads numbers: pi/2 is not one, 73 and "x = 11" in a box are right
    assert summary["pass@1"] == pytest.approx(2 / 3) and summary["pass@1_math_verify"] == 1.0
    assert summary["graders_agree"] == pytest.approx(2 / 3)


def test_the_math_verify_grader_without_its_package_is_refused_before_any_work(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # as if not installed
    with pytest.raises(RuntimeError, match="--grader math_verify needs the math-verify package: pip install"):
        eval_py.main(["--model", "nowhere/model", "--data", "data/math500/test.jsonl", "--grader", "both",
                      "--out", str(tmp_path / "eval")])
    assert not (tmp_path / "eval").exists()
