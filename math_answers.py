"""
Equivalence of MATH-style final answers: the checker a MATH run uses where a GSM8K run uses
answers.is_equiv.

MATH (Hendrycks et al., 2021, "Measuring Mathematical Problem Solving With the MATH Dataset") states
each final answer as a short LaTeX string: a number (\\frac{3}{4}, 2\\sqrt{5}, 90^\\circ, 10,\\!080,
137 \\frac{1}{2}), an expression (x^3+3x-6, \\cot x), an equation (y = 2x + 3), an interval or a
union of them, an ordered tuple, a list or set of values, a matrix, a complex number, a word
(\\text{Evelyn}) or a choice letter (\\text{(C)}). MATH-500, the 500-problem test subset of Lightman
et al., 2023 (data/math500/), is the reference for the forms handled here.

is_equiv_math reads both answers with a hand-written tokenizer and recursive-descent parser into a
small tree (no regex, no sympy, nothing executed) and compares the trees; scalar expressions are
compared by value at fixed pseudo-random points. Like rewards.py it leans to "not equal" when in
doubt: the reward is the policy's only teacher, and a false positive teaches it to cheat. Input
length, nesting depth, the size of exact numbers, the number of items, variables and points are
capped, so any input is answered in time about linear in its length.
"""

import cmath
import math
import operator
import random
from fractions import Fraction
from typing import NamedTuple

MAX_CHARS = 400  # longer answers are refused; extract_answer's answers are at most 200 characters
MAX_DEPTH = 40  # nesting of brackets, arguments and signs
# size of an exact intermediate number (numerator or denominator); 2^{2005} still fits
MAX_BITS = 10_000
MAX_ITEMS = 64  # items of one list, set, tuple or matrix
MAX_ROOT = 64  # largest q of an exact q-th root (x^{p/q}, \sqrt[q]{x})
MAX_VARIABLES = 8
POINTS_SEED = 20261124  # the points are the same on every call and every machine
N_POINTS = 5  # points at which expressions with variables are compared
MIN_POINTS = 3  # points where both sides must be defined (and agree)
# for inexact values only (a radical, pi, e or a function); exact values must be equal
REL_TOL = 1e-9
DIGITS = "0123456789"
LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
UNICODE_LATEX = (("\u2212", "-"), ("\u2013", "-"), ("\u00d7", "\\times "), ("\u00b7", "\\cdot "),
                 ("\u22c5", "\\cdot "),
                 ("\u00f7", "\\div "), ("\u03c0", "\\pi "), ("\u221a", "\\sqrt "),
                 ("\u221e", "\\infty "),
                 ("\u2264", "\\le "), ("\u2265", "\\ge "), ("\u2260", "\\ne "), ("\u00b1", "\\pm "),
                 ("\u222a", "\\cup "), ("\u00b0", " "))
# Commands that change nothing: delimiters' sizes, spacing, math delimiters, currency and percent
# signs (50\% is 50, as in answers.is_equiv), a stray degree sign.
NOISE_COMMANDS = frozenset("left right big Big bigg Bigg bigl bigr Bigl Bigr biggl biggr "
                           "displaystyle textstyle quad qquad circ "
                           "degree".split()) | frozenset(",!;: $%()[]")
TEXT_COMMANDS = frozenset("text textbf textit textrm textsf textnormal mbox mathrm mathbf mathit "
                          "mathsf".split())
FRACTIONS = ("frac", "dfrac", "tfrac", "cfrac")
COMMAND_ALIASES = {"leq": "le", "leqslant": "le", "geq": "ge", "geqslant": "ge", "neq": "ne",
                   "lt": "<", "gt": ">",
                   "ast": "cdot", "times": "cdot", "mp": "pm", "lvert": "|", "rvert": "|",
                   "vert": "|", "varnothing": "emptyset", "lbrace": "{", "rbrace": "}"}
THOUSANDS_MARKS = ("{,}", ",\\!", "\\,", ",")  # 10,\!080, 1{,}000, 1\,000, 58,500
FUNCTIONS = {"sin": cmath.sin, "cos": cmath.cos, "tan": cmath.tan,
             "cot": lambda z: 1 / cmath.tan(z),
             "sec": lambda z: 1 / cmath.cos(z), "csc": lambda z: 1 / cmath.sin(z),
             "arcsin": cmath.asin,
             "arccos": cmath.acos, "arctan": cmath.atan, "sinh": cmath.sinh, "cosh": cmath.cosh,
             "tanh": cmath.tanh, "ln": cmath.log, "log": cmath.log10, "exp": cmath.exp}
INVERSES = {"sin": "arcsin", "cos": "arccos", "tan": "arctan"}  # \sin^{-1} x
# plain-text spellings: sqrt(2), 2pi, sin x
WORD_COMMANDS = frozenset(("sqrt", "pi")) | frozenset(FUNCTIONS)
GREEK = frozenset("alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa "
                  "lambda mu nu xi rho sigma tau upsilon phi varphi chi psi omega Gamma Delta "
                  "Theta Lambda Xi Sigma Phi Psi Omega".split())
MATRIX_ENVIRONMENTS = frozenset(("pmatrix", "bmatrix", "matrix", "Bmatrix"))
# Words that hedge, negate, bound or change the value they stand beside ("5 or 6", "5\text{ or
# more}", "72 thousand", "5\text{ is wrong}"): such a unit makes the answer unreadable.
HEDGE_WORDS = frozenset("""
    or nor and but plus minus not no never if unless wrong incorrect false about approximately
    approx around roughly nearly almost maybe perhaps probably possibly likely least most than
    squared cubed half hundred hundreds thousand thousands million millions billion billions
    trillion
""".split())

# -----------------------------------------------------------------------------
# reading: tokens


class Unreadable(ValueError):
    """The answer is not a form this module reads (or evaluates): the verdict is "not equal"."""


def _skip_spaces(text, i, end):
    while i < end and text[i].isspace():
        i += 1
    return i


def _digits_end(text, i, end):
    while i < end and text[i] in DIGITS:
        i += 1
    return i


def _closing_brace(text, open_at, end):
    """Index of the '}' closing the '{' at text[open_at]; an escaped brace (\\{, \\}) is not a group
    brace."""
    depth, i = 0, open_at
    while i < end:
        char = text[i]
        if char == "\\":
            i += 2
            continue
        depth += (char == "{") - (char == "}")
        if depth == 0:
            return i
        i += 1
    raise Unreadable("unclosed {")


def _number(text, i, end, plain_commas):
    """(digits, index after the number) for the number at text[i]: '58,500' -> '58500', '.35' ->
    '.35'. A thousands separator ({,} ,\\! \\, or a plain comma) must be followed by exactly three
    digits, after a first group of one to three digits not starting with 0; a plain comma counts
    only outside brackets (plain_commas), since (1,000) reads as the pair (1, 0) there."""
    j = _digits_end(text, i, end)
    parts = [text[i:j]]
    grouped = 0 < j - i <= 3 and text[i] != "0"
    while grouped:
        for mark in THOUSANDS_MARKS:
            if text.startswith(mark, j, end) and (mark != "," or plain_commas):
                k = j + len(mark) if mark == "," else _skip_spaces(text, j + len(mark), end)
                if _digits_end(text, k, end) == k + 3:
                    parts.append(text[k:k + 3])
                    j = k + 3
                    break
        else:
            grouped = False
    if text.startswith(".", j, end) and j + 1 < end and text[j + 1] in DIGITS:
        k = _digits_end(text, j + 1, end)
        parts.append(text[j:k])
        j = k
    return "".join(parts), j


def _argument(text, i, end, tokens, depth, digit_run=False):
    """Tokenize one TeX argument at text[i] wrapped in braces, whatever its spelling: {...}, a
    command (\\frac\\pi2) or, by TeX's rule, one character (\\frac12, \\sqrt3, x^2). With digit_run
    (for ^ and _) a run of digits is one argument, the plain-text reading (x^23 is x^{23}: TeX's
    x^{2}3 is never meant). Returns the index after it."""
    i = _skip_spaces(text, i, end)
    if i >= end:
        raise Unreadable("missing argument")
    if text[i] == "{":
        stop = _closing_brace(text, i, end) + 1
        start, inner_end = i + 1, stop - 1
    elif text[i] == "\\" and i + 1 < end and text[i + 1] in LETTERS:
        start, stop = i, i + 1
        while stop < end and text[stop] in LETTERS:
            stop += 1
        inner_end = stop
    else:
        start = i
        stop = _digits_end(text, i + (text[i] == "-"), end) if digit_run else i + 1
        inner_end = stop = max(stop, i + 1)
    tokens.append(("sym", "{"))
    _tokenize(text, start, inner_end, tokens, depth + 1)
    tokens.append(("sym", "}"))
    return stop


def _command(text, i, end, tokens, depth):
    """Tokenize the command at text[i] == '\\' (with its arguments where it takes them); the index
    after it."""
    k = i + 1
    if k < end and text[k] in LETTERS:
        while k < end and text[k] in LETTERS:
            k += 1
    else:
        k = min(k + 1, end)
    name = text[i + 1:k]
    if name in NOISE_COMMANDS:
        after = _skip_spaces(text, k, end)
        return after + 1 if name in ("left", "right") and text.startswith(".", after, end) else k
    if name in TEXT_COMMANDS or name in ("begin", "end", "boxed", "fbox"):
        open_at = _skip_spaces(text, k, end)
        if not text.startswith("{", open_at, end):
            raise Unreadable(f"\\{name} without {{")
        close = _closing_brace(text, open_at, end)
        content = text[open_at + 1:close]
        if name in ("begin", "end"):
            tokens.append((name, content.strip()))
        elif (name in ("boxed", "fbox") or any(char in DIGITS or char in "\\$" for char in content)
              or len(content.strip()) <= 1):
            # a frame, or math inside text: \text{18 dollars}, \mathbf{v}
            _tokenize(content, 0, len(content), tokens, depth + 1)
        else:
            tokens.append(("text", content.strip()))
        return close + 1
    if name in FRACTIONS:
        tokens.append(("cmd", "frac"))
        return _argument(text, _argument(text, k, end, tokens, depth), end, tokens, depth)
    if name == "sqrt":
        tokens.append(("cmd", "sqrt"))
        k = _skip_spaces(text, k, end)
        if text.startswith("[", k, end):
            close = text.find("]", k, end)
            if close < 0:
                raise Unreadable("unclosed \\sqrt[")
            tokens.append(("sym", "["))
            _tokenize(text, k + 1, close, tokens, depth + 1)
            tokens.append(("sym", "]"))
            k = close + 1
        return _argument(text, k, end, tokens, depth)
    tokens.append(("cmd", COMMAND_ALIASES.get(name, name)))
    return k


def _script(text, i, end, tokens, depth):
    """Tokenize a superscript or subscript at text[i] in '^_'. A degree sign (^\\circ, ^{\\circ}) is
    dropped and a prime (^\\prime) becomes "'"; ^( is left to the parser (2^(3) in plain text)."""
    k = _skip_spaces(text, i + 1, end)
    if text[i] == "^":
        for degree in ("\\circ", "{\\circ}"):
            if text.startswith(degree, k, end):
                return k + len(degree)
        for prime in ("\\prime", "{\\prime}"):
            if text.startswith(prime, k, end):
                tokens.append(("sym", "'"))
                return k + len(prime)
    tokens.append(("sym", text[i]))
    if text.startswith("(", k, end):
        return k
    return _argument(text, k, end, tokens, depth, digit_run=True)


OPENERS = frozenset("([{")
COMMA_BRACKETS = {("sym", "("): 1, ("sym", "["): 1, ("cmd", "{"): 1, ("sym", ")"): -1,
                  ("sym", "]"): -1, ("cmd", "}"): -1}


def _tokenize(text, i, end, tokens, depth):
    """Append the tokens of text[i:end] to tokens, each (kind, value): ("num", digits), ("word", a
    run of letters), ("cmd", a command's name), ("text", the words of \\text{}), ("begin"/"end", an
    environment), ("sym", one character). Noise is dropped here, never joining what it separated:
    "7\\,2" stays two numbers."""
    if depth > MAX_DEPTH:
        raise Unreadable("nested too deeply")
    # open ( [ \{ so far in this span: a plain comma is a thousands separator only outside them
    brackets = 0
    while i < end:
        char, before = text[i], len(tokens)
        if char.isspace() or char in "$%":
            i += 1
        elif char in DIGITS or (char == "." and i + 1 < end and text[i + 1] in DIGITS):
            number, i = _number(text, i, end, brackets == 0)
            tokens.append(("num", number))
        elif char in LETTERS:
            start = i
            while i < end and text[i] in LETTERS:
                i += 1
            tokens.append(("word", text[start:i]))
        elif char == "\\":
            i = _command(text, i, end, tokens, depth)
        elif char in "^_":
            i = _script(text, i, end, tokens, depth)
        elif text.startswith(("<=", ">="), i, end):
            tokens.append(("cmd", "le" if char == "<" else "ge"))
            i += 2
        else:
            tokens.append(("sym", char))
            i += 1
        brackets += sum(COMMA_BRACKETS.get(token, 0) for token in tokens[before:])


def tokenize(text: str) -> list[tuple[str, str]]:
    """The tokens of an answer (see _tokenize), after mapping unicode math (−, ×, π, √, ≤, ...) to
    LaTeX and dropping a final full stop. Raises Unreadable (a ValueError) for unbalanced braces and
    the like."""
    if not text.isascii():
        for char, latex in UNICODE_LATEX:
            text = text.replace(char, latex)
    tokens = []
    _tokenize(text, 0, len(text), tokens, 0)
    while tokens and tokens[-1] == ("sym", "."):
        tokens.pop()
    return tokens

# -----------------------------------------------------------------------------
# reading: the answer's tree A scalar is a plain tuple: ("num", Fraction), ("var", name), ("const",
# "pi" | "e" | "i" | "inf"), (op, a, b) for op in + - * / ^ and pm (a ± b), ("neg", a), ("fn", name,
# a), ("root", n, a), ("abs", a). Everything else is one of the structures below.


class Seq(NamedTuple):
    """An ordered tuple or an interval: (3, \\frac{\\pi}{2}), [-2, 7), (1, 2). Both are compared the
    same way: same brackets, same length, items equal in order; so (1, 2) matches (1, 2) whichever
    of the two it means."""
    opener: str
    closer: str
    items: tuple


class Set(NamedTuple):
    """An unordered collection: \\{1, 2, 3\\}, a bare list "1, 2, 3", or the two values of a ± b."""
    items: tuple


class Union(NamedTuple):
    """Intervals or sets joined by \\cup, in any order."""
    members: tuple


class Matrix(NamedTuple):
    """pmatrix / bmatrix / matrix / Bmatrix rows, compared entrywise (a column vector is a
    one-column matrix)."""
    rows: tuple


class Relation(NamedTuple):
    """left op right with op one of = < \\le \\ne \\in (> and \\ge are stored flipped). An
    assignment is = or \\in with a single variable on the left (x = 5 and 5 = x both store x on the
    left)."""
    op: str
    left: object
    right: object


class Text(NamedTuple):
    """A word answer (\\text{Evelyn}, east): its letters and digits, lower case."""
    words: str


class Choice(NamedTuple):
    """A multiple-choice letter: (A), \\text{(A)}, \\textbf{(A)}, A."""
    letter: str


ONE, ZERO, INFINITY = ("num", Fraction(1)), ("num", Fraction(0)), ("const", "inf")
RELATIONS = {("sym", "="): "=", ("sym", "<"): "<", ("sym", ">"): ">", ("cmd", "<"): "<",
             ("cmd", ">"): ">",
             ("cmd", "le"): "le", ("cmd", "ge"): "ge", ("cmd", "ne"): "ne", ("cmd", "in"): "in"}
FLIPPED = {">": "<", "ge": "le"}
SIGNS = {("sym", "+"): "+", ("sym", "-"): "-", ("cmd", "pm"): "pm"}
PRODUCT_OPERATORS = {("sym", "*"): "*", ("cmd", "cdot"): "*", ("sym", "/"): "/",
                     ("cmd", "div"): "/"}
GROUP_CLOSERS = {"(": (("sym", ")"), ("sym", "]")), "[": (("sym", ")"), ("sym", "]")),
                 "{": (("sym", "}"),)}
END = ("end of answer", "")
LBRACE, RBRACE = ("sym", "{"), ("sym", "}")


def _is_scalar(node):
    """Whether node is a scalar tree (a plain tuple; the structures are NamedTuple subclasses of
    tuple)."""
    return type(node) is tuple


def _scalar(node):
    if not _is_scalar(node):
        raise Unreadable("arithmetic on a tuple, set, interval, matrix or relation")
    return node


def _is_variable(node):
    return _is_scalar(node) and node[0] == "var"


def _is_constant(node):
    return _is_scalar(node) and not _variables(node)


def _interval(low, low_op, high, high_op):
    """The Seq of low op x op high, for op in < and le: (low, high], [low, high), ..."""
    return Seq("(" if low_op == "<" else "[", ")" if high_op == "<" else "]", (low, high))


def _without_pm(node, sign):
    """node with its one ± read as + (sign 1) or - (sign -1)."""
    if not _is_scalar(node) or node[0] in ("num", "var", "const"):
        return node
    if node[0] == "pm":
        return ("+" if sign > 0 else "-", node[1], node[2])
    return (node[0],) + tuple(_without_pm(child, sign) for child in node[1:])


def _expanded(items):
    """items with each scalar a ± b replaced by its two values; more than one ± in an item is
    refused."""
    result = []
    for item in items:
        if _count_pm(item) > 1:
            raise Unreadable("more than one \\pm in one value")
        if _count_pm(item):
            result += [_without_pm(item, 1), _without_pm(item, -1)]
        else:
            result.append(item)
    return result


def _count_pm(node):
    """The number of ± in a tree (0 for a structure)."""
    return _is_scalar(node) and (node[0] == "pm") + sum(_count_pm(child) for child in node[1:])


class _Parser:
    """Recursive descent over the tokens of one answer. Grammar, loosest first:
        answer   = item ("," item)*                  several items are a Set (a bare list)
        item     = relation [unit]                   unit: a \\text{} of words after the value,
                                                     optionally ^2 or ^3
        relation = union [relop union [relop union]] two relops only as a chain low < x < high
        union    = sum ("\\cup" sum)*
        sum      = [sign] product (sign product)*    sign: + - \\pm \\mp
        product  = power (op [-] power | power)*     op: * \\cdot \\times / \\div; juxtaposition
                                                     multiplies, but a number never follows a factor
                                                     (x2, (1)2, "2 3" are refused) and a/bc is
                                                     refused as ambiguous
        power    = atom ["^" group]
        atom     = number | letters | command | group | |sum| | matrix
    A group (...), [...], {...} with one item is that item; with several it is a Seq (round/square
    brackets) or a Set (braces). \\{...\\} is always a Set. Items of a Set and the right side of a
    relation expand a ± b."""

    def __init__(self, tokens):
        self.tokens, self.at, self.depth = tokens, 0, 0

    def peek(self):
        return self.tokens[self.at] if self.at < len(self.tokens) else END

    def take(self):
        token = self.peek()
        self.at += 1
        return token

    def accept(self, token):
        if self.peek() == token:
            self.at += 1
            return True
        return False

    def expect(self, token):
        if not self.accept(token):
            raise Unreadable(f"expected {token[1]!r}, found {self.peek()[1]!r}")

    def enter(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise Unreadable("nested too deeply")

    def answer(self):
        items = self.items((END,), expand=True)
        self.expect(END)
        return items[0] if len(items) == 1 else Set(tuple(items))

    def items(self, closers, expand):
        items = []
        if self.peek() not in closers:
            items.append(self.item())
            while self.accept(("sym", ",")):
                items.append(self.item())
        if self.peek() not in closers or len(items) > MAX_ITEMS:
            raise Unreadable(f"unexpected {self.peek()[1]!r}")
        return _expanded(items) if expand else items

    def item(self):
        node = self.relation()
        if self.peek()[0] == "text":
            words = self.take()[1].lower().replace("-", " ").split()
            if any(word in HEDGE_WORDS for word in words):
                raise Unreadable("a hedge beside the value")
            if self.accept(("sym", "^")):
                self.expect(LBRACE)
                if self.take() not in (("num", "2"), ("num", "3")):
                    raise Unreadable("a unit's power is 2 or 3")
                self.expect(RBRACE)
        return node

    def relation(self):
        """One relation, or a chain low < x < high. An inequality between one variable and a
        constant is read as the interval it states (x \\ge 2 is x \\in [2, \\infty), 2 < x \\le 5 is
        x \\in (2, 5]); = with the variable on the right is turned round (5 = x is x = 5); the right
        side of a relation expands a ± b."""
        sides, ops = [self.union()], []
        while self.peek() in RELATIONS:
            if len(ops) == 2:
                raise Unreadable("a chain of three relations")
            ops.append(RELATIONS[self.take()])
            sides.append(self.union())
        if not ops:
            return sides[0]
        if all(op in FLIPPED for op in ops):  # 5 > x > 2 is 2 < x < 5
            sides, ops = sides[::-1], [FLIPPED[op] for op in ops[::-1]]
        if len(ops) == 2:
            low, variable, high = sides
            if not (set(ops) <= {"<", "le"} and _is_variable(variable) and _is_constant(low)
                    and _is_constant(high)):
                raise Unreadable("a chain other than low < x < high")
            return Relation("in", variable, _interval(low, ops[0], high, ops[1]))
        (op,), (left, right) = ops, sides
        if op in FLIPPED:
            op, left, right = FLIPPED[op], right, left
        if op in ("<", "le") and _is_variable(left) and _is_constant(right):
            return Relation("in", left, _interval(("neg", INFINITY), "<", right, op))
        if op in ("<", "le") and _is_variable(right) and _is_constant(left):
            return Relation("in", right, _interval(left, op, INFINITY, "<"))
        if op == "=" and _is_variable(right) and not _is_variable(left):
            left, right = right, left
        if _count_pm(right):
            right = Set(tuple(_expanded([right])))
        assignment = op in ("=", "in") and _is_variable(left)
        if not assignment and (op == "in" or not (_is_scalar(left) and _is_scalar(right))):
            raise Unreadable("\\in without a variable, or a relation between structures")
        return Relation(op, left, right)

    def union(self):
        members = [self.sum()]
        while self.accept(("cmd", "cup")):
            members.append(self.sum())
        if len(members) == 1:
            return members[0]
        if any(_is_scalar(member) for member in members):
            raise Unreadable("\\cup of a number")
        return Union(tuple(members))

    def sum(self):
        sign = SIGNS.get(self.peek())
        self.at += sign is not None
        node = self.product()
        if sign == "-":
            node = ("neg", _scalar(node))
        elif sign == "pm":
            node = ("pm", ZERO, _scalar(node))
        while (sign := SIGNS.get(self.peek())) is not None:
            self.at += 1
            node = (sign, _scalar(node), _scalar(self.product()))
        return node

    def product(self):
        node, after_division = self.power(), False
        while True:
            token = self.peek()
            if token in PRODUCT_OPERATORS:
                self.at += 1
                negative = self.accept(("sym", "-"))  # 2 \cdot -3
                operand = _scalar(self.power())
                node = (PRODUCT_OPERATORS[token], _scalar(node),
                        ("neg", operand) if negative else operand)
                after_division = token in (("sym", "/"), ("cmd", "div"))
            elif self.starts_factor(token):
                if after_division:
                    raise Unreadable("a/bc is ambiguous")
                node = ("*", _scalar(node), _scalar(self.power()))
            else:
                return node

    def starts_factor(self, token):
        """Whether token starts a factor that juxtaposition multiplies: a letter, a command such as
        \\pi, \\sqrt, \\frac, \\sin, or a bracket; never a number."""
        kind, value = token
        return (kind == "word" or (kind == "sym" and value in "({") or
                (kind == "cmd"
                 and (value in ("frac", "sqrt", "pi") or value in FUNCTIONS or value in GREEK)))

    def power(self):
        node = self.atom()
        if self.accept(("sym", "^")):
            node = ("^", _scalar(node), self.group_value())
            if self.peek() == ("sym", "^"):
                raise Unreadable("double superscript")
        return node

    def group_value(self):
        """The scalar in a {...} or (...) group (an argument or an exponent)."""
        opener = self.take()
        if opener not in (LBRACE, ("sym", "(")):
            raise Unreadable("expected an argument")
        return _scalar(self.group(opener[1]))

    def atom(self):
        self.enter()
        kind, value = token = self.take()
        if kind == "num":
            node = self.number(value)
        elif kind == "word":
            node = self.command(value) if value in WORD_COMMANDS else self.letters(value)
        elif kind == "cmd":
            node = self.command(value)
        elif kind == "begin":
            node = self.matrix(value)
        elif kind == "sym" and value in OPENERS:
            node = self.group(value)
        elif token == ("sym", "|") or token == ("cmd", "|"):
            node = ("abs", _scalar(self.sum()))
            if self.take()[1] != "|":
                raise Unreadable("unclosed |")
        else:
            raise Unreadable(f"unexpected {value!r}")
        self.depth -= 1
        return node

    def number(self, digits):
        """A number token, with a mixed-number fraction after it (2\\frac{1}{2}, 137 \\frac{1}{2}, 2
        1/2: MATH writes a product of an integer and a fraction as one fraction, so an integer
        followed by a proper fraction of two integers is a mixed number) or a base subscript (204_5,
        4210_{5}: the digits are kept and the base dropped, as the question names the base; digits
        not valid in the base are refused)."""
        value = Fraction(digits)
        if digits.isdigit():
            value += self.mixed_fraction()
        if self.accept(("sym", "_")):
            base = self.subscript()
            if not (base.isdigit() and digits.isdigit()
                    and all(int(digit) < int(base) for digit in digits)):
                raise Unreadable("not a numeral in that base")
        return ("num", value)

    def mixed_fraction(self):
        """The proper fraction of two integers right after an integer (\\frac{a}{b}, or a/b after a
        space), taken from the tokens; 0 if there is none."""
        ahead = [token if token[0] != "num" else ("num", "")
                 for token in self.tokens[self.at:self.at + 7]]
        if ahead == [("cmd", "frac"), LBRACE, ("num", ""), RBRACE, LBRACE, ("num", ""), RBRACE]:
            numerator, denominator, length = (self.tokens[self.at + 2][1],
                                              self.tokens[self.at + 5][1], 7)
        elif ahead[:3] == [("num", ""), ("sym", "/"), ("num", "")]:
            numerator, denominator, length = self.tokens[self.at][1], self.tokens[self.at + 2][1], 3
        else:
            return 0
        if not (numerator.isdigit() and denominator.isdigit()
                and 0 < int(numerator) < int(denominator)):
            return 0
        self.at += length
        return Fraction(int(numerator), int(denominator))

    def subscript(self):
        """The text of a braced subscript made of numbers and letters: a_{n1} -> 'n1'."""
        self.expect(LBRACE)
        parts = []
        while self.peek()[0] in ("num", "word"):
            parts.append(self.take()[1])
        self.expect(RBRACE)
        if not parts:
            raise Unreadable("an empty subscript")
        return "".join(parts)

    def decorated(self, name):
        """A variable's name with its subscript and primes: x_1, a_{n}, x'."""
        if self.accept(("sym", "_")):
            name += "_" + self.subscript()
        while self.accept(("sym", "'")):
            name += "'"
        return name

    def letters(self, run):
        """A run of letters is a product of one-letter variables (ab is a*b); i is the imaginary
        unit and e is Euler's number unless subscripted or primed. The last letter takes a subscript
        (x_1, a_{n}) and primes (x')."""
        factors = [("const", letter) if letter in "ei" else ("var", letter) for letter in run]
        name = self.decorated(run[-1])
        if name != run[-1]:
            factors[-1] = ("var", name)
        node = factors[0]
        for factor in factors[1:]:
            node = ("*", node, factor)
        return node

    def command(self, name):
        if name == "frac":
            return ("/", self.group_value(), self.group_value())
        if name == "sqrt":
            index = 2
            if self.accept(("sym", "[")):
                kind, index = self.take()
                if kind != "num" or not index.isdigit() or not 2 <= int(index) <= MAX_ROOT:
                    raise Unreadable("\\sqrt[n] needs an integer n")
                index = int(index)
                self.expect(("sym", "]"))
            return ("root", index, self.group_value())
        if name == "pi":
            return ("const", "pi")
        if name == "infty":
            return INFINITY
        if name in FUNCTIONS:
            return self.function(name)
        if name in GREEK:
            return ("var", self.decorated(name))
        if name == "{":
            set_ = Set(tuple(self.items((("cmd", "}"),), expand=True)))
            self.take()
            return set_
        if name == "emptyset":
            return Set(())
        raise Unreadable(f"unknown command \\{name}")

    def function(self, name):
        """\\sin x, \\sin(x), \\sin 2x (the argument runs over juxtaposed factors up to the next
        function or operator), \\sin^2 x, \\sin^{-1} x (arcsin), \\log_2 8; \\log alone is base 10
        and \\ln natural."""
        power = base = None
        if self.accept(("sym", "^")):
            power = self.group_value()
            if power == ("neg", ONE) and name in INVERSES:
                name, power = INVERSES[name], None
        if name == "log" and self.accept(("sym", "_")):
            base = self.group_value()
        if self.peek() == ("sym", "("):
            argument = self.atom()  # \sin(x)^2 is (\sin x)^2: the caller's power() takes the ^2
        else:
            argument = self.power()
            while self.starts_factor(self.peek()) and self.peek()[1] not in FUNCTIONS:
                argument = ("*", argument, _scalar(self.power()))
        node = ("fn", "ln" if base is not None else name, _scalar(argument))
        if base is not None:
            node = ("/", node, ("fn", "ln", base))
        return node if power is None else ("^", node, power)

    def group(self, opener):
        closers = GROUP_CLOSERS[opener]
        items = self.items(closers, expand=opener == "{")
        closer = self.take()[1]
        if len(items) == 1 and opener + closer in ("()", "[]", "{}"):
            if opener == "{" or _is_scalar(items[0]):
                return items[0]
            raise Unreadable("a structure in brackets")
        if opener == "{":
            return Set(tuple(items))
        if len(items) < 2:
            raise Unreadable("an empty or half-open bracket")
        return Seq(opener, closer, tuple(items))

    def matrix(self, environment):
        if environment not in MATRIX_ENVIRONMENTS:
            raise Unreadable(f"environment {environment}")
        rows, row = [], []
        while True:
            row.append(_scalar(self.sum()))
            token = self.take()
            if token == ("sym", "&"):
                continue
            if token == ("cmd", "\\"):
                rows.append(tuple(row))
                row = []
                if self.peek() != ("end", environment):
                    continue
                token = self.take()
            elif token == ("end", environment):
                rows.append(tuple(row))
            if (token != ("end", environment) or len({len(r) for r in rows}) != 1
                or len(rows) * len(rows[0]) > MAX_ITEMS):
                raise Unreadable("a malformed matrix")
            return Matrix(tuple(rows))


def _word_text(tokens):
    """The letters and digits (lower case) of an answer made only of words and \\text{}, or None."""
    if not tokens or any(kind not in ("word", "text") for kind, _ in tokens):
        return None
    return "".join(char.lower() for _, value in tokens for char in value if char.isalnum())


def _choice(tokens):
    """The letter of a multiple-choice answer: one capital letter, in parentheses or not, in
    \\text{} or not."""
    compact = "".join("".join(value.split())
                      for kind, value in tokens if kind in ("word", "text", "sym"))
    if len(compact) == 3 and compact[0] == "(" and compact[2] == ")":
        compact = compact[1]
    kinds_ok = all(kind in ("word", "text") or value in "()" for kind, value in tokens)
    return compact if kinds_ok and len(compact) == 1 and compact.isupper() else None


def _answer_tokens(text):
    """The tokens of an answer without outer markdown emphasis (**72**), or None if it cannot be
    tokenized."""
    try:
        return tokenize(text.strip().strip("*_"))
    except ValueError:
        return None


def _read(tokens):
    """The tree of an answer's tokens (see parse_answer), or None."""
    if not tokens:
        return None
    letter = _choice(tokens)
    if letter is not None:
        return Choice(letter)
    words = _word_text(tokens)
    if words and any(kind == "text" or (len(value) >= 3 and value not in WORD_COMMANDS)
                     for kind, value in tokens):
        return Text(words)
    try:
        return _Parser(tokens).answer()
    except ValueError:  # Unreadable, or a malformed number
        return None


def parse_answer(text: str):
    """
    The tree of one answer string, or None if it is not a form this module reads. Outer markdown
    emphasis (**x**), $...$, \\(...\\), \\boxed{}, \\left/\\right, spacing, \\%, \\$, degree signs
    and a final full stop are dropped. An answer of one capital letter, bare or in parentheses or
    \\text{}, is a Choice; one made only of words and \\text{} with a \\text{} or a word of three or
    more letters (not sin, sqrt, ...) is a Text; anything else is parsed by _Parser. A \\text{} of
    words after a value is a unit and dropped (5\\text{ cm}, 15\\mbox{ cm}^2), unless it hedges
    (\\text{ or more}); \\text{} elsewhere (3 \\text{ or } 4) is unreadable.
    """
    tokens = _answer_tokens(text) if len(text) <= MAX_CHARS else None
    return None if tokens is None else _read(tokens)

# -----------------------------------------------------------------------------
# values: exact where possible (Fraction, Gaussian), else complex floats


class Gaussian(NamedTuple):
    """An exact complex number re + im*i with Fraction parts (im != 0), so that 6 - 5i is compared
    exactly."""
    re: Fraction
    im: Fraction

    def __complex__(self):
        return complex(self.re, self.im)


def _exact_complex(re, im):
    return re if im == 0 else Gaussian(re, im)


def _is_exact(value):
    return isinstance(value, (Fraction, Gaussian))


def _parts(value):
    return (value.re, value.im) if isinstance(value, Gaussian) else (value, 0)


def _bits(value):
    """The size of an exact value: the longest numerator or denominator of its parts, in bits."""
    return max(max(part.numerator.bit_length(), part.denominator.bit_length())
               for part in _parts(value))


def _checked(value):
    """value, unless it is an exact number over MAX_BITS or an infinite or NaN float: then
    Unreadable."""
    if isinstance(value, complex):
        if not (math.isfinite(value.real) and math.isfinite(value.imag)):
            raise Unreadable("not a finite number")
    elif _bits(value) > MAX_BITS:
        raise Unreadable("number too large")
    return value


ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def _arith(symbol, a, b):
    """a symbol b for symbol in + - * /: Fraction or Gaussian arithmetic when both are exact,
    complex otherwise."""
    if type(a) is Fraction and type(b) is Fraction:
        return _checked(ARITHMETIC[symbol](a, b))
    if not (_is_exact(a) and _is_exact(b)):
        return _checked(ARITHMETIC[symbol](complex(a), complex(b)))
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    if symbol in "+-":
        return _checked(_exact_complex(ARITHMETIC[symbol](ar, br), ARITHMETIC[symbol](ai, bi)))
    if symbol == "*":
        return _checked(_exact_complex(ar * br - ai * bi, ar * bi + ai * br))
    norm = br * br + bi * bi
    if norm == 0:
        raise ZeroDivisionError("division by zero")
    return _checked(_exact_complex((ar * br + ai * bi) / norm, (ai * br - ar * bi) / norm))


def _integer_root(m, n):
    """The integer r >= 0 with r**n == m (m >= 0), or None."""
    guess = math.isqrt(m) if n == 2 else round(m ** (1 / n))
    return next((r for r in (guess - 1, guess, guess + 1) if r >= 0 and r ** n == m), None)


def _exact_root(value, n):
    """The exact n-th root of a Fraction value >= 0, or None when it is irrational."""
    numerator, denominator = _integer_root(value.numerator, n), _integer_root(value.denominator, n)
    return None if numerator is None or denominator is None else Fraction(numerator, denominator)


def _root(value, n):
    """\\sqrt[n]{value}: exact when it is rational; the real root of a negative number for odd n;
    i*sqrt(-v) for n = 2 and v < 0 (exact if rational); the principal complex root otherwise."""
    if isinstance(value, Fraction) and (value >= 0 or n % 2 == 1):
        exact = _exact_root(abs(value), n)
        magnitude = exact if exact is not None else complex(float(abs(value)) ** (1 / n))
        return magnitude if value >= 0 else _arith("-", Fraction(0), magnitude)
    if isinstance(value, Fraction) and n == 2:
        exact = _exact_root(-value, 2)
        return Gaussian(Fraction(0), exact) if exact is not None else complex(0, math.sqrt(-value))
    return _checked(complex(value) ** (1 / n))


def _power(base, exponent):
    """base ** exponent: exact for an exact base and an integer exponent (refused when the result
    would exceed MAX_BITS: 10^{10^{10}} is never computed); for a rational base and exponent p/q,
    (\\sqrt[q]{base})^p (the real root for odd q, so (-8)^{1/3} is -2 as \\sqrt[3]{-8} is); the
    principal complex power otherwise."""
    if _is_exact(base) and isinstance(exponent, Fraction):
        if exponent.denominator == 1:
            n = exponent.numerator
            if abs(n) * max(_bits(base), 1) > MAX_BITS:
                raise Unreadable("power too large")
            if isinstance(base, Fraction):
                return base ** n
            result, square, m = Fraction(1), base, abs(n)  # a Gaussian: square and multiply
            while m:
                if m & 1:
                    result = _arith("*", result, square)
                m >>= 1
                if m:
                    square = _arith("*", square, square)
            return _arith("/", Fraction(1), result) if n < 0 else result
        if (isinstance(base, Fraction) and (base >= 0 or exponent.denominator % 2)
            and exponent.denominator <= MAX_ROOT):
            return _power(_root(base, exponent.denominator), Fraction(exponent.numerator))
    return _checked(complex(base) ** complex(exponent))


CONSTANTS = {"pi": complex(math.pi), "e": complex(math.e), "i": Gaussian(Fraction(0), Fraction(1))}


def _value(node, point):
    """The value of a scalar tree with its variables set from point: a Fraction, a Gaussian or a
    complex. Raises ArithmeticError or ValueError where it is undefined (division by zero, infinity
    in arithmetic, too large)."""
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "var":
        return point[node[1]]
    if kind == "const":
        if node[1] == "inf":
            raise Unreadable("arithmetic with infinity")
        return CONSTANTS[node[1]]
    if kind == "neg":
        return _arith("-", Fraction(0), _value(node[1], point))
    if kind in ARITHMETIC:
        return _arith(kind, _value(node[1], point), _value(node[2], point))
    if kind == "^":
        return _power(_value(node[1], point), _value(node[2], point))
    if kind == "root":
        return _root(_value(node[2], point), node[1])
    if kind == "fn":
        return _checked(FUNCTIONS[node[1]](complex(_value(node[2], point))))
    if kind == "abs":
        value = _value(node[1], point)
        if isinstance(value, Fraction):
            return abs(value)
        return (_root(value.re ** 2 + value.im ** 2, 2) if isinstance(value, Gaussian)
                else complex(abs(value)))
    raise Unreadable("\\pm inside a tuple, interval or expression")


def _variables(node):
    if not _is_scalar(node):
        return set()
    if node[0] == "var":
        return {node[1]}
    return set().union(*(_variables(child) for child in node[1:] if _is_scalar(child)))


def _random_points():
    """N_POINTS rows of MAX_VARIABLES non-integer Fractions (numerator 11-97, denominator 3, 7, 11
    or 13), drawn once from random.Random(POINTS_SEED): exact, deterministic, away from 0, 1 and
    other special values. The odd rows are negative, so |x| and x, or \\sqrt{x^2} and x, differ."""
    rng = random.Random(POINTS_SEED)
    rows = []
    for k in range(N_POINTS):
        row = []
        while len(row) < MAX_VARIABLES:
            value = Fraction(rng.randint(11, 97), rng.choice((3, 7, 11, 13))) * (-1) ** k
            if value.denominator > 1 and value not in row:
                row.append(value)
        rows.append(tuple(row))
    return tuple(rows)


POINTS = _random_points()


def _try_value(node, point):
    try:
        return _value(node, point)
    except (ArithmeticError, ValueError):
        return None


def _close(pred, gold):
    """Whether two values agree: exact values must be equal; a rational (exact) pred never equals an
    inexact (irrational) gold, so 1.414 is not \\sqrt2 however many digits it has; an inexact pred
    is compared with REL_TOL (\\sin(\\pi/6) and \\sqrt2\\sqrt2 are computed in floating point)."""
    if _is_exact(pred):
        return _is_exact(gold) and pred == gold
    pred, gold = complex(pred), complex(gold)
    return abs(pred - gold) <= REL_TOL * max(abs(pred), abs(gold), 1.0)


def _infinity_sign(node):
    return 1 if node == INFINITY else -1 if node == ("neg", INFINITY) else 0


def _points(*nodes):
    """The points at which to compare nodes: one empty point without variables, else N_POINTS (None
    if too many)."""
    names = sorted(set().union(*map(_variables, nodes)))
    if len(names) > MAX_VARIABLES:
        return None
    return [{}] if not names else [dict(zip(names, row)) for row in POINTS]


def _same_value(pred, gold):
    """Whether two scalar trees have the same value (_close) at every point where either is defined,
    with at least MIN_POINTS such points when there are variables; ±infinity only equals itself."""
    if _infinity_sign(pred) or _infinity_sign(gold):
        return _infinity_sign(pred) == _infinity_sign(gold)
    points = _points(pred, gold)
    if points is None:
        return False
    agreed = 0
    for point in points:
        pred_value, gold_value = _try_value(pred, point), _try_value(gold, point)
        if pred_value is None and gold_value is None:
            continue
        if pred_value is None or gold_value is None or not _close(pred_value, gold_value):
            return False
        agreed += 1
    return agreed >= min(len(points), MIN_POINTS)


def _proportional(pred, gold, positive):
    """Whether pred = c * gold at every point for one constant c != 0 (c > 0 if positive): the same
    equation (c any) or inequality (c > 0) written as pred = 0 and gold = 0 (34x+45y-20z+100=0
    equals its negation and multiples)."""
    points = _points(pred, gold)
    if points is None:
        return False
    values = [(_try_value(pred, point), _try_value(gold, point)) for point in points]
    values = [(p, g) for p, g in values if p is not None or g is not None]
    if len(values) < min(len(points), MIN_POINTS) or any(p is None or g is None for p, g in values):
        return False
    ratio = next((_arith("/", p, g) for p, g in values if not _close(g, Fraction(0))), None)
    if ratio is None:  # gold is 0 = 0 wherever it is defined
        return all(_close(p, Fraction(0)) for p, _ in values)
    if _close(ratio, Fraction(0)) or (positive and not _is_positive(ratio)):
        return False
    # an irrational factor (\sqrt2 x = 2 against x = \sqrt2) is compared inexactly
    exact = _is_exact(ratio)
    return all(_close(p if exact else complex(p), _arith("*", ratio, g)) for p, g in values)


def _is_positive(value):
    """Whether a value is a positive real number (an inexact one within REL_TOL of the real
    axis)."""
    if isinstance(value, Fraction):
        return value > 0
    return isinstance(value, complex) and value.real > 0 and abs(value.imag) <= REL_TOL * abs(value)


def _same_unordered(preds, golds):
    """Whether preds can be paired one to one with equal golds (duplicates count)."""
    if len(preds) != len(golds):
        return False
    unused = list(preds)
    for gold in golds:
        match = next((i for i, pred in enumerate(unused) if _same(pred, gold)), None)
        if match is None:
            return False
        unused.pop(match)
    return True


def _is_assignment(node):
    return isinstance(node, Relation) and node.op in ("=", "in") and _is_variable(node.left)


def _same_relation(pred, gold):
    """Relations with the same operator: assignments with a structure on the right (x \\in [-2, 7],
    x = 1 \\pm \\sqrt2) need the same variable and right side; scalar relations compare left - right
    up to a constant factor (positive for < and \\le): x \\ge 2 equals 2 \\le x, y = 2x+3 equals 2x
    - y + 3 = 0."""
    if pred.op != gold.op:
        return False
    if not (_is_scalar(gold.right) and _is_scalar(pred.right)):
        return (_is_assignment(pred) and _is_assignment(gold) and pred.left == gold.left
                and _same(pred.right, gold.right))
    return _proportional(("-", pred.left, pred.right), ("-", gold.left, gold.right),
                         gold.op in ("<", "le"))


def _same(pred, gold):
    """Whether two trees state the same answer. An assignment (x = 11, y = 2x + 3, x \\in [-2, 7])
    equals its right side both ways; other relations only equal relations. A Set (list, \\{\\}, ±)
    equals a Set with the same items in any order, and a one-item Set its item; a one-value gold
    never equals a list of several values. A Seq needs the same brackets and items in order; a Union
    the same members in any order; a Matrix the same shape and entries. Scalars compare by value."""
    if isinstance(gold, Relation) or isinstance(pred, Relation):
        if isinstance(gold, Relation) and isinstance(pred, Relation):
            return _same_relation(pred, gold)
        if isinstance(gold, Relation):
            return _is_assignment(gold) and _same(pred, gold.right)
        return _is_assignment(pred) and _same(pred.right, gold)
    if isinstance(pred, Set) and len(pred.items) == 1 and not isinstance(gold, Set):  # \\{3\\} is 3
        return _same(pred.items[0], gold)
    if isinstance(gold, Set) and len(gold.items) == 1 and not isinstance(pred, Set):
        return _same(pred, gold.items[0])
    if _is_scalar(gold):
        return _is_scalar(pred) and _same_value(pred, gold)
    if type(pred) is not type(gold):
        return False
    if isinstance(gold, Set):
        return _same_unordered(pred.items, gold.items)
    if isinstance(gold, Union):
        return _same_unordered(pred.members, gold.members)
    if isinstance(gold, Seq):
        return ((pred.opener, pred.closer) == (gold.opener, gold.closer)
                and len(pred.items) == len(gold.items)
                and all(_same(p, g) for p, g in zip(pred.items, gold.items)))
    if isinstance(gold, Matrix):
        return (len(pred.rows) == len(gold.rows) and len(pred.rows[0]) == len(gold.rows[0])
                and all(_same_value(p, g)
                        for pr, gr in zip(pred.rows, gold.rows) for p, g in zip(pr, gr)))
    return pred == gold  # Text, Choice


def _is_number(node):
    return _is_scalar(node) and not _variables(node) and not _infinity_sign(node)


def _without_unit_words(tokens):
    """tokens without their trailing plain words ("18 apples", "18cm", "$72 per week"), or None when
    there are none, nothing before them, or one is a single letter (5 x is 5x in LaTeX), a hedge
    (HEDGE_WORDS) or a function name."""
    start = len(tokens)
    while start > 0 and tokens[start - 1][0] in ("word", "text"):
        start -= 1
    words = (" ".join(value for _, value in tokens[start:]).lower()
             .replace("-", " ").replace("'", " ").split())
    if (start == 0 or not words
        or any(len(word) < 2 or word in HEDGE_WORDS or word in WORD_COMMANDS for word in words)):
        return None
    return tokens[:start]


def is_equiv_math(pred: str | None, gold: str) -> bool:
    """
    Whether the predicted answer string states the MATH gold answer. The rules, leaning to False
    when in doubt:
      - Numbers are exact: every LaTeX spelling of a value reads to the same Fraction (\\frac12,
        \\dfrac{1}{2}, 0.5, 1/2, 50\\% is 50, 10,\\!080, \\$5, 90^\\circ is 90, 1.5\\times10^3,
        2\\frac{1}{2} and 2 1/2 are 5/2); 0.333 is not \\frac13. Radicals, \\pi, e and functions are
        computed in floating point and compared with REL_TOL, but a rational pred never equals an
        irrational gold (1.41421356 is not \\sqrt2).
      - Expressions with variables agree at N_POINTS fixed rational points (exact arithmetic where
        possible).
      - x = 11 and 11 credit each other both ways (one variable assigned); y = 2x + 3 equals 2x + 3;
        an equation equals its negation and nonzero multiples; an inequality keeps its direction (y
        \\le 2x is 2x \\ge y), and one between a variable and a constant is the interval it states
        (x \\ge 2 is [2, \\infty)).
      - Intervals and tuples need the same brackets and items in order: (1, 2) may be an open
        interval or an ordered pair, and both readings give the same verdict, so it is compared as
        the gold reads whichever it means ((2, 1), [1, 2) and "1, 2" are not it); unions, sets and
        lists "1, 2, 3" are unordered; a ± b is the list {a+b, a-b}, so gold \\pm 3 is credited by
        "3, -3" but not by "3"; a one-value gold never credits a list of several (\\{3\\} is 3);
        matrices compare entrywise, and a tuple is not a column vector.
      - Words compare letters and digits case-insensitively (\\text{Evelyn} and Evelyn); a choice
        letter must match ((A), \\text{(A)}, \\textbf{(A)}, A); \\text{} units after a value are
        dropped; against a number gold, trailing plain words are units too ("18 apples", as
        answers.is_equiv reads them).
      - Conventions: an integer before a proper fraction is a mixed number (MATH's 137
        \\frac{1}{2}); 204_5 is the numeral 204 (the question names the base); i is the imaginary
        unit, e Euler's number, \\log base 10.
      - A pred that does not parse is False; a gold that does not parse is matched token for token.
    """
    if pred is None or gold is None or len(pred) > MAX_CHARS or len(gold) > MAX_CHARS:
        return False
    pred_tokens, gold_tokens = _answer_tokens(pred), _answer_tokens(gold)
    if pred_tokens is None or gold_tokens is None:
        return False
    gold_tree = _read(gold_tokens)
    if gold_tree is None:
        return pred_tokens == gold_tokens != []
    if isinstance(gold_tree, Text):
        return _word_text(pred_tokens) == gold_tree.words
    pred_tree = _read(pred_tokens)
    if pred_tree is not None and _same(pred_tree, gold_tree):
        return True
    number_tokens = _without_unit_words(pred_tokens) if _is_number(gold_tree) else None
    number_tree = _read(number_tokens) if number_tokens else None
    return number_tree is not None and _is_number(number_tree) and _same(number_tree, gold_tree)
