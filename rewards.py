"""
Rule-based rewards for R1-Zero-style RL on math word problems.

The reward is the only teacher, so every rule below leans towards 0.0 when in doubt: a false positive
teaches the policy to cheat, a false negative only slows it down. Parsing is hand-written (no regex,
no sympy) and runs in time linear in the completion: whole-text work is done with str.find/rfind/
split/count (C speed); only short candidate answer spans (at most MAX_ANSWER_CHARS) are scanned
character by character in Python.
"""

from fractions import Fraction
from types import MappingProxyType

MAX_ANSWER_CHARS = 200  # a longer candidate answer is not an answer, and caps the per-span work
MAX_BOXED_TRIES = 4  # unclosed \boxed{ markers examined before giving up, so junk cannot cost O(n^2)
DEFAULT_FORMS = ("answer_tag", "boxed", "hash", "answer_is")
ANSWER_IS_VARIANTS = ("answer is", "Answer is", "ANSWER IS")
TRAILING_FORBIDDEN = "=^!\\+*"  # after the number, these (or any digit) mean "more than a number"
TEXT_WRAPPERS = ("\\text{", "\\textbf{", "\\mathrm{", "\\mbox{")
LATEX_NOISE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", "\\$", "$", "^\\circ", "^{\\circ}", "°")

# -----------------------------------------------------------------------------
# answer extraction


def _braced(text, open_at):
    """Content of the brace group opening at text[open_at] == '{', or None if unclosed within the cap."""
    depth = 0
    for offset, ch in enumerate(text[open_at:open_at + MAX_ANSWER_CHARS + 2]):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1:open_at + offset]
    return None


def _rest_of_line(text, start):
    """text[start:] up to the next newline; "" (no answer) when that line is longer than the cap."""
    window = text[start:start + MAX_ANSWER_CHARS + 1]
    line, newline, _ = window.partition("\n")
    return "" if not newline and len(window) > MAX_ANSWER_CHARS else line


def _last_boxed(text):
    """(position, content) of the last complete \\boxed{...} or \\fbox{...}, or None."""
    end = len(text)
    for _ in range(MAX_BOXED_TRIES):
        start = max(text.rfind("\\boxed{", 0, end), text.rfind("\\fbox{", 0, end))
        if start < 0:
            return None
        content = _braced(text, text.index("{", start))
        if content is not None:
            return start, content
        end = start
    return None


def _last_hash(text):
    start = text.rfind("####")
    return (start, _rest_of_line(text, start + 4)) if start >= 0 else None


def _last_answer_is(text):
    start = max(text.rfind(variant) for variant in ANSWER_IS_VARIANTS)
    if start < 0:
        return None
    line = _rest_of_line(text, start + len("answer is")).strip().removeprefix(":")
    return start, line.partition(". ")[0].rstrip(".")  # the sentence ends at its full stop


UNTAGGED_FINDERS = {"boxed": _last_boxed, "hash": _last_hash, "answer_is": _last_answer_is}


def _last_marked(text, forms):
    """The stripped answer after whichever marker of the untagged forms occurs last, or None."""
    found = [hit for hit in (UNTAGGED_FINDERS[form](text) for form in forms) if hit is not None]
    return (max(found)[1].strip() or None) if found else None


def _answer_tag_content(text):
    """Stripped content of the <answer> tag(s); None if malformed, empty, too long or ambiguous."""
    before, *tagged = text.split("<answer>")
    if "</answer>" in before:
        return None  # a closing tag with no opening one
    contents = set()
    for part in tagged:
        if part.count("</answer>") != 1:
            return None  # unclosed (e.g. truncated) or doubly closed
        contents.add(part.partition("</answer>")[0].strip())
    if len(contents) != 1:
        return None  # several tags that disagree: the policy is hedging
    content = contents.pop()
    return content if 0 < len(content) <= MAX_ANSWER_CHARS else None


def extract_answer(text: str, forms: tuple[str, ...] = DEFAULT_FORMS) -> str | None:
    """
    The final answer string in a completion, or None. forms (a tuple, any of DEFAULT_FORMS) says
    which notations count:
      answer_tag  <answer>...</answer> (the R1-Zero template)
      boxed       \\boxed{...} or \\fbox{...}, nested braces allowed
      hash        GSM8K's "#### N": the rest of that line
      answer_is   "the answer is N" (also "final answer is"; lower, Capitalised or UPPER case),
                  up to the end of the line or sentence
    Anti-gaming rules:
      - An <answer> tag, when "<answer>" or "</answer>" occurs at all, is authoritative: if it is empty, unclosed,
        nested or longer than MAX_ANSWER_CHARS the result is None, never a number from the think block.
      - Several <answer> tags must all hold the same content, else None (hedging across tags).
      - Inside the tag, the other forms are unwrapped (<answer>\\boxed{7}</answer> gives "7");
        without any of them the whole tag content is the answer.
      - Without a tag, the marker that occurs last in the text wins, over all forms. A later
        unclosed (or over-long) \\boxed{ is skipped, looking back at most MAX_BOXED_TRIES markers;
        an empty winner, or a "####"/"answer is" line longer than MAX_ANSWER_CHARS, gives None
        rather than falling back to an earlier answer.
      - Hedging inside one answer ("3 or 4", "1, 2, 3") is left to is_equiv, which rejects it.
    """
    unknown = set(forms) - set(DEFAULT_FORMS)
    if unknown:
        raise ValueError(f"unknown answer form(s) {sorted(unknown)}; known forms are {DEFAULT_FORMS}")
    untagged_forms = [form for form in forms if form != "answer_tag"]
    if "answer_tag" in forms and ("<answer>" in text or "</answer>" in text):
        content = _answer_tag_content(text)
        return None if content is None else (_last_marked(content, untagged_forms) or content)
    return _last_marked(text, untagged_forms)

# -----------------------------------------------------------------------------
# equivalence


def _strip_latex(text):
    """Drop LaTeX noise ($, \\left, \\text{} wrappers, degree signs) and unify minus signs / \\frac."""
    text = text.replace("\u2212", "-").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for noise in LATEX_NOISE:
        text = text.replace(noise, "")
    for wrapper in TEXT_WRAPPERS:
        start = text.find(wrapper)
        while start >= 0:
            close = text.find("}", start)
            if close < 0:
                break
            text = text[:start] + " " + text[start + len(wrapper):close] + " " + text[close + 1:]
            start = text.find(wrapper, start)
    return text


def _frac_to_slash(text):
    """Rewrite \\frac{a}{b} as ' a/b ' (so "3\\frac{1}{2}" becomes the mixed number "3 1/2")."""
    start = text.find("\\frac{")
    while start >= 0:
        numerator_end = text.find("}", start)
        if numerator_end < 0 or text[numerator_end + 1:numerator_end + 2] != "{":
            return text  # malformed: leave "\frac" in place so it does not parse as a number
        denominator_end = text.find("}", numerator_end + 2)
        if denominator_end < 0:
            return text
        numerator = text[start + 6:numerator_end].strip()
        denominator = text[numerator_end + 2:denominator_end].strip()
        text = f"{text[:start]} {numerator}/{denominator} {text[denominator_end + 1:]}"
        start = text.find("\\frac{")
    return text


def _plain_integer(digits):
    """'1234' or thousands-grouped '1,234,567' -> int; None for '1,00', '12,34', '' and the like."""
    groups = digits.split(",")
    if len(groups) > 1 and not (1 <= len(groups[0]) <= 3 and all(len(group) == 3 for group in groups[1:])):
        return None
    joined = "".join(groups)
    return int(joined) if joined.isdecimal() and joined.isascii() else None


def _leading_number(token):
    """Split a token into its leading unsigned number and the rest: '18cm' -> (18, 'cm'), or (None, token)."""
    rest = token.lstrip("0123456789,./")
    number = token[:len(token) - len(rest)].rstrip(".,")
    if number.count("/") == 1:  # a fraction of two plain integers
        numerator, denominator = (_plain_integer(part) for part in number.split("/"))
        if numerator is None or not denominator:
            return None, token
        return Fraction(numerator, denominator), rest
    whole, point, decimals = number.partition(".")
    if "/" in number or (point and not (decimals.isdecimal() and decimals.isascii())):
        return None, token
    value = _plain_integer(whole) if whole else (0 if point else None)  # ".5" is fine, "" is not
    if value is None:
        return None, token
    scale = 10 ** len(decimals)  # one Fraction per number: Fraction arithmetic is slow in pure Python
    return Fraction(value * scale + (int(decimals) if decimals else 0), scale), rest


def parse_number(text: str) -> Fraction | None:
    """
    The single number a short answer string states, as an exact Fraction, or None.
    Accepts: sign (+, -, unicode minus), $, thousands commas ("1,000"; "1.000" is 1), decimals,
    "3/4", \\frac/\\dfrac/\\tfrac, mixed numbers ("2 1/2", "2\\frac{1}{2}"), a percent sign (dropped),
    and trailing units or words ("18 dollars", "18cm", "18 apples."). Rejects anything with a second
    number or an operator after the first ("3 or 4", "1, 2, 3", "5^2", "2+3") and leading words.
    """
    if len(text) > MAX_ANSWER_CHARS:
        return None
    text = _strip_latex(text).replace("{,}", ",").replace("\\%", "").replace("%", "")
    text = _frac_to_slash(text).strip().rstrip(".")
    negative = text.startswith("-")
    tokens = (text[1:] if text[:1] in ("+", "-") else text).split()
    if not tokens:
        return None
    value, rest = _leading_number(tokens[0])
    trailing = tokens[1:]
    if value is None:
        return None
    if not rest and trailing and "/" in trailing[0] and tokens[0].isdecimal():  # mixed number
        fraction, fraction_rest = _leading_number(trailing[0])
        if fraction is not None and 0 < fraction < 1:
            value, rest, trailing = value + fraction, fraction_rest, trailing[1:]
    tail = rest + " " + " ".join(trailing)
    if any(ch.isdigit() or ch in TRAILING_FORBIDDEN for ch in tail):
        return None
    return -value if negative else value


def _normalize_text(text):
    """Whitespace- and LaTeX-insensitive form of a non-numeric answer."""
    return "".join(_strip_latex(text).split()).rstrip(".")


def is_equiv(pred: str | None, gold: str) -> bool:
    """
    Whether the predicted answer string states the gold answer. A numeric gold must be matched
    exactly (Fraction arithmetic, so 0.5 == 1/2 but 0.3333 != 1/3) by a pred that states one
    single number; a non-numeric gold is compared after whitespace/LaTeX normalisation.
    """
    if pred is None or gold is None:
        return False
    gold_value = parse_number(gold)
    if gold_value is not None:
        return parse_number(pred) == gold_value
    if len(pred) > MAX_ANSWER_CHARS:
        return False
    normalized_gold = _normalize_text(gold)
    return normalized_gold != "" and _normalize_text(pred) == normalized_gold

# -----------------------------------------------------------------------------
# rewards: one signature (completion, gold, truncated=False) -> float


def correctness_reward(completion: str, gold: str, truncated: bool = False) -> float:
    """1.0 if the completion's final answer equals gold (a final-answer string like "1,600"), else 0.0.
    A truncated completion never finished its answer, so it earns nothing."""
    if truncated:
        return 0.0
    return 1.0 if is_equiv(extract_answer(completion), gold) else 0.0


def format_reward(completion: str, gold: str, truncated: bool = False) -> float:
    """
    1.0 for the R1-Zero layout "<think>...</think> <answer>...</answer>", else 0.0: each of the four
    tags exactly once and in that order, only whitespace before <think>, between </think> and
    <answer>, and after </answer>; a non-empty answer. gold and truncated are ignored: layout is
    judged on the text alone.
    """
    tags = ("<think>", "</think>", "<answer>", "</answer>")
    if any(completion.count(tag) != 1 for tag in tags):
        return 0.0
    before, _, rest = completion.partition("<think>")
    _, think_closed, rest = rest.partition("</think>")  # each tag occurs once, so a miss means bad order
    between, answer_opened, rest = rest.partition("<answer>")
    answer, answer_closed, after = rest.partition("</answer>")
    in_order = think_closed and answer_opened and answer_closed
    only_whitespace_outside = not (before.strip() or between.strip() or after.strip())
    return 1.0 if in_order and only_whitespace_outside and answer.strip() else 0.0


REWARD_FUNCTIONS = MappingProxyType({"correctness": correctness_reward, "format": format_reward})


def score_completions(completions: list[str], golds: list[str], truncated: list[bool],
                      weights: dict[str, float]) -> tuple[list[float], dict[str, list[float]]]:
    """
    Weighted sum of rewards per completion. completions, golds, truncated: equal-length sequences
    (N,); weights: {reward name: weight}, names from REWARD_FUNCTIONS.
    Returns (totals: list of N floats, components: {name: list of N unweighted rewards}).
    """
    unknown = sorted(set(weights) - set(REWARD_FUNCTIONS))
    if unknown:
        raise ValueError(f"unknown reward name(s) {unknown}; known rewards are {sorted(REWARD_FUNCTIONS)}")
    if not weights:
        raise ValueError("weights is empty: name at least one reward from REWARD_FUNCTIONS")
    if not len(completions) == len(golds) == len(truncated):
        raise ValueError(f"completions, golds and truncated must have equal lengths, got "
                         f"{len(completions)}, {len(golds)} and {len(truncated)}")
    components = {name: [REWARD_FUNCTIONS[name](completion, gold, cut)
                         for completion, gold, cut in zip(completions, golds, truncated)]
                  for name in weights}
    totals = [sum(weights[name] * components[name][i] for name in weights) for i in range(len(completions))]
    return totals, components


def gold_from_solution(solution_text: str) -> str:
    """The final answer of a GSM8K solution: the rest of the line after its last '####'."""
    _, marker, tail = solution_text.rpartition("####")
    answer = tail.partition("\n")[0].strip()
    if not marker or not answer:
        raise ValueError(f"GSM8K solution has no final answer after '####': ...{solution_text[-80:]!r}")
    return answer
