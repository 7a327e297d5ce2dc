import json
import os
import time

import pytest

from conftest import ROOT
from rewards import (REWARD_FUNCTIONS, correctness_reward, extract_answer, format_reward, gold_from_solution,
                     is_equiv, score_completions)

GSM8K_DIR = os.path.join(ROOT, "..", "shared", "data", "gsm8k")


def tagged(answer, think="Let me compute 3 + 4 = 7 and 12 * 6 = 72."):
    return f"<think>{think}</think> <answer>{answer}</answer>"


def test_every_gsm8k_solution_scores_against_its_own_answer_only():
    paths = [os.path.join(GSM8K_DIR, f"{split}.jsonl") for split in ("train", "test")]
    if not all(os.path.exists(path) for path in paths):
        pytest.skip(f"GSM8K data not found in {GSM8K_DIR}")
    solutions = [json.loads(line)["answer"] for path in paths for line in open(path)]
    assert len(solutions) == 8792
    for solution in solutions:
        gold = gold_from_solution(solution)
        wrong = str(int(gold.replace(",", "")) + 1)
        assert correctness_reward(solution, gold) == 1.0, solution
        assert correctness_reward(solution, wrong) == 0.0, solution


@pytest.mark.parametrize("pred, gold, expected", [
    ("72", "72", True),
    ("1,000", "1000", True),
    ("1000", "1,000", True),
    ("1.000", "1", True),
    ("1.000", "1000", False),
    ("1,00", "100", False),
    ("12,34", "1234", False),
    ("$18", "18", True),
    ("\\$18.00", "18", True),
    ("18 dollars", "18", True),
    ("18 apples.", "18", True),
    ("18cm", "18", True),
    ("\\text{18 dollars}", "18", True),
    ("50%", "50", True),
    ("50\\%", "50", True),
    ("18.0", "18", True),
    ("18.50", "18.5", True),
    ("+5", "5", True),
    ("-5", "5", False),
    ("\u22125", "-5", True),
    ("-$5", "-5", True),
    ("12", "120", False),
    ("120", "12", False),
    ("3/4", "0.75", True),
    ("0.5", "1/2", True),
    ("\\frac{1}{2}", "0.5", True),
    ("\\dfrac{3}{4}", "3/4", True),
    ("\\tfrac{3}{4}", "0.75", True),
    ("-\\frac{1}{2}", "-0.5", True),
    ("2 1/2", "2.5", True),
    ("2\\frac{1}{2}", "5/2", True),
    ("0.333", "1/3", False),
    ("1/0", "0", False),
    ("1, 2, 3", "1", False),
    ("3 or 4", "3", False),
    ("3 or 4", "4", False),
    ("18 dollars and 50 cents", "18", False),
    ("5^2", "5", False),
    ("2+3", "2", False),
    ("x = 5", "5", False),
    ("five", "5", False),
    ("", "5", False),
    (None, "5", False),
    ("\\left( 1, 2 \\right)", "(1,2)", True),
    ("\\text{Monday}.", "Monday", True),
    ("Tuesday", "Monday", False),
])
def test_is_equiv(pred, gold, expected):
    assert is_equiv(pred, gold) is expected


@pytest.mark.parametrize("text, expected", [
    ("blah\n#### 1,600\n", "1,600"),
    ("So the answer is 42. Done.", "42"),
    ("THE ANSWER IS: 42", "42"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\boxed{7}}", "7"),
    ("\\fbox{7}", "7"),
    ("\\boxed{3} then \\boxed{5}", "5"),
    ("\\boxed{3} then the answer is 5", "5"),
    ("the answer is 5, or rather \\boxed{6}", "6"),
    ("\\boxed{5} and a truncated \\boxed{6", "5"),
    (tagged("72"), "72"),
    (tagged("\\boxed{72}"), "72"),
    (tagged("The answer is 72."), "72"),
    (tagged("72") + "\nthe answer is 5", "72"),
    ("<answer>7</answer> and again <answer> 7 </answer>", "7"),
    ("no answer here", None),
    (tagged(""), None),
    (tagged("   "), None),
    ("\\boxed{}", None),
    ("the answer is \\boxed{3} <answer>4", None),
    ("<think>The answer is 72.</think> <answer>", None),
    ("<answer>7</answer> <answer>8</answer>", None),
    ("<answer>7</answer></answer>", None),
    ("\\boxed{5}\n#### " + "9" * 300, None),  # an over-long last answer does not fall back
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_answer_forms_are_configurable():
    text = "\\boxed{3}\n#### 4"
    assert extract_answer(text, forms=("boxed",)) == "3"
    assert extract_answer(text, forms=("hash",)) == "4"
    assert extract_answer(tagged("5"), forms=("boxed",)) is None  # the tag is not a form here
    with pytest.raises(ValueError, match="unknown answer form"):
        extract_answer(text, forms=("latex",))


@pytest.mark.parametrize("completion", [
    "",
    "<think>It is 72.</think>",
    tagged(""),
    "<think>the answer is 72</think> <answer></answer>",
    "<think>#### 72</think> <answer>",
    "<think>\\boxed{72}</think> <answer>I am not sure</answer>",
    "<answer>72</answer> <answer>73</answer>",
    "<answer>71</answer> <answer>72</answer>",
    tagged(", ".join(str(n) for n in range(200))),
    tagged("71 72 73"),
    tagged("72 or 73"),
    "\\boxed{" * 5000 + "72",
    tagged("\\boxed{" * 50 + "72"),
    "72 " * 30000 + "\\boxed{" + "x" * 100_000,
])
def test_hacks_score_zero(completion):
    assert correctness_reward(completion, "72") == 0.0


def test_100kb_of_junk_is_rejected_quickly():
    junk = ("{ 72 \\boxed{ <answer> #### answer is " * 3000)[:100_000]
    start = time.perf_counter()
    rewards = [correctness_reward(junk, "72"), format_reward(junk, "72")]
    assert time.perf_counter() - start < 0.005
    assert rewards == [0.0, 0.0]


def test_truncated_completion_earns_no_correctness():
    assert correctness_reward(tagged("72"), "72", truncated=False) == 1.0
    assert correctness_reward(tagged("72"), "72", truncated=True) == 0.0


@pytest.mark.parametrize("completion, expected", [
    (tagged("72"), 1.0),
    ("  <think>\nwork\n</think>\n\n<answer>72</answer>\n", 1.0),
    ("<think></think><answer>72</answer>", 1.0),
    ("preamble <think>x</think> <answer>72</answer>", 0.0),
    ("<think>x</think> so <answer>72</answer>", 0.0),
    (tagged("72") + " trailing", 0.0),
    (tagged(" "), 0.0),
    ("<answer>72</answer> <think>x</think>", 0.0),
    ("<think>x</think> <answer>72", 0.0),
    ("<think>x <think>y</think> <answer>72</answer>", 0.0),
    (tagged("72") + "<answer>72</answer>", 0.0),
])
def test_format_reward(completion, expected):
    assert format_reward(completion, "72") == expected


def test_score_completions_weights_components():
    completions = [tagged("72"), "\\boxed{72}", tagged("5"), tagged("72")]
    totals, components = score_completions(completions, ["72"] * 4, [False, False, False, True],
                                           {"correctness": 1.0, "format": 0.5})
    assert components == {"correctness": [1.0, 1.0, 0.0, 0.0], "format": [1.0, 0.0, 1.0, 1.0]}
    assert totals == [1.5, 1.0, 0.5, 0.5]
    assert set(REWARD_FUNCTIONS) == {"correctness", "format"}


def test_score_completions_rejects_bad_input():
    with pytest.raises(ValueError, match="accuracy"):
        score_completions(["x"], ["1"], [False], {"accuracy": 1.0})
    with pytest.raises(ValueError, match="weights is empty"):
        score_completions(["x"], ["1"], [False], {})
    with pytest.raises(ValueError, match="equal lengths"):
        score_completions(["x", "y"], ["1"], [False], {"format": 1.0})


def test_gold_from_solution():
    solution = "She has 2 * 3 = <<2*3=6>>6 and 6+10 = <<6+10=16>>16.\n#### 1,600"
    assert gold_from_solution(solution) == "1,600"
    with pytest.raises(ValueError, match="####"):
        gold_from_solution("no marker <<1+1=2>>2")


def test_scoring_512_long_completions_takes_under_50ms():
    think = ("We add 12 and 30 to get 42, then multiply by 3 to get 126; subtract 54 leaves 72. " * 48)[:3900]
    completions = [tagged(str(70 + i % 5), think) if i % 4 else think + f"\nThe answer is {i}."
                   for i in range(512)]
    golds = ["72"] * 512
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        totals, _ = score_completions(completions, golds, [False] * 512, {"correctness": 1.0, "format": 1.0})
        best = min(best, time.perf_counter() - start)
    assert sum(totals) > 0
    assert best < 0.050, f"scoring took {best * 1000:.1f} ms"
