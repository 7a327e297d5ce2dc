"""configs/demo_aha.py: re-checks and carry slips in the warm start (data.rework_solution, synthetic_split's
reflect_share, cue_share, reflect_error and carry_slip) and the reflection metric (rewards.reflects, reflect_rate in
the log and in eval summaries, the markers a config value)."""
import random

import pytest

from data import (carries, chain_key, count_check, has_worked_solution, rework_solution, synthetic_problem,
                  synthetic_split)
from config import TrainConfig, validate
from eval import summarize
from records import accuracy_metrics
from rewards import arithmetic_claims, reflects
from rollout import Samples
from sft import sft_text
from template import template_of

ARGS = dict(warm_size=2000, rl_size=300, heldout_size=100, warm_ops=(1, 4), warm_mix="any", rl_ops=(3, 4),
            rl_mix="any", max_operand=5, max_start=20)


def test_count_check_counts_one_at_a_time_in_true_steps():
    assert count_check("30-4") == "30-4=29-3=28-2=27-1=26"
    assert count_check("26+3") == "26+3=27+2=28+1=29"
    assert count_check("7-1") == "7-1=6" and count_check("-3+2") == "-3+2=-2+1=-1"
    assert count_check("-3-2") == "-3-2=-4-1=-5"
    assert all(correct for _, correct in arithmetic_claims(count_check("19+5")))


def test_a_checked_solution_keeps_its_answer_and_corrects_every_slip():
    rng = random.Random(0)
    for _ in range(300):
        row = synthetic_problem(rng, 1, 4, 5, 20, restate=True)
        checked = rework_solution(row, rng, check=True, error_rate=0.3, carry_slip=1.0)
        assert checked["gold"] == row["gold"] and checked["question"] == row["question"]
        assert reflects(checked["solution"])
        for plain, line in zip(row["solution"].splitlines(), checked["solution"].splitlines()):
            if plain.startswith("####"):
                assert line == plain
                continue
            clause, result = plain.split(": ")[0], plain.rpartition("=")[2]
            assert line.startswith(clause + ": ") and line.endswith("=" + result)  # its clause, its right result
            claims = arithmetic_claims(line)
            expression = plain.split(": ")[1].split("=")[0]
            op = "+" if "+" in expression else "-"
            if " wait, " in line:  # the slip, then the check: only the slip is false
                wrong = line.split(" wait, ")[1].split(" is wrong")[0]
                assert line.split(" wait, ")[0].endswith("=" + wrong) and wrong != result
                assert [c for _, c in claims] == [False] + [True] * (len(claims) - 1)
            else:
                assert " check " in line and all(c for _, c in claims)
                start, amount = map(int, expression.split(op))
                assert not carries(start, op, amount)  # carry_slip 1: every carry was slipped, then corrected


def test_an_unchecked_solution_keeps_its_carry_slips_and_their_answer():
    rng = random.Random(1)
    assert carries(17, "+", 5) and carries(23, "-", 5) and not carries(13, "+", 5) and not carries(9, "-", 5)
    for _ in range(300):
        row = synthetic_problem(rng, 1, 4, 5, 20, restate=True)
        sloppy = rework_solution(row, rng, check=False, carry_slip=1.0)
        total = int(chain_key(row["question"]).split("+")[0].split("-")[0])
        for line in sloppy["solution"].splitlines()[:-1]:
            expression, result = line.split(": ")[1].split("=")
            op = "+" if "+" in expression else "-"
            start, _, amount = expression.rpartition(op)  # a slipped total may go below 0: "2-5=-3", "-3+4=1"
            start, amount = int(start), int(amount)
            assert start == total  # each line goes on from the last one's (maybe slipped) result
            right = start + amount if op == "+" else start - amount
            assert int(result) == (right + (-10 if op == "+" else 10) if carries(start, op, amount) else right)
            total = int(result)
        assert sloppy["gold"] == str(total) and sloppy["solution"].endswith(f"#### {total}")
        assert rework_solution(row, rng, check=False) == row  # no slips: the same row


def test_cued_warm_problems_recheck_and_the_rest_rarely():
    plain = synthetic_split(7, **ARGS)
    warm, rl, heldout = split = synthetic_split(7, reflect_share=0.1, cue_share=0.5, reflect_error=0.3, **ARGS)
    assert synthetic_split(7, reflect_share=0.3, cue_share=0.5, carry_slip=1.0, **ARGS)  # checks after a slip below 0
    assert split == synthetic_split(7, reflect_share=0.1, cue_share=0.5, reflect_error=0.3, **ARGS)  # seeded
    assert (rl, heldout) == plain[1:]  # the coins change no RL or held-out row: they are never cued
    cued = [row for row in warm if row["question"].startswith("Check each step. ")]
    others = [row for row in warm if not row["question"].startswith("Check each step. ")]
    assert all(reflects(sft_text(row)) for row in cued) and 0.45 < len(cued) / len(warm) < 0.55
    assert 0.07 < sum(reflects(sft_text(row)) for row in others) / len(others) < 0.13
    assert all(all(map(reflects, row["solution"].splitlines()[:-1])) for row in others if reflects(row["solution"]))
    assert [row["gold"] for row in warm] == [row["gold"] for row in plain[0]]  # no carry slips: right answers
    assert synthetic_split(7, reflect_share=0.0, cue_share=0.0, **ARGS) == plain  # no coin drawn
    mixed = synthetic_split(7, direct_share=0.5, cue_share=0.5, **ARGS)[0]  # answer-only rows are never cued
    assert all(has_worked_solution(row) for row in mixed if row["question"].startswith("Check each"))
    with pytest.raises(ValueError, match="must be in"):
        synthetic_split(7, cue_share=1.5, **ARGS)


def test_unasked_questions_are_the_same_problems_without_their_last_sentence():
    args = dict(reflect_share=0.1, cue_share=0.5, carry_slip=1.0, **ARGS)
    asked, unasked = synthetic_split(7, **args), synthetic_split(7, ask=False, **args)
    for rows, short in zip(asked, unasked):
        assert [{**row, "question": ""} for row in rows] == [{**row, "question": ""} for row in short]
        for row, cut in zip(rows, short):  # "... and sells 2. How many coins does Mia have?" -> "... and sells 2."
            kept, _, last = row["question"].rpartition(". ")
            assert cut["question"] == kept + "." and last.startswith("How many ") and last.endswith(" have?")
            assert chain_key(cut["question"]) == chain_key(row["question"])
    with pytest.raises(ValueError, match="ask must be True or False, got 'no'"):
        synthetic_split(7, ask="no", **ARGS)


@pytest.mark.parametrize("text, expected", [
    ("gives away 4: 30-4=26 check 30-4=29-3=28-2=27-1=26", True),
    ("30-4=25 wait, 25 is wrong: 30-4=26", True), ("Let me re-check that.", True), ("Double-check: 3+4=7", True),
    ("VERIFY 3+4=7", True), ("checked 3+4=7", False), ("a checklist", False), ("3+4=7</think> check", False),
    ("gives away 4: 30-4=26", False), ("awaited 3+4=7", False),
    # real-model text (Qwen-style): the markers are English phrases, not the demo's alone
    ("So x = 12.\n\nWait, that can't be right. Let me recompute: 3*4 = 12.", True),
    ("Hmm, let me verify this by substituting back.", True), ("The answer is 12.", False)])
def test_reflects_matches_whole_marker_words_before_the_answer(text, expected):
    assert reflects(text) is expected


def test_reflects_reads_the_templates_think_section_and_the_markers_given():
    tags = template_of({"name": "", "think": ["<reasoning>", "</reasoning>"], "answer": ["<final>", "</final>"],
                        "prompt": "Q: {question}\nA: {think_open}"})
    assert reflects("3+4=7 wait, fine</reasoning> <final>7</final>", tags)
    assert not reflects("3+4=7</reasoning> wait <final>7</final>", tags)
    assert reflects("3+4=7 Hmm, 7</think>", markers=("hmm",)) and not reflects("3+4=7 wait</think>", markers=("hmm",))


def test_summarize_splits_accuracy_by_reflection():
    samples = [{"correct": c, "format": True, "worked": True, "reflect": r, "length": 10, "truncated": False}
               for c, r in ((True, True), (True, True), (False, True), (False, False))]
    result = summarize([{"samples": samples}], 4, (1,), 1.0)
    assert result["reflect_rate"] == 0.75 and result["accuracy_reflect"] == 2 / 3
    assert result["accuracy_unreflect"] == 0.0 and result["worked_rate"] == 1.0


def test_the_step_log_counts_reflective_completions_with_the_configs_markers():
    cfg = TrainConfig(reflection_markers=("hmm",), template="plain")
    samples = Samples(prompts=[[1]] * 4, completions=[[1, 2]] * 4, texts=[
        "3+4=7 hmm 7</think>", "3+4=7 wait</think>", "7</think>", "Hmm.</think>"], stopped=[True] * 4,
        logprobs=[[0.0, 0.0]] * 4, rewards=[1.0, 0.0, 0.0, 1.0],
        components={"correctness": [1.0, 0.0, 0.0, 1.0], "format": [1.0] * 4}, seconds_sampling=1.0,
        seconds_scoring=1.0)
    record = accuracy_metrics(samples, cfg, template_of(cfg.template))
    assert record["reflect_rate"] == 0.5 and record["worked_rate"] == 0.5 and record["accuracy"] == 0.5


@pytest.mark.parametrize("markers", [(), ("wait!",), "wait", ("",), (" wait",), ("double  check",)])
def test_unreadable_reflection_markers_are_refused(markers):
    with pytest.raises(ValueError, match="reflection_markers"):
        validate(TrainConfig(reflection_markers=markers))
