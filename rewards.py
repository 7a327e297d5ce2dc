"""
Rule-based rewards for R1-Zero-style RL on math word problems: the final answer's correctness, the layout, and the
arithmetic claims a solution makes along the way (the reasoning steps of process supervision). Answers are read and
compared by an answer checker (ANSWER_CHECKERS, config key answer_checker): "gsm8k", numbers by is_equiv below, or
"math", MATH's LaTeX answers by math_answers.is_equiv_math.

The reward is the only teacher, so every rule below leans towards 0.0 when in doubt: a false positive
teaches the policy to cheat, a false negative only slows it down. Parsing is hand-written (no regex,
no sympy) and runs in time linear in the completion: whole-text work is done with str.find/rfind/
split/count (C speed); only short candidate answer spans (at most MAX_ANSWER_CHARS) are scanned
character by character in Python.
"""

import bisect
import inspect
import math
import numbers
import operator
from fractions import Fraction
from types import MappingProxyType
from typing import Callable, NamedTuple

from math_answers import is_equiv_math
from template import R1_ZERO, Template

MAX_ANSWER_CHARS = 200  # a longer candidate answer is not an answer, and caps the per-span work
MAX_BOXED_TRIES = 4  # unclosed \boxed{ markers examined before giving up, so junk cannot cost O(n^2)
DEFAULT_FORMS = ("answer_tag", "boxed", "hash", "answer_is", "last_sentence")
# answer_checker="math" reads these: MATH's answers are LaTeX, GSM8K's "####" is not MATH's, and last_sentence reads
# a sentence from its first digit on ("The area is $\pi r^2 = 4\pi$." would give "r^2 = 4\pi$."); a boxed answer
# (MATH's own solutions, Qwen2.5-Math's habit) counts, in the answer tag or without one
MATH_FORMS = ("answer_tag", "boxed", "answer_is")
ANSWER_IS_VARIANTS = ("answer is", "Answer is", "ANSWER IS")
SENTENCE_ENDS = ("\n", ". ", "! ", "? ")
TRAILING_FORBIDDEN = "=^!\\+*?~<>≈≤≥±≠×÷"  # after the number, these (or any digit) mean "more than a number"
BOUND_CHARS = "~<>≈≤≥±≠"  # before the number in a sentence: it is approximated or bounded
TEXT_WRAPPERS = ("\\text{", "\\textbf{", "\\mathrm{", "\\mbox{")
LATEX_NOISE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", "\\$", "$", "\\(", "\\)", "\\[", "\\]",
               "^\\circ", "^{\\circ}", "°")
# Words that change or hedge the number they follow: operators, bounds, approximations, doubt, negation,
# magnitudes and number words (a second number). "more", "fewer" and "times" are absent on purpose:
# "72 more apples" and "72 times" answer GSM8K's "how many more" and "how many times" questions.
VALUE_WORDS = frozenset("""
    or nor plus minus squared cubed divided multiplied least most max maximum minimum above below upwards
    approximately approx roughly circa ish odd maybe perhaps probably possibly likely not never if unless
    wrong incorrect half thousand thousands million millions billion billions trillion trillions hundred
    hundreds grand lakh crore zero one two three four five six seven eight nine ten eleven twelve thirteen
    fourteen fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety
""".split())
MAGNITUDE_SYMBOLS = frozenset(("k", "K", "M", "B", "bn", "mn"))  # matched with case: "72 m" is metres
# Words that bound or hedge a number they precede in a sentence ("more than 72", "up to 72", "about 72").
BOUND_WORDS = VALUE_WORDS | frozenset("""
    more less fewer than over under up about around nearly almost between either no twice double triple thrice
    times guess estimate estimated suppose assume sim simeq le leq ge geq ne neq lt gt pm
""".split())

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


def _boxed_answer(text, start):
    return _braced(text, text.index("{", start))


def _hash_answer(text, start):
    return _rest_of_line(text, start + len("####"))


def _answer_is_answer(text, start):
    line = _rest_of_line(text, start + len("answer is")).strip().removeprefix(":")
    return line.partition(". ")[0].rstrip(".")  # the sentence ends at its full stop


# form -> (its marker strings, reader of the answer after a marker at a position; None if unreadable)
FORM_MARKERS = MappingProxyType({"boxed": (("\\boxed{", "\\fbox{"), _boxed_answer),
                                 "hash": (("####",), _hash_answer),
                                 "answer_is": (ANSWER_IS_VARIANTS, _answer_is_answer)})


def _occurs(text, marker):
    """marker in text, by rfind: CPython's forward search (`in`) is several times slower on long texts."""
    return text.rfind(marker) >= 0


def _last_hit(text, form):
    """(position, answer) of the last readable marker of form, skipping at most MAX_BOXED_TRIES unreadable ones."""
    markers, read = FORM_MARKERS[form]
    end = len(text)
    for _ in range(MAX_BOXED_TRIES):
        start = max(text.rfind(marker, 0, end) for marker in markers)
        if start < 0:
            return None
        answer = read(text, start)
        if answer is not None:
            return start, answer
        end = start
    return None


def _last_marked(text, forms):
    """The stripped answer after whichever marker of the forms occurs last, or None."""
    found = [hit for hit in (_last_hit(text, form) for form in forms) if hit is not None]
    return (max(found)[1].strip() or None) if found else None


def _before_any(answer, markers):
    """answer up to the first marker nested in it: in "#### 3 #### 4" the first marker states "3"."""
    return answer[:min((answer.find(marker) for marker in markers if marker in answer), default=len(answer))]


def _same_answer(first, second):
    """Whether two answers state the same number, or the same text when neither is a number."""
    first_value, second_value = parse_number(first), parse_number(second)
    if first_value is not None or second_value is not None:
        return first_value == second_value
    return _normalize_text(first) == _normalize_text(second)


def _tag_answer(content, forms):
    """The answer inside an <answer> tag: its markers' answer if they agree (None if they do not, or if one is
    unreadable), else the whole content. A marker wrapping another ("answer is $\\boxed{7}$") defers to it."""
    hits = []
    for form in forms:
        markers, read = FORM_MARKERS[form]
        for marker in markers:
            start = content.find(marker)
            while start >= 0:  # content is at most MAX_ANSWER_CHARS long
                hits.append((start, read(content, start)))
                start = content.find(marker, start + 1)
    if not hits:
        return content
    if any(answer is None for _, answer in hits):
        return None
    all_markers = [marker for form in forms for marker in FORM_MARKERS[form][0]]
    answers = [_before_any(answer, all_markers).strip() for _, answer in sorted(hits)]
    answers = [answer for answer in answers if any(ch.isalnum() for ch in answer)]
    if not answers:
        return None
    final = answers[-1]
    return final if all(_same_answer(answer, final) for answer in answers) else None


def _answer_tag_content(text, tags):
    """Stripped content of the answer tag(s) (tags: open, close); None if malformed, empty, too long or ambiguous."""
    opening, closing = tags
    before, *tagged = text.split(opening)
    if closing in before:
        return None  # a closing tag with no opening one
    contents = set()
    for part in tagged:
        if part.count(closing) != 1:
            return None  # unclosed (e.g. truncated) or doubly closed
        contents.add(part.partition(closing)[0].strip())
    if len(contents) != 1:
        return None  # several tags that disagree: the policy is hedging
    content = contents.pop()
    return content if 0 < len(content) <= MAX_ANSWER_CHARS else None


def _has_value_word(text, words):
    """Whether text holds a whole word from words (any case), a magnitude symbol (72k, 72M) or a negation (n't)."""
    letters = "".join(ch if ch.isalpha() or ch in "'’" else " " for ch in text)
    for word in letters.split():
        word = word.strip("'’")
        lower = word.lower()
        if lower in words or word in MAGNITUDE_SYMBOLS or lower.endswith(("n't", "n’t")):
            return True
    return False


def _bounds_value(prefix):
    """Whether the words before a number in a sentence bound, hedge or negate it, or carry its sign apart."""
    return (any(ch in BOUND_CHARS for ch in prefix) or prefix.rstrip().endswith(("-", "+", "\u2212"))
            or _has_value_word(prefix, BOUND_WORDS))


def _last_sentence_answer(text, think):
    """The last sentence of the text from its first number on, or None (the rule is in extract_answer); think: the
    think tags (open, close)."""
    _, _, text = text.rpartition(think[1])  # the reasoning is not the answer
    if _occurs(text, think[0]):
        return None  # the completion ends inside its reasoning
    body = text.rstrip()
    window = body[-(MAX_ANSWER_CHARS + 1):]
    start = max((window.rfind(end) + len(end) for end in SENTENCE_ENDS if end in window), default=0)
    if start == 0 and len(body) > MAX_ANSWER_CHARS:
        return None
    sentence = window[start:].strip()
    if sentence.endswith("?"):
        return None
    exclaimed = sentence.rstrip("!")
    if not exclaimed[-1:].isdigit():  # "72!" is a factorial; "72 apples!" is emphasis
        sentence = exclaimed
    first_digit = min((at for at in (sentence.find(digit) for digit in "0123456789") if at >= 0), default=-1)
    if first_digit < 0:
        return None
    token_start = max(sentence.rfind(" ", 0, first_digit), sentence.rfind("\t", 0, first_digit)) + 1
    return None if _bounds_value(sentence[:token_start]) else sentence[token_start:]


def extract_answer(text: str, forms: tuple[str, ...] = DEFAULT_FORMS, template: Template = R1_ZERO) -> str | None:
    """
    The final answer string in a completion, or None. forms (a tuple, any of DEFAULT_FORMS) says
    which notations count; template (template.Template) names the tags, written here as R1-Zero's:
      answer_tag     <answer>...</answer> (the template's answer tags)
      boxed          \\boxed{...} or \\fbox{...}, nested braces allowed
      hash           GSM8K's "#### N": the rest of that line
      answer_is      "the answer is N" (also "final answer is"; lower, Capitalised or UPPER case),
                     up to the end of the line or sentence
      last_sentence  only when no marker of the other forms occurs anywhere: the final sentence of
                     the text after any </think> (the template's think close) ("Tom has 72 apples."), from its
                     first digit on
    Anti-gaming rules:
      - An <answer> tag, when "<answer>" or "</answer>" occurs at all, is authoritative: if it is empty, unclosed,
        nested or longer than MAX_ANSWER_CHARS the result is None, never a number from the think block.
      - Several <answer> tags must all hold the same content, else None (hedging across tags).
      - Inside the tag, the other forms are unwrapped (<answer>\\boxed{7}</answer> gives "7");
        without any of them the whole tag content is the answer (no last_sentence reading in a tag).
        Several markers in one tag must agree (same number, or same text): <answer>\\boxed{3} or
        \\boxed{4}</answer>, "#### 3 #### 4" and "the answer is 3. No, the answer is 4" give None, as does
        an unclosed \\boxed{ there. A marker holding nothing but another ("answer is $\\boxed{7}$") defers to it.
      - Without a tag, the marker that occurs last in the text wins, over all forms (later self-correction
        is allowed in reasoning). A later unclosed (or over-long) \\boxed{ is skipped, looking back at most
        MAX_BOXED_TRIES markers; an empty winner, or a "####"/"answer is" line longer than MAX_ANSWER_CHARS,
        gives None rather than falling back to an earlier answer or to the last sentence.
      - last_sentence is the fallback for chat models that state the result in prose. It is a default form
        because it never overrides a marker: it applies only when no tag and no marker occurs at all. The
        sentence (split at newlines and ". ", "! ", "? "; at most MAX_ANSWER_CHARS) must not be a question,
        nor sit in an unclosed <think> block; the text before its first number must not bound or hedge it
        (BOUND_WORDS: "about", "at least", "more than", "up to", "not", number words...; "~", "<", "≈";
        a detached sign); from that number on, parse_number must read exactly one number. Listing numbers
        gains nothing: "70. 71. 72." is read as its last sentence, "72", exactly as "72." alone would be.
      - Hedging inside one answer ("3 or 4", "1, 2, 3", "about 72") is left to parse_number, which rejects it.
    """
    unknown = set(forms) - set(DEFAULT_FORMS)
    if unknown:
        raise ValueError(f"unknown answer form(s) {sorted(unknown)}; known forms are {DEFAULT_FORMS}")
    marked_forms = [form for form in forms if form in FORM_MARKERS]
    if "answer_tag" in forms and (_occurs(text, template.answer[0]) or _occurs(text, template.answer[1])):
        content = _answer_tag_content(text, template.answer)
        return None if content is None else _tag_answer(content, marked_forms)
    if any(_occurs(text, marker) for form in marked_forms for marker in FORM_MARKERS[form][0]):
        return _last_marked(text, marked_forms)
    return _last_sentence_answer(text, template.think) if "last_sentence" in forms else None

# -----------------------------------------------------------------------------
# equivalence


def _strip_latex(text):
    """Replace LaTeX noise ($, \\(, \\left, \\text{} wrappers, degree signs) by spaces, so that removing it never
    joins two digit runs, and unify minus signs / \\frac."""
    text = text.replace("\u2212", "-").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for noise in LATEX_NOISE:
        text = text.replace(noise, " ")
    for wrapper in TEXT_WRAPPERS:
        start = text.find(wrapper)
        while start >= 0:
            close = text.find("}", start)
            if close < 0:
                break
            text = text[:start] + " " + text[start + len(wrapper):close] + " " + text[close + 1:]
            start = text.find(wrapper, start)
    return text


def _strip_emphasis(text):
    """Replace markdown emphasis (runs of * and _ at a word's edge: **72**, _72_) by spaces. A run between two
    letters/digits or two spaces is an operator or a subscript (2*3, 2 * 3, 7**2, x_1) and is kept."""
    if "*" not in text and "_" not in text:
        return text
    pieces, start = [], 0
    while start < len(text):
        end = start
        while end < len(text) and text[end] in "*_":
            end += 1
        if end == start:
            pieces.append(text[start])
            start += 1
            continue
        before, after = text[start - 1:start] or " ", text[end:end + 1] or " "
        operator = (before.isalnum() and after.isalnum()) or (before.isspace() and after.isspace())
        pieces.append(text[start:end] if operator else " ")
        start = end
    return "".join(pieces)


def _unwrap_parentheses(text):
    """'(72)', '(72 apples)', '(72) apples' -> the same without that leading, unnested parenthesis pair."""
    inner, closed, after = text[1:].partition(")")
    if not text.startswith("(") or not closed or "(" in inner:
        return text
    return f" {inner} {after}"


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


def _changes_value(tail):
    """Whether the text after a number adds to, bounds or hedges it: a second number (digits or words), an
    operator, a doubt or a magnitude ("72 or more", "72 squared", "72-ish", "72 thousand", "72k")."""
    return any(ch.isdigit() or ch in TRAILING_FORBIDDEN for ch in tail) or _has_value_word(tail, VALUE_WORDS)


def parse_number(text: str) -> Fraction | None:
    """
    The single number a short answer string states, as an exact Fraction, or None.
    Accepts: sign (+, -, unicode minus), $, thousands commas ("1,000"; "1.000" is 1), decimals,
    "3/4", \\frac/\\dfrac/\\tfrac, mixed numbers ("2 1/2", "2\\frac{1}{2}"), a percent sign (dropped),
    and trailing units or nouns ("18 dollars", "18cm", "18 apples.", "5 dozen", "72 more", "72 times").
    Wrappers that do not change the value are removed: markdown emphasis at a word's edge ("**72**",
    "*72*", "__72__", "**72** apples"), inline math "\\(72\\)", "\\[72\\]", "$72$", and one leading pair
    of parentheses ("(72)", "(72 apples)").
    Rejects (None), leaning to 0.0 when in doubt:
      - a second number or an operator after the first ("3 or 4", "1, 2, 3", "5^2", "2+3", "72 * x"),
        including number words ("72 plus one") and superscripts ("72²");
      - leading words or signs of doubt ("x = 5", "about 72", "~72", "≈72", "approximately 72");
      - trailing words that change, bound or hedge the value, matched as whole words (VALUE_WORDS:
        "72 or more", "72 squared", "at least"/"at most", "72-ish", "72 or so", "72, approximately",
        "72 (not counting...)"); units and nouns are not in that closed list, so they pass;
      - magnitudes, never scaled: "72 thousand", "72k", "72K", "72M", "1.5 billion", "72 bn" are refused,
        because "72k" read as 72 is wrong and read as 72000 clashes with units (72 m is metres);
      - digits joined across removed noise: noise becomes a space, so "7%2", "7$2", "7°2" are two
        numbers; "\\," and "{,}" are thousands separators ("1\\,000" is 1000), checked like commas ("7\\,2").
    """
    if len(text) > MAX_ANSWER_CHARS:
        return None
    text = _strip_emphasis(text).replace("{,}", ",").replace("\\,", ",").replace("\\%", " ").replace("%", " ")
    text = _unwrap_parentheses(_frac_to_slash(_strip_latex(text)).strip().rstrip(".")).strip()
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
    if _changes_value(rest + " " + " ".join(trailing)):
        return None
    return -value if negative else value


def _normalize_text(text):
    """Whitespace-, emphasis- and LaTeX-insensitive form of a non-numeric answer."""
    return "".join(_strip_latex(_strip_emphasis(text)).split()).rstrip(".")


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
# answer checkers: which answers a completion may give (extract_answer's forms) and when one equals the gold


class AnswerChecker(NamedTuple):
    forms: tuple[str, ...]  # extract_answer's forms
    equiv: Callable[[str | None, str], bool]  # (pred, gold) -> bool


# the config key answer_checker names one: "gsm8k" (numbers, rewards.is_equiv) or "math" (MATH's LaTeX answers,
# math_answers.is_equiv_math: x = 11 is 11, \dfrac{\pi}{2} is \frac{\pi}{2}); a MATH run must say "math"
ANSWER_CHECKERS = MappingProxyType({"gsm8k": AnswerChecker(DEFAULT_FORMS, is_equiv),
                                    "math": AnswerChecker(MATH_FORMS, is_equiv_math)})


def answer_checker_of(name: str) -> AnswerChecker:
    """The AnswerChecker that ANSWER_CHECKERS names; a ValueError for another name."""
    if name not in ANSWER_CHECKERS:
        raise ValueError(f"unknown answer_checker {name!r}; known checkers are {sorted(ANSWER_CHECKERS)}")
    return ANSWER_CHECKERS[name]


def final_answer(completion: str, template: Template = R1_ZERO, answer_checker: str = "gsm8k") -> str | None:
    """The answer that correctness_reward compares with the gold: extract_answer with the checker's forms."""
    return extract_answer(completion, answer_checker_of(answer_checker).forms, template)

# -----------------------------------------------------------------------------
# rewards: one signature (completion, gold, truncated=False, template=R1_ZERO) -> float


def correctness_reward(completion: str, gold: str, truncated: bool = False, template: Template = R1_ZERO,
                       answer_checker: str = "gsm8k") -> float:
    """1.0 if the completion's final answer (extract_answer, in template's tags) equals gold (a final-answer string
    like "1,600"), else 0.0. A truncated completion never finished its answer, so it earns nothing.
    answer_checker (ANSWER_CHECKERS): "gsm8k" (the default: every form of extract_answer, rewards.is_equiv) or
    "math" (MATH_FORMS, math_answers.is_equiv_math)."""
    if truncated:
        return 0.0
    forms, equiv = answer_checker_of(answer_checker)
    return 1.0 if equiv(extract_answer(completion, forms, template), gold) else 0.0


def format_reward(completion: str, gold: str, truncated: bool = False, template: Template = R1_ZERO) -> float:
    """
    1.0 for the template's layout, R1-Zero's "<think>...</think> <answer>...</answer>" by default, else 0.0:
    each of the four tags exactly once and in that order, only whitespace before <think>, between </think> and
    <answer>, and after </answer>; a non-empty answer. gold and truncated are ignored: layout is
    judged on the text alone.
    """
    (think_open, think_close), (answer_open, answer_close) = template.think, template.answer
    if any(completion.count(tag) != 1 for tag in (think_open, think_close, answer_open, answer_close)):
        return 0.0
    before, _, rest = completion.partition(think_open)
    _, think_closed, rest = rest.partition(think_close)  # each tag occurs once, so a miss means bad order
    between, answer_opened, rest = rest.partition(answer_open)
    answer, answer_closed, after = rest.partition(answer_close)
    in_order = think_closed and answer_opened and answer_closed
    only_whitespace_outside = not (before.strip() or between.strip() or after.strip())
    return 1.0 if in_order and only_whitespace_outside and answer.strip() else 0.0


REWARD_FUNCTIONS = MappingProxyType({"correctness": correctness_reward, "format": format_reward})
SHOWN_CHARS = 200  # of a completion quoted in an error message


def _shown(completion):
    return repr(completion if len(completion) <= SHOWN_CHARS else completion[:SHOWN_CHARS] + "...")


# what a reward function may read beyond the completion and the gold answer, each by naming it as a parameter
REWARD_INFO = ("question", "truncated", "length", "max_new_tokens", "template", "answer_checker")  # per completion
BATCHED_REWARD_INFO = ("truncated", "lengths", "max_new_tokens", "template",  # batched, after (completions, golds,
                       "answer_checker")  # questions)


def reward_keywords(function, batched: bool, available=None) -> set[str]:
    """The names of REWARD_INFO (batched: BATCHED_REWARD_INFO) that a reward function names as parameters; with
    **kwargs it gets every one in available as well."""
    known = BATCHED_REWARD_INFO if batched else REWARD_INFO
    parameters = inspect.signature(function).parameters.values()
    named = {p.name for p in parameters if p.name in known and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if available is not None and any(p.kind is p.VAR_KEYWORD for p in parameters):
        named |= set(known) & set(available)
    return named


def _row(info, i, batched):
    """The REWARD_INFO values of completion i: lists for a batched reward run on that row alone."""
    one = {"question": info["questions"][i], "truncated": info["truncated"][i], "length": info["lengths"][i]}
    if batched:
        one = {"truncated": [one["truncated"]], "lengths": [one["length"]]}
    return {**info, **one}


def _raises_alone(function, completion, gold, question, row):
    try:
        function([completion], [gold], [question], **row)
    except Exception:
        return True
    return False


def _reward_values(name, function, completions, golds, info, available):
    """One reward's N values, each checked to be a finite number; a RuntimeError names the reward and the completion.
    info: the batch's REWARD_INFO and BATCHED_REWARD_INFO values, lists for questions, truncated and lengths;
    available: the names of those the caller gave (a **kwargs reward gets these)."""
    batched = getattr(function, "batched", False)
    wanted = reward_keywords(function, batched, available)
    if batched:
        try:
            values = function(list(completions), list(golds), list(info["questions"]),
                              **{key: info[key] for key in wanted})
        except Exception as error:  # find the completion it fails on, to name it
            culprit = next((c for i, (c, g, q) in enumerate(zip(completions, golds, info["questions"]))
                            if _raises_alone(function, c, g, q, {k: _row(info, i, True)[k] for k in wanted})), None)
            where = f"on completion {_shown(culprit)}" if culprit is not None else \
                f"on a batch of {len(completions)} completions (none fails alone; the first: {_shown(completions[0])})"
            raise RuntimeError(f"reward {name!r} raised {type(error).__name__}: {error} {where}") from error
        if not hasattr(values, "__len__") or len(values) != len(completions):
            raise RuntimeError(f"reward {name!r} returned {values!r:.80} for {len(completions)} completions (the "
                               f"first: {_shown(completions[0])}): a batched reward returns one value per completion")
    else:
        values = []
        for i, (completion, gold) in enumerate(zip(completions, golds)):
            row = _row(info, i, False)
            try:
                values.append(function(completion, gold, **{key: row[key] for key in wanted}))
            except Exception as error:
                raise RuntimeError(f"reward {name!r} raised {type(error).__name__}: {error} on completion "
                                   f"{_shown(completion)}") from error
    for value, completion in zip(values, completions):
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise RuntimeError(f"reward {name!r} returned {value!r} for completion {_shown(completion)}: a reward "
                               "must be a finite number")
    return [float(value) for value in values]


def score_completions(completions: list[str], golds: list[str], truncated: list[bool], weights: dict[str, float],
                      questions: list[str] | None = None, functions=None, template: Template = R1_ZERO,
                      lengths: list[int] | None = None, max_new_tokens: int | None = None,
                      answer_checker: str | None = None) -> tuple[list[float], dict[str, list[float]]]:
    """
    Weighted sum of rewards per completion: total_i = sum over names of weights[name] * reward_name(completion_i).
    completions, golds, truncated (and questions, the problems' text; lengths, the completions' token counts):
    equal-length sequences (N,); weights: {reward name: weight}, each name a built-in (REWARD_FUNCTIONS) or a key of
    functions, a mapping {name: callable} of loaded rewards (reward_models.load_rewards) of either form:
      per completion  function(completion, gold) -> float
      batched         function(completions, golds, questions) -> N floats, marked by an attribute batched = True
    A function may also read, by naming them as parameters (or all of them, with **kwargs), REWARD_INFO:
    question, truncated (cut at max_new_tokens), length (tokens, stop token included), max_new_tokens and template
    (the template.Template the completions were asked to follow; the rules read their tags from it) and
    answer_checker (ANSWER_CHECKERS' name: how correctness_reward reads and compares answers; None is "gsm8k", and
    a **kwargs function gets it only when it is given); batched ones
    BATCHED_REWARD_INFO, with lists of truncated flags and lengths. E.g. def short(completion, gold, length,
    max_new_tokens): return 1 - length / max_new_tokens.
    A reward that raises, returns a value that is not a finite number (NaN, inf, None, a string) or the wrong number
    of values stops here with a RuntimeError naming the reward and the completion.
    Returns (totals: list of N floats, components: {name: list of N unweighted rewards}).
    """
    functions = {**(functions or {}), **REWARD_FUNCTIONS}
    unknown = sorted(set(weights) - set(functions))
    if unknown:
        raise ValueError(f"unknown reward name(s) {unknown}; known rewards are {sorted(functions)}")
    if not weights:
        raise ValueError("weights is empty: name at least one reward from REWARD_FUNCTIONS")
    sizes = [len(x) for x in (completions, golds, truncated, questions, lengths) if x is not None]
    if len(set(sizes)) > 1:
        raise ValueError(f"completions, golds, truncated (and questions, lengths) must have equal lengths, got {sizes}")
    n = len(completions)
    answer_checker_of(answer_checker or "gsm8k")  # an unknown name stops here
    info = {"questions": list(questions) if questions is not None else None, "truncated": list(truncated),
            "lengths": list(lengths) if lengths is not None else None, "max_new_tokens": max_new_tokens,
            "template": template, "answer_checker": answer_checker or "gsm8k"}
    for name in weights:  # what a reward reads must have been given
        batched = getattr(functions[name], "batched", False)
        reads = reward_keywords(functions[name], batched) | ({"questions"} if batched else set())
        for key, given in (("questions", "questions"), ("question", "questions"), ("length", "lengths"),
                           ("lengths", "lengths"), ("max_new_tokens", "max_new_tokens")):
            if key in reads and info[given] is None:
                raise ValueError(f"reward {name!r} reads the {key}: pass {given}= to score_completions")
    available = {"truncated", "template", *(["question", "questions"] if questions is not None else []),
                 *(["length", "lengths"] if lengths is not None else []),
                 *(["max_new_tokens"] if max_new_tokens is not None else []),
                 *(["answer_checker"] if answer_checker is not None else [])}
    info = {**info, **{key: [None] * n for key in ("questions", "lengths") if info[key] is None}}
    components = {name: _reward_values(name, functions[name], completions, golds, info, available) for name in weights}
    totals = [sum(weights[name] * components[name][i] for name in weights) for i in range(len(completions))]
    for i, total in enumerate(totals):
        if not math.isfinite(total):
            raise RuntimeError(f"the weighted reward total is {total} for the completion {_shown(completions[i])}: "
                               f"the rewards {({name: components[name][i] for name in weights})} with the weights "
                               f"{weights} overflow; scale the rewards or the weights down")
    return totals, components

# -----------------------------------------------------------------------------
# process supervision: every arithmetic claim is a reasoning step, checked exactly

CLAIM_OPERATORS = {"+": "+", "-": "-", "\u2212": "-", "*": "*", "x": "*", "\u00d7": "*", "/": "/", "\u00f7": "/"}
ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
MAX_CLAIM_TOKENS = 99  # numbers, operators and brackets in one side of a claim: "1 + 2 + ... + 50" still reads
DIGITS = frozenset("0123456789")  # not str.isdigit: that also takes "²" and other scripts' digits


def _claim_tokens(text, start, end):
    """The tokens of text[start:end], each (kind, value, end offset): ("num", Fraction), ("op", one of "+-*/"),
    ("(", None), (")", None), or ("other", None) for what cannot be part of an expression (words, "<", ",", ...)."""
    tokens, i = [], start
    while i < end:
        char = text[i]
        if char.isspace() or (char == "$" and text[i + 1:i + 2] in DIGITS):
            i += 1
            continue
        signed = char in "+-\u2212" and text[i + 1:i + 2] in DIGITS and not (tokens and tokens[-1][0] in ("num", ")"))
        if char in DIGITS or signed or (char == "." and text[i + 1:i + 2] in DIGITS):  # a number, ".5" too
            digits_end = i + 1
            while digits_end < end and (text[digits_end] in DIGITS or text[digits_end] in ",."):
                digits_end += 1
            number = text[i + signed:digits_end].rstrip(",.")  # a trailing "," or "." is punctuation
            value = _leading_number(number)[0]
            i += signed + len(number)
            negative = char in "-\u2212"
            tokens.append(("num", -value if negative else value, i) if value is not None else ("other", None, i))
            continue
        if char in CLAIM_OPERATORS and not (char == "x" and (text[i - 1:i].isalpha() or text[i + 1:i + 2].isalpha())):
            kind, value = "op", CLAIM_OPERATORS[char]
        else:
            kind, value = (char, None) if char in "()" else ("other", None)
        i += 1
        tokens.append((kind, value, i))
    return tokens


def _apply(left, symbol, right):
    if left is None or right is None or (symbol == "/" and right == 0):
        return None  # a division by zero makes the whole expression's value unknown
    return ARITHMETIC[symbol](left, right)


def _expression(tokens, at, level=0):
    """The expression that starts at tokens[at], read exactly: (value, index just after it), or None if none starts
    there. Level 0 reads a sum of products, 1 a product of factors, 2 a factor (a number or a bracketed sum); an
    operator with nothing readable after it is left unread. The value is None after a division by zero."""
    if level == 2:
        if at < len(tokens) and tokens[at][0] == "num":
            return tokens[at][1], at + 1
        inner = _expression(tokens, at + 1) if at < len(tokens) and tokens[at][0] == "(" else None
        return (inner[0], inner[1] + 1) if inner and inner[1] < len(tokens) and tokens[inner[1]][0] == ")" else None
    parsed = _expression(tokens, at, level + 1)
    operators = "+-" if level == 0 else "*/"
    while parsed and parsed[1] < len(tokens) and tokens[parsed[1]][0] == "op" and tokens[parsed[1]][1] in operators:
        operand = _expression(tokens, parsed[1] + 1, level + 1)
        if operand is None:
            break
        parsed = _apply(parsed[0], tokens[parsed[1]][1], operand[0]), operand[1]
    return parsed


def _left_side(tokens):
    """(value, has an operator) of the longest expression that ends the tokens, or None. It must not follow an
    operator: it would go on into something unreadable ("a*2 = 10"), so its value is unknown; nor be longer than
    MAX_CLAIM_TOKENS, which bounds the work (and the brackets' recursion)."""
    after_other = max((i + 1 for i, token in enumerate(tokens) if token[0] == "other"), default=0)
    for start in range(max(after_other, len(tokens) - MAX_CLAIM_TOKENS), len(tokens)):
        parsed = _expression(tokens, start)
        if parsed and parsed[1] == len(tokens) and not (start and tokens[start - 1][0] == "op"):
            return parsed[0], any(token[0] == "op" for token in tokens[start:])
    return None


def _right_side(tokens):
    """(value, has an operator, end offset) of the longest expression that starts the tokens, or None; it must not
    be followed by an operator ("7 + apples"), nor be longer than MAX_CLAIM_TOKENS."""
    parsed = _expression(tokens[:MAX_CLAIM_TOKENS + 1], 0)
    if parsed is None or (parsed[1] < len(tokens) and tokens[parsed[1]][0] == "op") or parsed[1] > MAX_CLAIM_TOKENS:
        return None
    return parsed[0], any(token[0] == "op" for token in tokens[:parsed[1]]), tokens[parsed[1] - 1][2]


def arithmetic_claims(text: str) -> list[tuple[int, bool]]:
    """
    The arithmetic claims a text makes, in order, each as (end, correct): end is the offset just past the claim's
    last character, correct whether it holds exactly (Fraction arithmetic: no eval, no floats, no regex).
    A claim is an "=" between two expressions on one line, one of them with an operator: "3 * 4 = 12", "12+7=19",
    "$1,200 / 4 = $300", "1/2 + .25 = 3/4", "20 = 4 x 5", "(60+72+42)/3=58". An expression is numbers (thousands
    commas, decimals, a sign where no number precedes: "3*-2=-6") joined by + - * / x × ÷ −, * and / first, with
    brackets; "/" divides, so a fraction is its own value. Left of "=" the claim reads the longest expression ending
    there, right of it the longest one starting there, so words around it do not count ("Tom has 3+4=7 apples"), and
    a chain "3+4=7+1=8" is two claims, 3+4 = 7+1 (wrong) and 7+1 = 8 (right): "=" means equal. Not claims: no
    operator on either side ("x = 5", "7 = 7"), a side that is not an expression ("2x + 3 = 7", "a <= 5"), one cut
    at an operator ("a*2 = 10", "3+4 = 7 + apples") or longer than MAX_CLAIM_TOKENS. A division by zero makes a claim
    wrong. Time is linear in the text.
    """
    claims, previous, equals = [], -1, text.find("=")
    while equals >= 0:  # each side is read up to the neighbouring "=" or the line's end: linear in the text
        following = text.find("=", equals + 1)
        newline = text.rfind("\n", previous + 1, equals)
        left_start = max(newline, previous) + 1
        right_end = len(text) if following < 0 else following
        newline = text.find("\n", equals, right_end)
        right_end = right_end if newline < 0 else newline
        left = _left_side(_claim_tokens(text, left_start, equals))
        right = _right_side(_claim_tokens(text, equals + 1, right_end))
        if left and right and (left[1] or right[1]):
            claims.append((right[2], left[0] is not None and left[0] == right[0]))
        previous, equals = equals, following
    return claims


def shows_work(completion: str, template: Template = R1_ZERO) -> bool:
    """True if the completion writes an arithmetic claim (arithmetic_claims, right or wrong) before the template's
    think close, "</think>" (or anywhere, without one): it worked something out rather than stating an answer.
    Logged as worked_rate."""
    return bool(arithmetic_claims(completion.partition(template.think[1])[0]))


# Phrases that mark a re-check (reflection), after the self-reflection keywords with which Liu et al. 2025
# ("Understanding R1-Zero-Like Training", arXiv:2503.20783; Oat-Zero) counted reflection in base models' answers,
# plus "check" (configs/demo_aha.py's re-checks, data.rework_solution); config key reflection_markers
REFLECTION_MARKERS = ("wait", "check", "recheck", "re-check", "double-check", "double check", "check again",
                      "verify", "rethink", "reconsider", "re-examine", "reexamine", "re-evaluate", "reevaluate",
                      "reassess", "think again")


def reflects(completion: str, template: Template = R1_ZERO, markers: tuple = REFLECTION_MARKERS) -> bool:
    """True if the completion's text before the template's think close ("</think>"; all of it, without one) holds
    one of markers as whole words, in any case: "check 30-4=26", "Wait, 12 is wrong" and "Let me double-check" do,
    "checked", "checklist" and "awaited" do not; a hyphen joins a word ("re-check" is not "check"). Logged as
    reflect_rate (metrics.completion_flags)."""
    text = completion.partition(template.think[1])[0].lower()
    words = " " + " ".join("".join(c if c.isalnum() or c == "-" else " " for c in text).split()) + " "
    return any(f" {marker.lower()} " in words for marker in markers)


def token_ends(token_ids, decode, char_ends: list[int]) -> list[int]:
    """For each character offset end of the text decode(token_ids), the index of the token that writes its character
    end - 1: the shortest prefix of token_ids whose decoded text is at least end characters long. A prefix decodes
    to a prefix of the text (a token cut inside a multi-byte character decodes to one replacement character), so its
    length grows with the prefix and a binary search finds it; exact for any tokenizer whose decode does that."""
    return [bisect.bisect_left(range(len(token_ids)), end, key=lambda n: len(decode(token_ids[:n + 1])))
            for end in char_ends]


def claim_rewards(completion: str, token_ids, decode, truncated: bool = False) -> list[tuple[int, float]]:
    """
    Process supervision's rewards, rule-based: each arithmetic claim of the completion (arithmetic_claims) is a
    reasoning step rewarded 1.0 if it holds and 0.0 if not, ending at the token that writes its last character.
    completion: the decoded completion, decode(token_ids) without a final end-of-text token; token_ids: the
    completion's tokens, stop token included; decode: the tokenizer's decode.
    A completion that claims nothing, or was truncated, gets one claim of reward 0.0 at its last token: no checkable
    work earns what a wrong claim earns, so leaving the arithmetic out never escapes a negative advantage.
    Returns [(token index of the claim's last token, reward)], in order.
    """
    claims = [] if truncated else arithmetic_claims(completion)
    if not claims:
        return [(len(token_ids) - 1, 0.0)]
    ends = token_ends(token_ids, decode, [end for end, _ in claims])
    return [(end, 1.0 if correct else 0.0) for end, (_, correct) in zip(ends, claims)]

# -----------------------------------------------------------------------------
# the gold answer of a GSM8K solution


def gold_from_solution(solution_text: str) -> str:
    """The final answer of a GSM8K solution: the rest of the line after its last '####'."""
    _, marker, tail = solution_text.rpartition("####")
    answer = tail.partition("\n")[0].strip()
    if not marker or not answer:
        raise ValueError(f"GSM8K solution has no final answer after '####': ...{solution_text[-80:]!r}")
    return answer
