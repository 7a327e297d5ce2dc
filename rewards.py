"""
The rewards of R1-Zero-style RL on math problems, rule-based: the final answer's correctness (read
and compared by answers.py), the layout (format), and the arithmetic claims a solution makes along
the way (the reasoning steps of process supervision); score_completions weighs them, and a config's
own rewards (reward_models.py), per completion. Every rule leans towards 0.0 when in doubt: a false
positive teaches the policy to cheat, a false negative only slows it down. Also here: the yes/no
properties of a completion that the logs count (shows_work, reflects).

The rules: correctness_reward is 1.0 when the final answer (answers.extract_answer, in the
template's tags) equals the gold one ("1,600") under the config's answer checker, and a truncated
completion earns 0.0 (it never finished its answer); format_reward is 1.0 for the template's layout,
R1-Zero's "<think>...</think> <answer>...</answer>": each of the four tags exactly once and in that
order, only whitespace before <think>, between </think> and <answer> and after </answer>, and a
non-empty answer. score_completions returns each completion's weighted sum and every reward's
unweighted values; a reward that raises or returns anything but N finite numbers is a RuntimeError
naming it and the completion.
"""
import bisect
import inspect
import math
import numbers
import operator
import os
from types import MappingProxyType

# extract_answer and is_equiv are rewards.py's too: users and outside checks call them from here
from answers import (ANSWER_CHECKERS, answer_checker_of, extract_answer, is_equiv,  # noqa: F401
                     leading_number)
from template import R1_ZERO, Template, template_of

# -----------------------------------------------------------------------------
# scoring a rollout: every reward a config weighs, on every completion


def score_completions(completions: list[str], golds: list[str], truncated: list[bool],
                      weights: dict[str, float], questions: list[str] | None = None, functions=None,
                      template: Template = R1_ZERO, lengths: list[int] | None = None,
                      max_new_tokens: int | None = None, answer_checker: str | None = None,
                      check: bool = True) -> tuple[list[float], dict]:
    """N completions' rewards -> (totals: sum of weight * reward; {name: N unweighted rewards})."""
    functions = functions or {}
    if check:
        _check_scoring(completions, golds, truncated, questions, lengths, weights, functions)
    checker = answer_checker or "gsm8k"
    own = [name for name in weights if name in functions]
    if own:
        info, available = _reward_info(own, functions, truncated, questions, lengths,
                                       max_new_tokens, template, answer_checker)
    components = {}
    for name in weights:
        rows = zip(completions, golds, truncated)
        if name == "correctness":
            components[name] = [correctness_reward(c, g, t, template, checker) for c, g, t in rows]
        elif name == "format":
            components[name] = [format_reward(c, g, t, template) for c, g, t in rows]
        else:
            components[name] = _reward_values(name, functions[name], completions, golds, info,
                                              available)
    totals = [sum(weights[name] * components[name][i] for name in weights)
              for i in range(len(completions))]
    if not all(map(math.isfinite, totals)):
        raise RuntimeError(_overflow(totals, components, weights, completions))
    return totals, components


def _overflow(totals, components, weights, completions) -> str:
    """What score_completions says of the first weighted total that is not finite."""
    i = next(i for i, total in enumerate(totals) if not math.isfinite(total))
    rewards = {name: components[name][i] for name in weights}
    return (f"the weighted reward total is {totals[i]} for the completion "
            f"{_shown(completions[i])}: the rewards {rewards} with the weights {weights} overflow; "
            "scale the rewards or the weights down")


def _check_scoring(completions, golds, truncated, questions, lengths, weights, functions):
    """score_completions' arguments: N of each list, and every weighed name a reward."""
    sizes = [len(x) for x in (completions, golds, truncated, questions, lengths) if x is not None]
    if len(set(sizes)) > 1:
        raise ValueError("completions, golds, truncated (and questions, lengths) must have equal "
                         f"lengths, got {sizes}")
    for name in weights:
        if name not in REWARD_FUNCTIONS and name not in functions:
            raise ValueError(f"unknown reward name {name!r}; known rewards are "
                             f"{sorted({*REWARD_FUNCTIONS, *functions})}")


SHOWN_CHARS = 200  # of a completion quoted in an error message


def _shown(completion):
    return repr(completion if len(completion) <= SHOWN_CHARS else completion[:SHOWN_CHARS] + "...")


# what a reward function may read beyond the completion and the gold answer, each by naming it as a
# parameter
# per completion
REWARD_INFO = ("question", "truncated", "length", "max_new_tokens", "template", "answer_checker")
# batched, after (completions, golds,
BATCHED_REWARD_INFO = ("truncated", "lengths", "max_new_tokens", "template",
                       "answer_checker")  # questions)


def reward_keywords(function, batched: bool, available=None) -> set[str]:
    """The names of REWARD_INFO (batched: BATCHED_REWARD_INFO) that a reward function names as
    parameters; with **kwargs it gets every one in available as well."""
    known = BATCHED_REWARD_INFO if batched else REWARD_INFO
    parameters = inspect.signature(function).parameters.values()
    named = {p.name for p in parameters
             if p.name in known and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if available is not None and any(p.kind is p.VAR_KEYWORD for p in parameters):
        named |= set(known) & set(available)
    return named


def _row(info, i, batched):
    """The REWARD_INFO values of completion i: lists for a batched reward run on that row alone."""
    one = {"question": info["questions"][i], "truncated": info["truncated"][i],
           "length": info["lengths"][i]}
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
    """One reward's N values, each checked to be a finite number; a RuntimeError names the reward
    and the completion. info: the batch's REWARD_INFO and BATCHED_REWARD_INFO values, lists for
    questions, truncated and lengths; available: the names of those the caller gave (a **kwargs
    reward gets these)."""
    batched = getattr(function, "batched", False)
    wanted = reward_keywords(function, batched, available)
    if batched:
        try:
            values = function(list(completions), list(golds), list(info["questions"]),
                              **{key: info[key] for key in wanted})
        except Exception as error:  # find the completion it fails on, to name it
            culprit = None
            for i, (c, g, q) in enumerate(zip(completions, golds, info["questions"])):
                row = {k: _row(info, i, True)[k] for k in wanted}
                if _raises_alone(function, c, g, q, row):
                    culprit = c
                    break
            if culprit is not None:
                where = f"on completion {_shown(culprit)}"
            else:
                where = (f"on a batch of {len(completions)} completions (none fails alone; "
                         f"the first: {_shown(completions[0])})")
            raise RuntimeError(f"reward {name!r} raised {type(error).__name__}: {error} "
                               f"{where}") from error
        if not hasattr(values, "__len__") or len(values) != len(completions):
            raise RuntimeError(f"reward {name!r} returned {values!r:.80} for {len(completions)} "
                               f"completions (the first: {_shown(completions[0])}): a batched "
                               "reward returns one value per completion")
    else:
        values = []
        for i, (completion, gold) in enumerate(zip(completions, golds)):
            row = _row(info, i, False)
            try:
                values.append(function(completion, gold, **{key: row[key] for key in wanted}))
            except Exception as error:
                raise RuntimeError(f"reward {name!r} raised {type(error).__name__}: {error} on "
                                   f"completion {_shown(completion)}") from error
    for value, completion in zip(values, completions):
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise RuntimeError(f"reward {name!r} returned {value!r} for completion "
                               f"{_shown(completion)}: a reward must be a finite number")
    return [float(value) for value in values]


def _reward_info(names, functions, truncated, questions, lengths, max_new_tokens, template,
                 answer_checker):
    """What the config's own rewards may read (REWARD_INFO, lists for the batch), and the names of
    what the caller gave; a ValueError when one of them reads something not given."""
    n = len(truncated)
    info = {"questions": list(questions) if questions is not None else None,
            "truncated": list(truncated),
            "lengths": list(lengths) if lengths is not None else None,
            "max_new_tokens": max_new_tokens,
            "template": template, "answer_checker": answer_checker or "gsm8k"}
    for name in names:
        batched = getattr(functions[name], "batched", False)
        reads = reward_keywords(functions[name], batched) | ({"questions"} if batched else set())
        for key, given in (("questions", "questions"), ("question", "questions"),
                           ("length", "lengths"),
                           ("lengths", "lengths"), ("max_new_tokens", "max_new_tokens")):
            if key in reads and info[given] is None:
                raise ValueError(f"reward {name!r} reads the {key}: pass {given}= to "
                                 "score_completions")
    available = {"truncated", "template",
                 *(["question", "questions"] if questions is not None else []),
                 *(["length", "lengths"] if lengths is not None else []),
                 *(["max_new_tokens"] if max_new_tokens is not None else []),
                 *(["answer_checker"] if answer_checker is not None else [])}
    return {**info,
            **{key: [None] * n for key in ("questions", "lengths") if info[key] is None}}, available


# -----------------------------------------------------------------------------
# the rule rewards: one signature (completion, gold, truncated=False, template=R1_ZERO) -> float


def correctness_reward(completion: str, gold: str, truncated: bool = False,
                       template: Template = R1_ZERO, answer_checker: str = "gsm8k") -> float:
    """1.0 if the final answer equals gold by answer_checker, else 0.0 (truncated: 0.0)."""
    if truncated:
        return 0.0
    forms, equiv = answer_checker_of(answer_checker)
    return 1.0 if equiv(extract_answer(completion, forms, template), gold) else 0.0


def format_reward(completion: str, gold: str, truncated: bool = False,
                  template: Template = R1_ZERO) -> float:
    """1.0 for the template's layout, "<think>...</think> <answer>...</answer>", else 0.0."""
    think_open, think_close = template.think
    answer_open, answer_close = template.answer
    if any(completion.count(tag) != 1 for tag in (*template.think, *template.answer)):
        return 0.0
    before, _, rest = completion.partition(think_open)
    _, think_closed, rest = rest.partition(think_close)  # each tag occurs once: a miss is bad order
    between, answer_opened, rest = rest.partition(answer_open)
    answer, answer_closed, after = rest.partition(answer_close)
    in_order = think_closed and answer_opened and answer_closed
    only_whitespace_outside = not (before.strip() or between.strip() or after.strip())
    return 1.0 if in_order and only_whitespace_outside and answer.strip() else 0.0


REWARD_FUNCTIONS = MappingProxyType({"correctness": correctness_reward, "format": format_reward})


# -----------------------------------------------------------------------------
# the rewards a config names (reward_weights' keys): the rules above, or one that reward_models.py
# loads

NAME_FORMS = "'FILE.py:FUNCTION', 'model:NAME', 'model:NAME:LABEL' or 'judge:NAME'"


def parse_reward_name(name: str) -> tuple[str, str, str]:
    """A reward_weights key -> (kind, target, detail): ("rule", name, ""), ("file", path, function),
    ("model", NAME, LABEL or ""), ("judge", NAME, ""); a ValueError lists the forms for anything
    else."""
    if name in REWARD_FUNCTIONS:
        return "rule", name, ""
    kind, _, rest = name.partition(":")
    target, _, label = rest.partition(":")
    if kind == "model" and target:
        return "model", target, label
    if kind == "judge" and rest:
        return "judge", rest, ""
    path, _, function = name.rpartition(":")
    if path.endswith(".py") and function.isidentifier():
        return "file", path, function
    raise ValueError(f"reward_weights must name rewards from {sorted(REWARD_FUNCTIONS)}, "
                     f"{NAME_FORMS}, got {name!r}")


def reward_log_name(name: str) -> str:
    """A short log key for a reward_weights key: "format", "my_reward" (file:function),
    "model_Skywork_Reward" or "judge_Qwen2_5_7B_Instruct" (the model's last path part), letters,
    digits and "_" only."""
    kind, target, detail = parse_reward_name(name)
    if kind in ("rule", "file"):
        return detail or target
    short = "_".join(part for part in (kind, os.path.basename(os.path.normpath(target)), detail)
                     if part)
    return "".join(char if char.isalnum() else "_" for char in short)


def check_reward_names(names) -> None:
    """Every key well formed, every FILE.py present, no two keys logged under the same name; before
    any loading."""
    if not names:
        raise ValueError(f"reward_weights must name rewards from {sorted(REWARD_FUNCTIONS)}, "
                         f"{NAME_FORMS}; got none")
    for name in names:
        kind, target, _ = parse_reward_name(name)
        if kind == "file" and not os.path.isfile(target):
            raise ValueError(f"reward {name!r}: {target} not found")
    logged = [reward_log_name(name) for name in names]
    clashes = sorted({log for log in logged if logged.count(log) > 1})
    if clashes:
        raise ValueError(f"reward_weights keys {sorted(names)} would share the log name(s) "
                         f"{clashes}")


def check_settings(cfg):
    """A ValueError naming the key unless a config's rewards can run: reward_weights (known forms,
    files present, finite weights, distinct log names), reflection_markers (words:
    reflects matches whole words), and a template whose completions the rules can read
    (check_template)."""
    check_reward_names(cfg.reward_weights)
    if not all(type(w) in (int, float) and math.isfinite(w) for w in cfg.reward_weights.values()):
        raise ValueError(f"reward_weights must be finite numbers, got {cfg.reward_weights}")
    markers = cfg.reflection_markers
    if not (isinstance(markers, (tuple, list)) and len(markers) > 0 and all(
            isinstance(m, str) and m.strip() == m and m and "  " not in m
            and all(c.isalnum() or c in "- " for c in m)
            for m in markers)):
        raise ValueError("reflection_markers must be words or phrases (letters, digits, hyphens "
                         f"and single spaces: rewards.reflects matches whole words), got {markers}")
    check_template(template_of(cfg.template), cfg.answer_checker)


def check_template(template: Template, answer_checker: str = "gsm8k"):
    """A ValueError unless the rules read completions written in template: a worked and an
    answer-only target in its tags get the format reward, the correctness reward for their answer
    only (read by answer_checker) and (the worked one) shows_work."""
    worked = template.prefix + template.target_text("3+4=7\n", "7")
    direct = template.prefix + template.target_text("", "7")
    readable = (format_reward(worked, "7", template=template)
                == format_reward(direct, "7", template=template) == 1.0
                and correctness_reward(worked, "7", template=template,
                                       answer_checker=answer_checker) == 1.0
                and correctness_reward(worked, "8", template=template,
                                       answer_checker=answer_checker) == 0.0
                and shows_work(worked[len(template.prefix):], template)
                and not shows_work(direct[len(template.prefix):], template))
    if not readable:
        raise ValueError("template "
                         f"{template.name or dict(think=template.think, answer=template.answer)}: "
                         f"the rewards cannot read a completion written in it, e.g. {worked!r}; "
                         "choose tags that a worked answer does not contain (digits, arithmetic "
                         "signs, '####', '\\boxed{', 'answer is')")

# -----------------------------------------------------------------------------
# process supervision: every arithmetic claim is a reasoning step, checked exactly

CLAIM_OPERATORS = {"+": "+", "-": "-", "\u2212": "-", "*": "*", "x": "*", "\u00d7": "*", "/": "/",
                   "\u00f7": "/"}
ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
# numbers, operators and brackets in one side of a claim: "1 + 2 + ... + 50" still reads
MAX_CLAIM_TOKENS = 99
DIGITS = frozenset("0123456789")  # not str.isdigit: that also takes "²" and other scripts' digits


def _claim_tokens(text, start, end):
    """The tokens of text[start:end], each (kind, value, end offset): ("num", Fraction), ("op", one
    of "+-*/"), ("(", None), (")", None), or ("other", None) for what cannot be part of an
    expression (words, "<", ",", ...)."""
    tokens, i = [], start
    while i < end:
        char = text[i]
        if char.isspace() or (char == "$" and text[i + 1:i + 2] in DIGITS):
            i += 1
            continue
        signed = (char in "+-\u2212" and text[i + 1:i + 2] in DIGITS
                  and not (tokens and tokens[-1][0] in ("num", ")")))
        # a number, ".5" too
        if char in DIGITS or signed or (char == "." and text[i + 1:i + 2] in DIGITS):
            digits_end = i + 1
            while digits_end < end and (text[digits_end] in DIGITS or text[digits_end] in ",."):
                digits_end += 1
            # a trailing "," or "." is punctuation
            number = text[i + signed:digits_end].rstrip(",.")
            value = leading_number(number)[0]
            i += signed + len(number)
            negative = char in "-\u2212"
            tokens.append(("num", -value if negative else value, i) if value is not None
                          else ("other", None, i))
            continue
        if (char in CLAIM_OPERATORS
            and not (char == "x" and (text[i - 1:i].isalpha() or text[i + 1:i + 2].isalpha()))):
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
    """The expression that starts at tokens[at], read exactly: (value, index just after it), or None
    if none starts there. Level 0 reads a sum of products, 1 a product of factors, 2 a factor (a
    number or a bracketed sum); an operator with nothing readable after it is left unread. The value
    is None after a division by zero."""
    if level == 2:
        if at < len(tokens) and tokens[at][0] == "num":
            return tokens[at][1], at + 1
        inner = _expression(tokens, at + 1) if at < len(tokens) and tokens[at][0] == "(" else None
        return ((inner[0], inner[1] + 1)
                if inner and inner[1] < len(tokens) and tokens[inner[1]][0] == ")" else None)
    parsed = _expression(tokens, at, level + 1)
    operators = "+-" if level == 0 else "*/"
    while (parsed and parsed[1] < len(tokens) and tokens[parsed[1]][0] == "op"
           and tokens[parsed[1]][1] in operators):
        operand = _expression(tokens, parsed[1] + 1, level + 1)
        if operand is None:
            break
        parsed = _apply(parsed[0], tokens[parsed[1]][1], operand[0]), operand[1]
    return parsed


def _left_side(tokens):
    """(value, has an operator) of the longest expression that ends the tokens, or None. It must not
    follow an operator: it would go on into something unreadable ("a*2 = 10"), so its value is
    unknown; nor be longer than MAX_CLAIM_TOKENS, which bounds the work (and the brackets'
    recursion)."""
    after_other = max((i + 1 for i, token in enumerate(tokens) if token[0] == "other"), default=0)
    for start in range(max(after_other, len(tokens) - MAX_CLAIM_TOKENS), len(tokens)):
        parsed = _expression(tokens, start)
        if parsed and parsed[1] == len(tokens) and not (start and tokens[start - 1][0] == "op"):
            return parsed[0], any(token[0] == "op" for token in tokens[start:])
    return None


def _right_side(tokens):
    """(value, has an operator, end offset) of the longest expression that starts the tokens, or
    None; it must not be followed by an operator ("7 + apples"), nor be longer than
    MAX_CLAIM_TOKENS."""
    parsed = _expression(tokens[:MAX_CLAIM_TOKENS + 1], 0)
    if (parsed is None or (parsed[1] < len(tokens) and tokens[parsed[1]][0] == "op")
        or parsed[1] > MAX_CLAIM_TOKENS):
        return None
    return (parsed[0], any(token[0] == "op" for token in tokens[:parsed[1]]),
            tokens[parsed[1] - 1][2])


def arithmetic_claims(text: str) -> list[tuple[int, bool]]:
    """
    The arithmetic claims a text makes, in order, each as (end, correct): end is the offset just
    past the claim's last character, correct whether it holds exactly (Fraction arithmetic: no eval,
    no floats, no regex). A claim is an "=" between two expressions on one line, one of them with an
    operator: "3 * 4 = 12", "12+7=19", "$1,200 / 4 = $300", "1/2 + .25 = 3/4", "20 = 4 x 5",
    "(60+72+42)/3=58". An expression is numbers (thousands commas, decimals, a sign where no number
    precedes: "3*-2=-6") joined by + - * / x × ÷ −, * and / first, with brackets; "/" divides, so a
    fraction is its own value. Left of "=" the claim reads the longest expression ending there,
    right of it the longest one starting there, so words around it do not count ("Tom has 3+4=7
    apples"), and a chain "3+4=7+1=8" is two claims, 3+4 = 7+1 (wrong) and 7+1 = 8 (right): "="
    means equal. Not claims: no operator on either side ("x = 5", "7 = 7"), a side that is not an
    expression ("2x + 3 = 7", "a <= 5"), one cut at an operator ("a*2 = 10", "3+4 = 7 + apples") or
    longer than MAX_CLAIM_TOKENS. A division by zero makes a claim wrong. Time is linear in the
    text.
    """
    claims = []
    previous = -1
    equals = text.find("=")
    # each side is read up to the neighbouring "=" or the line's end: linear in the text
    while equals >= 0:
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
    """True if the completion writes an arithmetic claim (arithmetic_claims, right or wrong) before
    the template's think close, "</think>" (or anywhere, without one): it worked something out
    rather than stating an answer. Logged as worked_rate."""
    return bool(arithmetic_claims(completion.partition(template.think[1])[0]))


# Phrases that mark a re-check (reflection), after the self-reflection keywords with which Liu et
# al. 2025 ("Understanding R1-Zero-Like Training", arXiv:2503.20783; Oat-Zero) counted reflection in
# base models' answers, plus "check" (configs/demo_aha.py's re-checks, data.rework_solution); config
# key reflection_markers
REFLECTION_MARKERS = ("wait", "check", "recheck", "re-check", "double-check", "double check",
                      "check again",
                      "verify", "rethink", "reconsider", "re-examine", "reexamine", "re-evaluate",
                      "reevaluate", "reassess", "think again")


def reflects(completion: str, template: Template = R1_ZERO,
             markers: tuple = REFLECTION_MARKERS) -> bool:
    """True if the completion's text before the template's think close ("</think>"; all of it,
    without one) holds one of markers as whole words, in any case: "check 30-4=26", "Wait, 12 is
    wrong" and "Let me double-check" do, "checked", "checklist" and "awaited" do not; a hyphen joins
    a word ("re-check" is not "check"). Logged as reflect_rate (records.completion_flags)."""
    text = completion.partition(template.think[1])[0].lower()
    words = (" " + " ".join("".join(c if c.isalnum() or c == "-" else " " for c in text).split())
             + " ")
    return any(f" {marker.lower()} " in words for marker in markers)


def token_ends(token_ids, decode, char_ends: list[int]) -> list[int]:
    """For each character offset end of the text decode(token_ids), the index of the token that
    writes its character end - 1: the shortest prefix of token_ids whose decoded text is at least
    end characters long. A prefix decodes to a prefix of the text (a token cut inside a multi-byte
    character decodes to one replacement character), so its length grows with the prefix and a
    binary search finds it; exact for any tokenizer whose decode does that."""
    return [bisect.bisect_left(range(len(token_ids)), end,
                               key=lambda n: len(decode(token_ids[:n + 1])))
            for end in char_ends]


def claim_rewards(completion: str, token_ids, decode,
                  truncated: bool = False) -> list[tuple[int, float]]:
    """
    Process supervision's rewards, rule-based: each arithmetic claim of the completion
    (arithmetic_claims) is a reasoning step rewarded 1.0 if it holds and 0.0 if not, ending at the
    token that writes its last character. completion: the decoded completion, decode(token_ids)
    without a final end-of-text token; token_ids: the completion's tokens, stop token included;
    decode: the tokenizer's decode. A completion that claims nothing, or was truncated, gets one
    claim of reward 0.0 at its last token: no checkable work earns what a wrong claim earns, so
    leaving the arithmetic out never escapes a negative advantage. Returns [(token index of the
    claim's last token, reward)], in order.
    """
    claims = [] if truncated else arithmetic_claims(completion)
    if not claims:
        return [(len(token_ids) - 1, 0.0)]
    ends = token_ends(token_ids, decode, [end for end, _ in claims])
    return [(end, 1.0 if correct else 0.0) for end, (_, correct) in zip(ends, claims)]
