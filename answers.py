"""
Reading what a completion says, without regex and without sympy: its final answer (extract_answer),
the single number an answer states (parse_number), whether it equals the gold answer (is_equiv;
MATH's LaTeX answers: math_answers.is_equiv_math), and a GSM8K solution's gold (gold_from_solution).
An answer checker (ANSWER_CHECKERS, config key answer_checker) pairs the forms an answer may take
with the equivalence that judges it. is_equiv matches a numeric gold exactly (Fraction arithmetic:
0.5 == 1/2, 0.3333 != 1/3) by an answer that states one single number, and any other gold after
whitespace and LaTeX normalisation.

The reward is the only teacher, so every rule here leans towards "no answer" when in doubt: a false
positive teaches the policy to cheat, a false negative only slows it down. Time is linear in the
completion: whole-text work is str.find/rfind/split/count (C speed); only short candidate answers
(at most MAX_ANSWER_CHARS) are scanned character by character in Python.

How extract_answer reads, against gaming (the template names the tags, written here as R1-Zero's):
  - An <answer> tag, when "<answer>" or "</answer>" occurs at all, is authoritative: if it is
    empty, unclosed, nested or longer than MAX_ANSWER_CHARS the result is None, never a number
    from the think block.
  - Several <answer> tags must all hold the same content, else None (hedging across tags).
  - Inside the tag, the other forms are unwrapped (<answer>\\boxed{7}</answer> gives "7");
    without any of them the whole tag content is the answer (no last_sentence reading in a tag).
    Several markers in one tag must agree (same number, or same text): <answer>\\boxed{3} or
    \\boxed{4}</answer>, "#### 3 #### 4" and "the answer is 3. No, the answer is 4" give None,
    as does an unclosed \\boxed{ there. A marker holding nothing but another ("answer is
    $\\boxed{7}$") defers to it.
  - Without a tag, the marker that occurs last in the text wins, over all forms (later
    self-correction is allowed in reasoning). A later unclosed (or over-long) \\boxed{ is
    skipped, looking back at most MAX_BOXED_TRIES markers; an empty winner, or a "####"/"answer
    is" line longer than MAX_ANSWER_CHARS, gives None rather than falling back to an earlier
    answer or to the last sentence.
  - last_sentence is the fallback for chat models that state the result in prose. It is a
    default form because it never overrides a marker: it applies only when no tag and no marker
    occurs at all. The sentence (split at newlines and ". ", "! ", "? "; at most
    MAX_ANSWER_CHARS) must not be a question, nor sit in an unclosed <think> block; the text
    before its first number must not bound or hedge it (BOUND_WORDS: "about", "at least", "more
    than", "up to", "not", number words...; "~", "<", "≈"; a detached sign); from that number
    on, parse_number must read exactly one number. Listing numbers gains nothing: "70. 71. 72."
    is read as its last sentence, "72", exactly as "72." alone would be.
  - Hedging inside one answer ("3 or 4", "1, 2, 3", "about 72") is left to parse_number, which
    rejects it.
"""
from fractions import Fraction
from types import MappingProxyType
from typing import Callable, NamedTuple

from math_answers import is_equiv_math
from template import R1_ZERO, Template

MAX_ANSWER_CHARS = 200  # a longer candidate answer is not an answer, and caps the per-span work
# unclosed \boxed{ markers examined before giving up, so junk cannot cost O(n^2)
MAX_BOXED_TRIES = 4
DEFAULT_FORMS = ("answer_tag", "boxed", "hash", "answer_is", "last_sentence")
# answer_checker="math" reads these: MATH's answers are LaTeX, GSM8K's "####" is not MATH's, and
# last_sentence reads a sentence from its first digit on ("The area is $\pi r^2 = 4\pi$." would give
# "r^2 = 4\pi$."); a boxed answer (MATH's own solutions, Qwen2.5-Math's habit) counts, in the answer
# tag or without one
MATH_FORMS = ("answer_tag", "boxed", "answer_is")
ANSWER_IS_VARIANTS = ("answer is", "Answer is", "ANSWER IS")
SENTENCE_ENDS = ("\n", ". ", "! ", "? ")
# after the number, these (or any digit) mean "more than a number"
TRAILING_FORBIDDEN = "=^!\\+*?~<>≈≤≥±≠×÷"
BOUND_CHARS = "~<>≈≤≥±≠"  # before the number in a sentence: it is approximated or bounded
TEXT_WRAPPERS = ("\\text{", "\\textbf{", "\\mathrm{", "\\mbox{")
LATEX_NOISE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", "\\$", "$", "\\(", "\\)", "\\[",
               "\\]", "^\\circ", "^{\\circ}", "°")
# Words that change or hedge the number they follow: operators, bounds, approximations, doubt,
# negation, magnitudes and number words (a second number). "more", "fewer" and "times" are absent on
# purpose: "72 more apples" and "72 times" answer GSM8K's "how many more" and "how many times"
# questions.
VALUE_WORDS = frozenset("""
    or nor plus minus squared cubed divided multiplied least most max maximum minimum above below
    upwards approximately approx roughly circa ish odd maybe perhaps probably possibly likely not
    never if unless wrong incorrect half thousand thousands million millions billion billions
    trillion trillions hundred hundreds grand lakh crore zero one two three four five six seven
    eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen
    twenty thirty forty fifty sixty seventy eighty ninety
""".split())
# matched with case: "72 m" is metres
MAGNITUDE_SYMBOLS = frozenset(("k", "K", "M", "B", "bn", "mn"))
# Words that bound or hedge a number they precede in a sentence ("more than 72", "up to 72", "about
# 72").
BOUND_WORDS = VALUE_WORDS | frozenset("""
    more less fewer than over under up about around nearly almost between either no twice double
    triple thrice times guess estimate estimated suppose assume sim simeq le leq ge geq ne neq lt gt
    pm
""".split())

# -----------------------------------------------------------------------------
# answer extraction


def _braced(text, open_at):
    """Content of the brace group opening at text[open_at] == '{', or None if unclosed within the
    cap."""
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


# form -> (its marker strings, reader of the answer after a marker at a position; None if
# unreadable)
FORM_MARKERS = MappingProxyType({"boxed": (("\\boxed{", "\\fbox{"), _boxed_answer),
                                 "hash": (("####",), _hash_answer),
                                 "answer_is": (ANSWER_IS_VARIANTS, _answer_is_answer)})


def _occurs(text, marker):
    """marker in text, by rfind: several times faster than `in` on long texts."""
    return text.rfind(marker) >= 0


def _last_hit(text, form):
    """(position, answer) of the last readable marker of form, skipping at most MAX_BOXED_TRIES
    unreadable ones."""
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
    """answer up to the first marker nested in it: in "#### 3 #### 4" the first marker states
    "3"."""
    return answer[:min((answer.find(marker) for marker in markers if marker in answer),
                       default=len(answer))]


def _same_answer(first, second):
    """Whether two answers state the same number, or the same text when neither is a number."""
    first_value, second_value = parse_number(first), parse_number(second)
    if first_value is not None or second_value is not None:
        return first_value == second_value
    return _normalize_text(first) == _normalize_text(second)


def _tag_answer(content, forms):
    """The answer inside an <answer> tag: its markers' answer if they agree (None if they do not, or
    if one is unreadable), else the whole content. A marker wrapping another ("answer is
    $\\boxed{7}$") defers to it."""
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
    """Stripped content of the answer tag(s) (tags: open, close); None if malformed, empty, too long
    or ambiguous."""
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
    """Whether text holds a whole word from words (any case), a magnitude symbol (72k, 72M) or a
    negation (n't)."""
    letters = "".join(ch if ch.isalpha() or ch in "'’" else " " for ch in text)
    for word in letters.split():
        word = word.strip("'’")
        lower = word.lower()
        if lower in words or word in MAGNITUDE_SYMBOLS or lower.endswith(("n't", "n’t")):
            return True
    return False


def _bounds_value(prefix):
    """Whether the words before a number in a sentence bound, hedge or negate it, or carry its sign
    apart."""
    return (any(ch in BOUND_CHARS for ch in prefix)
            or prefix.rstrip().endswith(("-", "+", "\u2212"))
            or _has_value_word(prefix, BOUND_WORDS))


def _last_sentence_answer(text, think):
    """The last sentence of the text from its first number on, or None (extract_answer)."""
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
    first_digit = min((at for at in (sentence.find(digit) for digit in "0123456789") if at >= 0),
                      default=-1)
    if first_digit < 0:
        return None
    token_start = max(sentence.rfind(" ", 0, first_digit), sentence.rfind("\t", 0, first_digit)) + 1
    return None if _bounds_value(sentence[:token_start]) else sentence[token_start:]


def extract_answer(text: str, forms: tuple[str, ...] = DEFAULT_FORMS,
                   template: Template = R1_ZERO) -> str | None:
    """The final answer string in a completion, or None (forms: module docstring)."""
    if not set(forms) <= set(DEFAULT_FORMS):
        raise ValueError(f"unknown answer form(s) {sorted(set(forms) - set(DEFAULT_FORMS))}; known "
                         f"forms are {DEFAULT_FORMS}")
    marked_forms = [form for form in forms if form in FORM_MARKERS]
    if ("answer_tag" in forms
        and (_occurs(text, template.answer[0]) or _occurs(text, template.answer[1]))):
        content = _answer_tag_content(text, template.answer)
        return None if content is None else _tag_answer(content, marked_forms)
    if any(_occurs(text, marker) for form in marked_forms for marker in FORM_MARKERS[form][0]):
        return _last_marked(text, marked_forms)
    return _last_sentence_answer(text, template.think) if "last_sentence" in forms else None

# -----------------------------------------------------------------------------
# equivalence


def _strip_latex(text):
    """Replace LaTeX noise ($, \\(, \\left, \\text{} wrappers, degree signs) by spaces, so that
    removing it never joins two digit runs, and unify minus signs / \\frac."""
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
    """Replace markdown emphasis (runs of * and _ at a word's edge: **72**, _72_) by spaces. A run
    between two letters/digits or two spaces is an operator or a subscript (2*3, 2 * 3, 7**2, x_1)
    and is kept."""
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
    """'(72)', '(72 apples)', '(72) apples' -> the same without that leading, unnested parenthesis
    pair."""
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
    if (len(groups) > 1
        and not (1 <= len(groups[0]) <= 3 and all(len(group) == 3 for group in groups[1:]))):
        return None
    joined = "".join(groups)
    return int(joined) if joined.isdecimal() and joined.isascii() else None


def leading_number(token):
    """Split a token into its leading unsigned number and the rest: '18cm' -> (18, 'cm'), or (None,
    token)."""
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
    # one Fraction per number: Fraction arithmetic is slow in pure Python
    scale = 10 ** len(decimals)
    return Fraction(value * scale + (int(decimals) if decimals else 0), scale), rest


def _changes_value(tail):
    """Whether the text after a number adds to, bounds or hedges it: a second number (digits or
    words), an operator, a doubt or a magnitude ("72 or more", "72 squared", "72-ish", "72
    thousand", "72k")."""
    return (any(ch.isdigit() or ch in TRAILING_FORBIDDEN for ch in tail)
            or _has_value_word(tail, VALUE_WORDS))


def parse_number(text: str) -> Fraction | None:
    """
    The single number a short answer string states, as an exact Fraction, or None. Accepts: sign (+,
    -, unicode minus), $, thousands commas ("1,000"; "1.000" is 1), decimals, "3/4",
    \\frac/\\dfrac/\\tfrac, mixed numbers ("2 1/2", "2\\frac{1}{2}"), a percent sign (dropped), and
    trailing units or nouns ("18 dollars", "18cm", "18 apples.", "5 dozen", "72 more", "72 times").
    Wrappers that do not change the value are removed: markdown emphasis at a word's edge ("**72**",
    "*72*", "__72__", "**72** apples"), inline math "\\(72\\)", "\\[72\\]", "$72$", and one leading
    pair of parentheses ("(72)", "(72 apples)"). Rejects (None), leaning to 0.0 when in doubt:
      - a second number or an operator after the first ("3 or 4", "1, 2, 3", "5^2", "2+3", "72 *
        x"), including number words ("72 plus one") and superscripts ("72²");
      - leading words or signs of doubt ("x = 5", "about 72", "~72", "≈72", "approximately 72");
      - trailing words that change, bound or hedge the value, matched as whole words (VALUE_WORDS:
        "72 or more", "72 squared", "at least"/"at most", "72-ish", "72 or so", "72, approximately",
        "72 (not counting...)"); units and nouns are not in that closed list, so they pass;
      - magnitudes, never scaled: "72 thousand", "72k", "72K", "72M", "1.5 billion", "72 bn" are
        refused, because "72k" read as 72 is wrong and read as 72000 clashes with units (72 m is
        metres);
      - digits joined across removed noise: noise becomes a space, so "7%2", "7$2", "7°2" are two
        numbers; "\\," and "{,}" are thousands separators ("1\\,000" is 1000), checked like commas
        ("7\\,2").
    """
    if len(text) > MAX_ANSWER_CHARS:
        return None
    text = (_strip_emphasis(text).replace("{,}", ",").replace("\\,", ",")
            .replace("\\%", " ").replace("%", " "))
    text = _unwrap_parentheses(_frac_to_slash(_strip_latex(text)).strip().rstrip(".")).strip()
    negative = text.startswith("-")
    tokens = (text[1:] if text[:1] in ("+", "-") else text).split()
    if not tokens:
        return None
    value, rest = leading_number(tokens[0])
    trailing = tokens[1:]
    if value is None:
        return None
    if not rest and trailing and "/" in trailing[0] and tokens[0].isdecimal():  # mixed number
        fraction, fraction_rest = leading_number(trailing[0])
        if fraction is not None and 0 < fraction < 1:
            value, rest, trailing = value + fraction, fraction_rest, trailing[1:]
    if _changes_value(rest + " " + " ".join(trailing)):
        return None
    return -value if negative else value


def _normalize_text(text):
    """Whitespace-, emphasis- and LaTeX-insensitive form of a non-numeric answer."""
    return "".join(_strip_latex(_strip_emphasis(text)).split()).rstrip(".")


def is_equiv(pred: str | None, gold: str) -> bool:
    """Whether pred states gold: a number exactly (0.5 == 1/2), text after normalisation."""
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
# answer checkers: which answers a completion may give (extract_answer's forms) and when one equals
# the gold


class AnswerChecker(NamedTuple):
    forms: tuple[str, ...]  # extract_answer's forms
    equiv: Callable[[str | None, str], bool]  # (pred, gold) -> bool


# the config key answer_checker names one: "gsm8k" (numbers, answers.is_equiv) or "math" (MATH's
# LaTeX answers, math_answers.is_equiv_math: x = 11 is 11, \dfrac{\pi}{2} is \frac{\pi}{2}); a MATH
# run must say "math"
ANSWER_CHECKERS = MappingProxyType({"gsm8k": AnswerChecker(DEFAULT_FORMS, is_equiv),
                                    "math": AnswerChecker(MATH_FORMS, is_equiv_math)})


def answer_checker_of(name: str) -> AnswerChecker:
    """ANSWER_CHECKERS[name], or a ValueError naming the known ones."""
    if name not in ANSWER_CHECKERS:
        raise ValueError(f"unknown answer_checker {name!r}; known checkers are "
                         f"{sorted(ANSWER_CHECKERS)}")
    return ANSWER_CHECKERS[name]


def final_answer(completion: str, template: Template = R1_ZERO,
                 answer_checker: str = "gsm8k") -> str | None:
    """The answer that correctness_reward compares with the gold: extract_answer with the checker's
    forms."""
    return extract_answer(completion, answer_checker_of(answer_checker).forms, template)


# -----------------------------------------------------------------------------
# the gold answer of a GSM8K solution


def gold_from_solution(solution_text: str) -> str:
    """The final answer of a GSM8K solution: the rest of the line after its last '####'."""
    _, marker, tail = solution_text.rpartition("####")
    answer = tail.partition("\n")[0].strip()
    if not marker or not answer:
        raise ValueError("GSM8K solution has no final answer after '####': "
                         f"...{solution_text[-80:]!r}")
    return answer
