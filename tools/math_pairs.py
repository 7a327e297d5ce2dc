"""
MATH-style (pred, gold) pairs made from the 500 MATH-500 golds (data/math500/test.jsonl), each labelled by how it
was made: an equivalent rewriting of the gold (True) or a near miss (False). The pairs are scored by
math_answers.is_equiv_math and, when it is installed (pip install math-verify), by Hugging Face's Math-Verify, the
outside oracle of docs/math_checker.md.

    python tools/math_pairs.py                       # the pairs, the agreement, every disagreement, the timing
    python tools/math_pairs.py --out disagreements.jsonl

Rewritings: \\dfrac for \\frac, \\frac12 and \\sqrt3 for braced arguments, spacing, $...$, \\boxed{}, \\left( \\right),
"x = " before a value and "x \\in" before an interval (and the reverse), \\text{} units, thousands separators,
decimals for fractions with finite decimals and fractions for decimals, mixed numbers, reordered terms, sets, lists
and unions, \\pm written out, pmatrix as bmatrix, degree signs dropped, base subscripts braced, words without
\\text{}, and hand-written algebraic forms of the expression golds (expanded against factored, negated and scaled
equations: ALGEBRA). Near misses: a changed digit, a flipped sign, a reciprocal, a dropped, added or swapped item, a
flipped interval end, a hedge ("3 or 4"), a list against one value, a short decimal for an irrational or
non-terminating value, \\pm as one value, another variable, another choice letter or word, ALGEBRA's, and the
next different gold (neither string a part of the other: 5 and x=5 are skipped).
The pairs are the same on every run (random.Random(seed) picks which rewritings each gold gets).
"""
import argparse
import json
import os
import random
import statistics
import sys
import time
from fractions import Fraction

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from math_answers import is_equiv_math  # noqa: E402  (the library's module, from tools/)

MATH500 = os.path.join(ROOT, "data", "math500", "test.jsonl")
PER_GOLD = 3  # rewritings and near misses an integer gold gets, of each label (the other golds get all that apply)
# Hand-written forms of MATH-500's expression, equation and ± golds: (equivalent forms, near misses).
ALGEBRA = {
    "p - q": (["-q + p", "-(q - p)"], ["q - p", "p + q"]),
    "x^3+3x-6": (["x(x^2+3)-6", "-6 + 3x + x^3"], ["x^3+3x+6", "x^3-3x-6"]),
    "x^5 - x^4 + x^3 - x^2 + x - 1": (["(x-1)(x^4+x^2+1)", "\\frac{x^6-1}{x+1}"], ["x^5+x^4+x^3+x^2+x+1"]),
    "x^8 + x^7 + x^6 + x^5 + x^4 + x^3 + x^2 + x + 1": (["\\frac{x^9-1}{x-1}"], ["\\frac{x^9+1}{x+1}"]),
    "\\cot x": (["\\frac{\\cos x}{\\sin x}", "\\frac{1}{\\tan x}"], ["\\tan x", "\\cos x"]),
    "2k+2": (["2(k+1)", "2+2k"], ["2k+1", "2(k+2)"]),
    "2k": (["k+k", "k \\cdot 2"], ["k^2", "k+2"]),
    "(a+5)(b+2)": (["ab+2a+5b+10", "(b+2)(a+5)"], ["(a+2)(b+5)", "ab+10"]),
    "-13x+3": (["3-13x"], ["13x-3", "-13x-3"]),
    "15x - 80": (["5(3x-16)"], ["15x+80", "15(x-80)"]),
    "6r^2-4r-24": (["2(3r^2-2r-12)"], ["6r^2+4r-24", "6r^2-4r+24"]),
    "5r^5": (["\\frac{10r^5}{2}", "5 r^{5}"], ["5r^4", "r^5"]),
    "3R^2": (["R^2 \\cdot 3", "3 R^{2}"], ["3R", "9R^2"]),
    "8n^2 + 4n + 1": (["(2n+1)^2 + 4n^2"], ["8n^2+4n-1", "(2n+1)^2"]),
    "\\frac{11+9a}{20}": (["\\frac{9a+11}{20}", "\\frac{11}{20}+\\frac{9a}{20}"], ["\\frac{11+9a}{2}", "\\frac{11-9a}{20}"]),
    "y = 2x + 3": (["2x+3", "y=3+2x", "y - 2x = 3", "2x - y + 3 = 0"], ["y = 2x - 3", "y = 3x + 2"]),
    "y = -2x": (["-2x", "2x + y = 0", "y=-2x"], ["y = 2x", "x = -2y"]),
    "x=5": (["5", "5 = x"], ["x = -5", "y = 5"]),
    "5x - 7y + 11z + 4 = 0": (["-5x+7y-11z-4=0", "10x-14y+22z+8=0", "5x-7y+11z=-4"],
                              ["5x-7y+11z-4=0", "5x+7y+11z+4=0"]),
    "x \\in [-2,7]": (["[-2,7]", "[-2, 7]"], ["(-2,7)", "[-2,7)"]),
    "1 \\pm \\sqrt{19}": (["1+\\sqrt{19}, 1-\\sqrt{19}", "1-\\sqrt{19},1+\\sqrt{19}"], ["1+\\sqrt{19}", "\\pm\\sqrt{19}"]),
    "3 \\pm 2 \\sqrt{2}": (["3+2\\sqrt2, 3-2\\sqrt2", "3 \\pm \\sqrt{8}"], ["3+2\\sqrt{2}", "3 \\pm \\sqrt{2}"]),
    "\\{1\\pm\\sqrt{5},-2\\}": (["-2, 1+\\sqrt5, 1-\\sqrt5"], ["1+\\sqrt5, 1-\\sqrt5"]),
    "-2 + 7i": (["7i - 2"], ["-2 - 7i", "2 + 7i"]),
}
TEXTS = ("Evelyn", "Navin", "east", "ellipse", "even")  # MATH-500's word answers: another one is a near miss

# -----------------------------------------------------------------------------
# reading the gold's form (plain string work, no parser: the generator must not share the checker's mistakes)


def integer(gold):
    """The int a gold like '42', '-7', '10,\\!080', '58,500' or '\\$32,\\!348' states, or None ('-2,1' is a list)."""
    groups = gold.removeprefix("\\$").replace("\\!", "").replace(" ", "").split(",")
    grouped = len(groups) == 1 or (1 <= len(groups[0].lstrip("-")) <= 3 and all(len(g) == 3 for g in groups[1:]))
    plain = "".join(groups)
    return int(plain) if grouped and plain.lstrip("-").isdigit() else None


def fraction(gold):
    """The Fraction of a gold '\\frac{a}{b}' / '\\dfrac{a}{b}' / '-\\frac{a}{b}' / '\\frac ab' with integers a, b, or None."""
    sign, body = (-1, gold[1:]) if gold.startswith("-") else (1, gold)
    for command in ("\\frac", "\\dfrac"):
        if body.startswith(command):
            rest = body[len(command):].strip()
            if rest.startswith("{") and "}{" in rest and rest.endswith("}"):
                numerator, denominator = rest[1:-1].split("}{", 1)
            elif rest.isdigit() and len(rest) == 2:
                numerator, denominator = rest
            else:
                return None
            if numerator.isdigit() and denominator.isdigit():
                return sign * Fraction(int(numerator), int(denominator))
    return None


def decimal(gold):
    """The Fraction of a gold like '0.15', '.0000672', '326.5', or None."""
    whole, point, digits = gold.partition(".")
    return Fraction(gold) if point and (whole in ("", "-") or whole.lstrip("-").isdigit()) and digits.isdigit() else None


def finite_decimal(value):
    """value as a decimal string ('0.15', '-2.5') when it has a finite one of at most 20 places, else None."""
    for places in range(1, 21):
        scaled = value * 10 ** places
        if scaled.denominator == 1:
            digits = str(abs(scaled.numerator)).rjust(places + 1, "0")
            return ("-" if value < 0 else "") + digits[:-places] + "." + digits[-places:]
    return None


def top_level_split(text, separators):
    """text split before separators outside brackets and braces, not after ^ _ { ( or a backslash (there a sign is
    unary): '(1,2),3' -> ['(1,2)', ',3'] for ','; '-2+7i' -> ['-2', '+7i'] for '+-'."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char in "([{") - (char in ")]}")
        if depth == 0 and char in separators and i > start and text[i - 1] != "\\" and text[i - 1] not in "^_{(":
            parts.append(text[start:i])
            start = i
    return parts + [text[start:]]


def bracketed(gold):
    """(opener, items, closer) of a tuple or interval gold '(a, b)', '\\left( a, b \\right)', '[a, b)', or None."""
    body = gold.replace("\\left", "").replace("\\right", "").strip()
    if body[:1] not in "([" or body[-1:] not in ")]" or "\\cup" in body:
        return None
    items = [item.lstrip(",").strip() for item in top_level_split(body[1:-1], ",")]
    return (body[0], items, body[-1]) if len(items) >= 2 else None


def changed_digit(gold):
    """gold with the last digit of its last number (not in a subscript, nor in a unit's power) changed: 42 -> 43."""
    unit = min((gold.find(marker) for marker in ("\\text", "\\mbox") if marker in gold), default=len(gold))
    for i in range(unit - 1, -1, -1):
        if gold[i].isdigit() and "_" not in gold[max(0, i - 2):i + 1]:
            return gold[:i] + str((int(gold[i]) + 1) % 10) + gold[i + 1:]
    return None

# -----------------------------------------------------------------------------
# the rewritings (label True) and near misses (label False): each returns a pred, or None where it does not apply


def rewritings(gold):
    """{name: pred} of the equivalent rewritings that apply to gold."""
    forms = {"dollars": f"${gold}$", "boxed": f"\\boxed{{{gold}}}"}
    if "\\frac" in gold:
        forms["dfrac"] = gold.replace("\\frac", "\\dfrac")
        forms["tfrac"] = gold.replace("\\frac", "\\tfrac")
    if "\\!" not in gold and "{,}" not in gold and ("+" in gold or "=" in gold or "," in gold):
        forms["spacing"] = gold.replace("+", " + ").replace("=", " = ").replace(",", ", ")
    for digit in "23456789":
        if f"\\sqrt{{{digit}}}" in gold:
            forms["sqrt_unbraced"] = gold.replace(f"\\sqrt{{{digit}}}", f"\\sqrt{digit}")
        if f"\\sqrt{digit}" in gold:
            forms["sqrt_braced"] = gold.replace(f"\\sqrt{digit}", f"\\sqrt{{{digit}}}")
    n, value = integer(gold), fraction(gold) or decimal(gold)
    number = n is not None or value is not None
    if number or gold.endswith("\\pi") or gold.startswith("\\sqrt"):
        forms["assigned"] = f"x = {gold}"
    if number:
        forms["unit"] = f"{gold} \\text{{ units}}"
    if n is not None:
        forms["decimal_zero"] = f"{n}.0"
        forms["doubled_fraction"] = f"\\frac{{{2 * n}}}{{2}}"
        if abs(n) >= 1000:
            grouped = f"{abs(n):,}"
            forms["thousands"] = ("-" if n < 0 else "") + (grouped if "," not in gold else grouped.replace(",", ""))
            forms["thousands_latex"] = ("-" if n < 0 else "") + grouped.replace(",", "{,}")
    if value is not None and value.denominator > 1:
        as_decimal, text = finite_decimal(value), gold
        if as_decimal and "." not in gold:
            forms["decimal"] = as_decimal
        if "." in text:
            forms["fraction"] = f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
        forms["slash"] = f"{value.numerator}/{value.denominator}"
        forms["unreduced"] = f"\\frac{{{2 * value.numerator}}}{{{2 * value.denominator}}}"
        if value < 0:
            forms["sign_inside"] = f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
        if abs(value.numerator) < 10 and value.denominator < 10:
            forms["frac_unbraced"] = f"{'-' if value < 0 else ''}\\frac{abs(value.numerator)}{value.denominator}"
        if abs(value) > 1 and value.denominator <= 100:
            whole, rest = divmod(abs(value.numerator), value.denominator)
            forms["mixed"] = ("-" if value < 0 else "") + f"{whole}\\frac{{{rest}}}{{{value.denominator}}}"
    coefficient, radical, radicand = gold.replace(" ", "").partition("\\sqrt")
    if radical and coefficient.isdigit() and radicand.strip("{}").isdigit():
        forms["radical_inside"] = f"\\sqrt{{{int(coefficient) ** 2 * int(radicand.strip('{}'))}}}"
    if gold.endswith("\\pi") and gold[:-3].strip().isdigit():
        forms["pi_commuted"] = f"\\pi \\cdot {gold[:-3].strip()}"
    if gold.endswith("^\\circ"):
        forms["no_degree"] = gold[:-len("^\\circ")]
        forms["degree_braced"] = gold[:-len("^\\circ")] + "^{\\circ}"
    if "_" in gold and gold.split("_")[0].isdigit():
        digits, base = gold.split("_")
        forms["base_braced"] = f"{digits}_{{{base.strip('{}')}}}"
        forms["base_dropped"] = digits
    if gold.startswith("\\text{") and gold.endswith("}"):
        word = gold[len("\\text{"):-1]
        forms["plain_word"] = word.strip("()")
        forms["bold_word"] = f"\\textbf{{{word}}}"
    if "pmatrix" in gold:
        forms["bmatrix"] = gold.replace("pmatrix", "bmatrix")
    parts = bracketed(gold)
    if parts:
        opener, items, closer = parts
        forms["left_right"] = f"\\left{opener} {', '.join(items)} \\right{closer}"
        if opener + closer != "()" and "\\infty" not in gold:
            forms["interval_assigned"] = f"x \\in {gold}"
    items = top_level_split(gold.strip("\\{}") if gold.startswith("\\{") else gold, ",")
    if len(items) >= 2 and not parts and n is None:
        items = [item.lstrip(",").strip() for item in items]
        forms["reordered"] = ", ".join(items[::-1])
        forms["as_set"] = "\\{" + ", ".join(items) + "\\}"
    if "\\cup" in gold:
        forms["union_reordered"] = " \\cup ".join(member.strip() for member in gold.split("\\cup")[::-1])
    if gold.endswith("i") and ("+" in gold[1:] or "-" in gold[1:]):
        terms = top_level_split(gold.replace(" ", ""), "+-")
        forms["complex_reordered"] = terms[1].lstrip("+") + ("+" if not terms[0].startswith("-") else "") + terms[0]
    forms.update({f"algebra_{i}": form for i, form in enumerate(ALGEBRA.get(gold, ((), ()))[0])})
    return {name: form for name, form in forms.items() if form and form != gold}


def near_misses(gold):
    """{name: pred} of the near misses that apply to gold."""
    forms = {"changed_digit": changed_digit(gold)}
    n, value = integer(gold), fraction(gold) or decimal(gold)
    scalar = n is not None or value is not None or gold.endswith("\\pi") or gold.startswith("\\sqrt")
    if scalar and n != 0:
        forms["sign_flipped"] = gold[1:] if gold.startswith("-") else f"-{gold}"
    if n is not None:
        forms["hedged"] = f"{n} or {n + 1}"
        forms["list_for_one"] = f"{n}, {n + 1}"
        if n not in (0, 1):
            forms["squared"] = f"{n}^2" if n > 0 else f"({n})^2"
            forms["halved"] = f"\\frac{{{n}}}{{2}}"
    if value is not None and value.numerator not in (0, value.denominator):
        forms["reciprocal"] = f"\\frac{{{value.denominator}}}{{{value.numerator}}}"
        if finite_decimal(value) is None:
            forms["short_decimal"] = f"{float(value):.3f}"
    if gold.startswith("\\sqrt{") and gold.endswith("}") and gold[6:-1].isdigit():
        forms["short_decimal"] = f"{int(gold[6:-1]) ** 0.5:.4f}"
        forms["long_decimal"] = f"{int(gold[6:-1]) ** 0.5:.12f}"  # a rational is never an irrational gold
    if gold.endswith("\\pi") and gold[:-3].strip().isdigit():
        forms["short_decimal"] = f"{int(gold[:-3]) * 3.14159265:.2f}"
    if " \\pm " in gold or "\\pm" in gold and "\\{" not in gold:
        forms["pm_as_plus"] = gold.replace("\\pm", "+")
    if gold.startswith("\\text{(") and len(gold) == len("\\text{(C)}"):
        forms["other_choice"] = f"({'ABCDE'[('ABCDE'.index(gold[7]) + 1) % 5]})"
    if gold.startswith("\\text{") and gold[6:-1] in TEXTS:
        forms["other_word"] = TEXTS[(TEXTS.index(gold[6:-1]) + 1) % len(TEXTS)]
    parts = bracketed(gold)
    if parts:
        opener, items, closer = parts
        if items[0] != items[1]:
            forms["swapped"] = f"{opener}{items[1]}, {items[0]}{', '.join([''] + items[2:])}{closer}"
        forms["item_dropped"] = f"{opener}{', '.join(items[:-1])}{closer}" if len(items) > 2 else None
        if "\\infty" not in gold:
            forms["end_flipped"] = f"{opener}{', '.join(items)}{')' if closer == ']' else ']'}"
    items = top_level_split(gold.strip("\\{}") if gold.startswith("\\{") else gold, ",")
    if len(items) >= 2 and not parts and n is None:
        forms["item_dropped"] = ",".join(items[:-1]).strip()
        forms["item_added"] = f"{gold}, 100" if not gold.startswith("\\{") else gold[:-2] + ", 100\\}"
    if "pmatrix" in gold:
        entries = gold.replace("\\begin{pmatrix}", "").replace("\\end{pmatrix}", "").replace("\\\\", "&").split("&")
        if "&" not in gold:
            forms["vector_as_tuple"] = "(" + ", ".join(entry.strip() for entry in entries) + ")"
    if gold.endswith("i") and "+" in gold:
        forms["conjugate"] = gold.replace("+", "-")
    variables = [i for i, char in enumerate(gold) if char in "abknpqrxyz" and not gold[i - 1:i].isalpha()
                 and not gold[i + 1:i + 2].isalpha()]  # a one-letter variable, not a command's letter
    if gold in ALGEBRA and variables:
        forms["other_variable"] = gold[:variables[0]] + "t" + gold[variables[0] + 1:]
    forms.update({f"algebra_{i}": form for i, form in enumerate(ALGEBRA.get(gold, ((), ()))[1])})
    return {name: form for name, form in forms.items() if form and form != gold}


def make_pairs(seed: int = 0, path: str = MATH500) -> list[dict]:
    """The labelled pairs: for each MATH-500 gold (file order), every rewriting and near miss that applies, or for an
    integer gold PER_GOLD of each picked by random.Random(seed). Each pair: {"pred", "gold", "label", "form",
    "unique_id"}."""
    rng = random.Random(seed)
    pairs = []
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    for at, row in enumerate(rows):
        gold = row["answer"]
        other = next(other["answer"] for other in rows[at + 1:] + rows[:at]  # the next gold not part of this one
                     if other["answer"] not in gold and gold not in other["answer"])
        misses = {**near_misses(gold), "other_gold": other}
        for label, forms in ((True, rewritings(gold)), (False, misses)):
            names = sorted(forms) if integer(gold) is None else rng.sample(sorted(forms), min(PER_GOLD, len(forms)))
            for name in names:
                pairs.append({"pred": forms[name], "gold": gold, "label": label, "form": name,
                              "unique_id": row["unique_id"]})
    return pairs


def math_verify_judge():
    """Math-Verify's verdict as a function (pred, gold) -> bool, or None if math_verify is not installed. Its README's
    call: both strings parsed as LaTeX in $...$ (parse's default extraction), then verify(gold, pred), gold first."""
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    return lambda pred, gold: bool(verify(parse(f"${gold}$"), parse(f"${pred}$")))


def timed(judge, pairs):
    """(verdicts, seconds per pair) of judge on each pair, timed with time.perf_counter after one untimed warm-up."""
    judge(pairs[0]["pred"], pairs[0]["gold"])
    verdicts, seconds = [], []
    for pair in pairs:
        start = time.perf_counter()
        verdicts.append(judge(pair["pred"], pair["gold"]))
        seconds.append(time.perf_counter() - start)
    return verdicts, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the disagreements with Math-Verify here as JSON lines")
    args = parser.parse_args()
    pairs = make_pairs(args.seed)
    ours, our_seconds = timed(is_equiv_math, pairs)
    agree_label = sum(verdict == pair["label"] for verdict, pair in zip(ours, pairs))
    print(f"{len(pairs)} pairs from {len({p['unique_id'] for p in pairs})} MATH-500 golds "
          f"({sum(p['label'] for p in pairs)} rewritings, {sum(not p['label'] for p in pairs)} near misses)")
    print(f"is_equiv_math = the generator's label: {agree_label}/{len(pairs)} ({100 * agree_label / len(pairs):.2f}%)")
    for verdict, pair in zip(ours, pairs):
        if verdict != pair["label"]:
            print(f"  label {pair['label']!s:5}  ours {verdict!s:5}  {pair['form']:18} {pair['pred']!r}  vs  {pair['gold']!r}")
    judge = math_verify_judge()
    if judge is None:
        print("math_verify is not installed (pip install math-verify): no comparison with Math-Verify")
        return
    theirs, their_seconds = timed(judge, pairs)
    disagreements = [{**pair, "ours": o, "math_verify": t} for pair, o, t in zip(pairs, ours, theirs) if o != t]
    same = len(pairs) - len(disagreements)
    print(f"\nidentical verdicts with Math-Verify: {same}/{len(pairs)} ({100 * same / len(pairs):.2f}%)")
    print(f"\n{len(disagreements)} disagreements (label = the generator's; ours = is_equiv_math; theirs = Math-Verify):")
    print(f"| {'pred':44} | {'gold':36} | label | ours  | theirs |")
    for row in disagreements:
        print(f"| {row['pred']:44} | {row['gold']:36} | {row['label']!s:5} | {row['ours']!s:5} | {row['math_verify']!s:6} |")
    print("\nseconds per pair (time.perf_counter, parse of both strings and the comparison; after one warm-up call):")
    print(f"| {'checker':14} | {'median':>10} | {'mean':>10} | {'worst':>10} |")
    for name, seconds in (("is_equiv_math", our_seconds), ("Math-Verify", their_seconds)):
        print(f"| {name:14} | {statistics.median(seconds):10.2e} | {statistics.fmean(seconds):10.2e} | "
              f"{max(seconds):10.2e} |")
    print(f"median ratio: Math-Verify / is_equiv_math = "
          f"{statistics.median(their_seconds) / statistics.median(our_seconds):.0f}x")
    if args.out:
        with open(args.out, "w") as f:
            for row in disagreements:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
