"""is_equiv_math against two oracles on tools/math_pairs.py's labelled MATH-500 pairs: the generator's own labels
(always run) and Hugging Face's Math-Verify (skipped when math_verify is not installed). docs/math_checker.md explains
every known disagreement."""
import pytest

import math_pairs  # tools/math_pairs.py (conftest puts tools/ on the path)
from math_answers import is_equiv_math

# (pred, gold) pairs of math_pairs.make_pairs() where is_equiv_math and Math-Verify 0.9.0 disagree, each explained in
# docs/math_checker.md. Math-Verify credits a decimal close to an irrational gold (it rounds before comparing), and a
# decimal within its tolerance of a decimal gold; it reads "x = 58,500" as x = 58 and the item 500.
KNOWN_DISAGREEMENTS = {
    ("7.141428428543", "\\sqrt{51}"), ("2.236067977500", "\\sqrt{5}"), ("7.280109889281", "\\sqrt{53}"),
    ("8.124038404636", "\\sqrt{66}"), (".0000673", ".0000672"), ("x = 58,500", "58,500"),
    ("x = 11,\\! 111,\\! 111,\\! 100", "11,\\! 111,\\! 111,\\! 100"),
}


@pytest.fixture(scope="module")
def pairs():
    return math_pairs.make_pairs(seed=0)


def test_the_pairs_are_many_and_the_same_on_every_run(pairs):
    assert len(pairs) >= 2000
    assert sum(pair["label"] for pair in pairs) >= 1000 and sum(not pair["label"] for pair in pairs) >= 1000
    assert math_pairs.make_pairs(seed=0) == pairs
    assert len({pair["unique_id"] for pair in pairs}) == 500


def test_is_equiv_math_matches_the_generators_labels(pairs):
    wrong = [(pair["form"], pair["pred"], pair["gold"]) for pair in pairs if is_equiv_math(pair["pred"], pair["gold"])
             != pair["label"]]
    assert len(wrong) <= 0.01 * len(pairs), wrong


def test_math_verify_agrees_and_every_disagreement_is_known(pairs):
    pytest.importorskip("math_verify", reason="the Math-Verify comparison needs pip install math-verify")
    judge = math_pairs.math_verify_judge()
    sample = pairs[::8] + [pair for pair in pairs if (pair["pred"], pair["gold"]) in KNOWN_DISAGREEMENTS]
    disagreements = {(pair["pred"], pair["gold"]) for pair in sample
                     if is_equiv_math(pair["pred"], pair["gold"]) != judge(pair["pred"], pair["gold"])}
    assert len(disagreements) <= 0.03 * len(sample)
    assert disagreements == KNOWN_DISAGREEMENTS & {(pair["pred"], pair["gold"]) for pair in sample}
