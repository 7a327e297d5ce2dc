import json
import os
import time

import pytest

from conftest import ROOT
from answers import gold_from_solution
from rewards import REWARD_FUNCTIONS, correctness_reward, extract_answer, format_reward, is_equiv, score_completions

GSM8K_DIR = os.path.join(ROOT, "data", "gsm8k")  # shipped with the repo


def tagged(answer, think="Let me compute 3 + 4 = 7 and 12 * 6 = 72."):
    return f"<think>{think}</think> <answer>{answer}</answer>"


def test_every_gsm8k_solution_scores_against_its_own_answer_only():
    paths = [os.path.join(GSM8K_DIR, f"{split}.jsonl") for split in ("train", "test")]
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


# Family 1: answers instruct models write that were refused although right.
@pytest.mark.parametrize("completion", [
    "**72**",
    "The answer is **72**.",
    "*72*",
    "__72__",
    "***72***",
    "**The answer is 72.**",
    "The final answer is: **72 apples**.",
    tagged("**72**"),
    tagged("_72_"),
    "\\(72\\)",
    "\\[72\\]",
    "The answer is \\( 72 \\).",
    tagged("\\[ \\$72 \\]"),
    "(72)",
    "The answer is (72).",
    tagged("(72 apples)"),
    tagged("(72) apples"),
])
def test_markdown_math_and_parenthesis_wrappers_are_credited(completion):
    assert correctness_reward(completion, "72") == 1.0


@pytest.mark.parametrize("completion", [
    "Tom has 72 apples.",
    "He had 10 apples and ate 3 of them.\nSo, Tom has 72 apples left!",
    "Therefore, Janet makes $72 every day at the farmers' market.",
    "Therefore, Tom has **72** apples.",
    "**Final Answer:** 72",
    "So \\(x = 72\\).",
    "<think>60 + 12 = 72</think>\nTom has 72 apples.",
    "Tom has 72 more apples than Jim.",  # GSM8K's "how many more": the difference is the answer
    "He jumped rope 72 times.",
    "The pool is 72 m long.",
])
def test_last_sentence_stating_one_number_is_credited_without_a_marker(completion):
    assert correctness_reward(completion, "72") == 1.0


@pytest.mark.parametrize("completion", [
    "Tom has 72 apples. I hope this helps.",  # the last sentence states no number
    "Does Tom have 72 apples?",
    "Tom has about 72 apples.",
    "Tom has at least 72 apples.",
    "Tom has more than 72 apples.",
    "Tom has up to 72 apples.",
    "Tom has nearly 72 apples.",
    "Tom has approximately 72 apples.",
    "Tom has ~72 apples.",
    "Tom has \u2248 72 apples.",
    "Tom doesn't have 72 apples.",
    "Tom has 72 apples or 73.",
    "Tom has 70, 71 or 72 apples.",
    "Tom has 72 apples in 3 baskets.",
    "Two boxes hold 72 apples.",
    "Tom has - 72 apples.",  # a detached sign is not read past
    "71. 72. 73.",  # a list is read as its last sentence only
    "Tom has 72 apples. Or 73.",
    "Tom has " + "very " * 40 + "many apples: 72.",  # the last sentence is over the cap
    "<think>Tom has 72 apples.</think>",  # reasoning is not an answer
    "<think>x</think> <think>Tom has 72 apples.",
    "The answer is below.\nTom has 72 apples.",  # a marker is present: no fallback
    "\\boxed{\nTom has 72 apples.",
])
def test_last_sentence_fallback_refuses_hedges_questions_and_markers(completion):
    assert correctness_reward(completion, "72") == 0.0


def test_last_sentence_is_a_form_that_never_overrides_a_marker():
    sentence = "Tom gives away 5 apples.\nTom has 72 apples."
    assert extract_answer(sentence) == "72 apples."
    assert extract_answer(sentence, forms=("boxed", "hash")) is None
    assert extract_answer(sentence, forms=("last_sentence",)) == "72 apples."
    assert extract_answer("\\boxed{5}\n" + sentence) == "5"
    assert extract_answer("#### 5\n" + sentence, forms=("boxed", "last_sentence")) == "72 apples."


# Family 2: words or suffixes after (or before) the number that change or hedge its value are refused;
# magnitudes are never scaled.
@pytest.mark.parametrize("pred, gold", [
    ("72 thousand", "72"), ("72 thousand", "72000"), ("72k", "72"), ("72k", "72000"), ("72K", "72"),
    ("72 million", "72"), ("72M", "72000000"), ("1.5 billion", "1500000000"), ("$72 bn", "72"),
    ("72 hundred", "7200"), ("72 grand", "72"),
    ("72 plus one", "72"), ("72 plus one", "73"), ("72 or more", "72"), ("72 or fewer", "72"),
    ("72 squared", "72"), ("72 cubed", "72"), ("72 at least", "72"), ("72 at most", "72"),
    ("72 or so", "72"), ("72-ish", "72"), ("72ish", "72"), ("72, approximately", "72"), ("72 (approx.)", "72"),
    ("72 roughly", "72"), ("72 and a half", "72"), ("72 times two", "72"), ("72 divided by x", "72"),
    ("72 and above", "72"), ("72 maybe", "72"), ("72 if rounded", "72"), ("72 isn't right", "72"),
    ("72 is wrong", "72"), ("72\u00b2", "72"), ("72 * x", "72"), ("72 \u00d7 n", "72"), ("72?", "72"),
    ("about 72", "72"), ("approximately 72", "72"), ("~72", "72"), ("\u224872", "72"), ("\\approx 72", "72"),
    ("at least 72", "72"), ("around 72", "72"), ("more than 72", "72"), ("< 72", "72"),
])
def test_value_changing_or_hedging_words_are_refused(pred, gold):
    assert is_equiv(pred, gold) is False


@pytest.mark.parametrize("pred", [
    "72 apples", "$72", "72 dollars", "72 cm", "72 m", "72 km", "72 kg", "72%", "72 percent", "72 more apples",
    "72 fewer", "72 times", "72 dozen", "72 each", "$72 per week", "72 years old", "72 apples left over",
    "72 minutes", "72 pages in total",
])
def test_units_and_nouns_after_the_number_are_still_credited(pred):
    assert is_equiv(pred, "72") is True


# Family 3: removing noise must never join two digit runs into one number.
@pytest.mark.parametrize("pred", [
    "7%2", "7\\%2", "7$2", "7\\$2", "7\u00b02", "7^\\circ2", "7\\!2", "7\\;2", "7\\ 2", "7\\,2", "7{,}2",
    "**7**2", "7**2", "7\\text{}2", "7\\(2\\)", "7\\left2",
])
def test_noise_never_joins_digits(pred):
    assert is_equiv(pred, "72") is False
    assert is_equiv(pred, "7") is False


@pytest.mark.parametrize("pred, gold", [
    ("1\\,000", "1000"), ("1{,}000", "1000"), ("$1,000$", "1000"), ("72\\%", "72"), ("-\\$72", "-72"),
    ("**-72**", "-72"), ("72^\\circ", "72"),
])
def test_noise_around_a_number_is_still_removed(pred, gold):
    assert is_equiv(pred, gold) is True


# Family 4: several markers inside one <answer> tag must agree.
@pytest.mark.parametrize("completion", [
    tagged("\\boxed{3} ... \\boxed{4}"),
    tagged("#### 3 #### 4"),
    tagged("#### 3\n#### 4"),
    tagged("The answer is 3. No, the answer is 4."),
    tagged("The answer is 3, i.e. \\boxed{4}"),
    tagged("\\boxed{4} #### 3"),
    tagged("\\boxed{3} or \\boxed{4}"),
    tagged("The answer is about 4. \\boxed{4}"),
    tagged("\\boxed{4} \\boxed{4"),  # an unclosed marker inside the tag
])
def test_disagreeing_markers_in_one_tag_give_no_answer(completion):
    assert extract_answer(completion) is None
    assert correctness_reward(completion, "3") == correctness_reward(completion, "4") == 0.0


@pytest.mark.parametrize("completion, expected", [
    (tagged("\\boxed{72} #### 72"), "72"),
    (tagged("The answer is $\\boxed{72}$."), "72"),
    (tagged("#### \\boxed{72}"), "72"),
    (tagged("\\boxed{72}, that is \\boxed{72.0}"), "72.0"),
    (tagged("The answer is 72 apples. \\boxed{72}"), "72"),
    (tagged("#### 72\nThe answer is 72."), "72"),
    (tagged("\\boxed{Monday}, so \\boxed{\\text{Monday}}"), "\\text{Monday}"),
])
def test_agreeing_markers_in_one_tag_give_the_last(completion, expected):
    assert extract_answer(completion) == expected


@pytest.mark.parametrize("junk", [
    ("{ 72 \\boxed{ <answer> #### answer is " * 3000)[:100_000],
    ("Tom has 7 apples and " * 5000)[:100_000],  # no marker: the last-sentence fallback reads it
    "**72** " * 14_000,
])
def test_100kb_of_junk_is_rejected_quickly(junk):
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
    with pytest.raises(ValueError, match="equal lengths"):
        score_completions(["x", "y"], ["1"], [False], {"format": 1.0})


def test_gold_from_solution():
    solution = "She has 2 * 3 = <<2*3=6>>6 and 6+10 = <<6+10=16>>16.\n#### 1,600"
    assert gold_from_solution(solution) == "1,600"
    with pytest.raises(ValueError, match="####"):
        gold_from_solution("no marker <<1+1=2>>2")


def test_scoring_512_long_completions_takes_under_50ms():
    think = ("We add 12 and 30 to get 42, then multiply by 3 to get 126; subtract 54 leaves 72. " * 48)[:3900]
    completions = [tagged(str(70 + i % 5), think) if i % 4
                   else think + (f"\nThe answer is {i}." if i % 8 else f"\nTom has {i} apples.") for i in range(512)]
    golds = ["72"] * 512
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        totals, _ = score_completions(completions, golds, [False] * 512, {"correctness": 1.0, "format": 1.0})
        best = min(best, time.perf_counter() - start)
    assert sum(totals) > 0
    assert best < 0.050, f"scoring took {best * 1000:.1f} ms"
