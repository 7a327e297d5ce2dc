"""
The problems a run trains and is evaluated on: GSM8K-format files (GSM8K itself, or your own),
MATH-format ones (MATH-500, and MATH's training set downloaded once and verified), and synthetic
GSM8K-format word problems for the offline demos; load_problems returns the sets a config names.
(Their prompt and tokens: template.py.)

    python data.py gsm8k --out data/gsm8k  # download + verify train/test.jsonl
    python data.py math --out data/math    # MATH's training set, sha256-verified
    python data.py synthetic --n 200 --max-operand 9 --out data/synthetic/test.jsonl
    python data.py synthetic_split --seed 1337 --out data/demo  # the three sets of synthetic_split

Every problem row is a dict {"question", "solution", "gold"}: the solution is a worked answer whose
last line is "#### N", and gold is that N as a string; an answer-only row (synthetic_split's RL and
held-out problems) has the solution "#### N" alone. On disk (GSM8K format) a row is {"question",
"answer"}. A MATH row (MATH format on disk: {"problem", "solution", "answer", "subject", "level",
"unique_id"}) keeps MATH's solution as it is, its LaTeX answer as gold, and its "subject", "level"
and "unique_id".
"""

import argparse
import ast
import hashlib
import inspect
import json
import os
import random
import sys
import urllib.error
import urllib.request

from answers import extract_answer, gold_from_solution

# -----------------------------------------------------------------------------
# GSM8K files

GSM8K_URL = ("https://raw.githubusercontent.com/openai/grade-school-math/"
             "3101c7d5072418e28b9008a6636bde82a006892c/grade_school_math/data/{split}.jsonl")
GSM8K_SHA256 = {"train": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
                "test": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"}


def load_jsonl(path: str, required_keys: tuple[str, ...] = ("question", "answer")) -> list[dict]:
    """The JSON objects of a JSONL file, one per non-blank line, each checked to have
    required_keys."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found")
    rows = []
    # -sig: a byte-order mark some editors write is not a row
    with open(path, encoding="utf-8-sig") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{line_number}: not valid JSON ({error})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line_number}: expected a JSON object, got "
                                 f"{type(row).__name__}")
            for key in required_keys:
                if key not in row:
                    raise ValueError(f"{path}:{line_number}: row has no {key!r} key (has "
                                     f"{sorted(row)})")
            rows.append(row)
    return rows


def load_gsm8k_file(path: str) -> list[dict]:
    """Problem rows {"question", "solution", "gold"} from one GSM8K-format JSONL file."""
    rows = []
    for line_number, row in enumerate(load_jsonl(path), start=1):
        for key in ("question", "answer"):
            if not isinstance(row[key], str) or not row[key].strip():
                raise ValueError(f"{path}: row {line_number}: {key!r} must be non-empty text, got "
                                 f"{row[key]!r}")
        try:
            gold = gold_from_solution(row["answer"])
        except ValueError as error:
            raise ValueError(f"{path}: row {line_number}: {error}") from None
        rows.append({"question": row["question"], "solution": row["answer"], "gold": gold})
    return rows


def load_gsm8k(data_dir: str, split: str, dataset: str = "gsm8k") -> list[dict]:
    """Problem rows of {data_dir}/{split}.jsonl, a GSM8K-format file: GSM8K's own split "train"
    (7473 rows) or "test" (1319 rows), or with dataset="jsonl" your own. The repo ships GSM8K in
    data/gsm8k; elsewhere `python data.py gsm8k --out DIR` fetches the same files."""
    path = os.path.join(data_dir, f"{split}.jsonl")
    if not os.path.isfile(path):
        how = f"for GSM8K: `python data.py gsm8k --out {data_dir}`" if dataset == "gsm8k" else \
            "dataset='jsonl' reads data_dir/{train_split}.jsonl and data_dir/{eval_split}.jsonl, " \
            "one JSON object a line: {\"question\": ..., \"answer\": worked solution ending in a " \
            "line '#### N'}"
        raise FileNotFoundError(f"{path} not found ({how})")
    return load_gsm8k_file(path)


def write_jsonl(rows: list[dict], path: str):
    """Write problem rows in GSM8K format ({"question", "answer"}), or a MATH row (one with a
    "level") in MATH format, so load_problem_file and eval.py read them back."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(math_on_disk(row) if "level" in row else
                                {"question": row["question"],
                                 "answer": row["solution"]}) + "\n" for row in rows)

# -----------------------------------------------------------------------------
# MATH files: MATH-500 ships in data/math500; the training set is downloaded on first use

# openai/prm800k's math_splits/train.jsonl (MIT): the 12,000 MATH problems (7,500 train, 4,500 test)
# that are not in MATH-500, in MATH-500's format. A Git LFS file: github.com's /raw/ serves its
# contents (raw.githubusercontent.com only its pointer), and its sha256 is the pointer's oid at that
# commit.
MATH_TRAIN_URL = ("https://github.com/openai/prm800k/raw/7ecc794703b2877f63226f2477a49b34f9b25163/"
                  "prm800k/math_splits/train.jsonl")
MATH_TRAIN_SHA256 = "90d96daeac3fe343ebb1e22ce93dd99690f75983e957f88de42f87cffe1e8076"
MATH_TRAIN_BYTES = 10_896_985
MATH_SOURCE = f"""MATH training problems: the train split of PRM800K's MATH splits
(Lightman et al., 2023, "Let's Verify Step by Step", arXiv:2305.20050), the 12,000 problems of MATH
(Hendrycks et al., 2021, arXiv:2103.03874) that are not in MATH-500 (data/math500).
  train.jsonl <- {MATH_TRAIN_URL}
  ({MATH_TRAIN_BYTES} bytes, sha256 {MATH_TRAIN_SHA256}, the Git LFS pointer's oid)
Written by `python data.py math` (data.download_math). Licences: MIT, Copyright (c) 2023 OpenAI
(openai/prm800k) and MIT, Copyright (c) 2021 Dan Hendrycks (MATH); their full texts are in
data/math500/SOURCE_AND_LICENSE.txt.
"""


def math_on_disk(row: dict) -> dict:
    """A MATH problem row as MATH's files write it: {"problem", "solution", "answer", "subject",
    "level", "unique_id"}."""
    return {"problem": row["question"], "solution": row["solution"], "answer": row["gold"],
            "subject": row.get("subject", ""), "level": row["level"],
            "unique_id": row.get("unique_id", "")}


def math_level(value) -> int | None:
    """A MATH level, 1 to 5, from 3 (PRM800K's and MATH-500's files) or "Level 3" (MATH's own); None
    for anything else: MATH itself has two problems of "Level ?"."""
    if isinstance(value, str) and value.startswith("Level ") and value[6:].isdecimal():
        value = int(value[6:])
    return value if type(value) is int and 1 <= value <= 5 else None


def math_rows(rows: list[dict], path: str, skip_unanswered: bool = False) -> list[dict]:
    """Problem rows {"question", "solution", "gold", "subject", "level", "unique_id"} from
    MATH-format JSON objects: PRM800K's and MATH-500's files ({"problem", "solution", "answer",
    "subject", "level": 3, "unique_id"}) or MATH's original ones ({"problem", "solution", "type",
    "level": "Level 3"}: the gold is the solution's last \\boxed{}). An unknown level is None
    (math_level). A row without a problem, or without a gold answer, is an error naming it; with
    skip_unanswered a row without a gold answer is left out instead (a few of MATH's solutions box
    nothing)."""
    problems = []
    for number, row in enumerate(rows, start=1):
        problem, solution = row.get("problem"), row.get("solution", "")
        solution = solution if isinstance(solution, str) else ""
        gold = row["answer"] if "answer" in row else extract_answer(solution, ("boxed",))
        for key, value in (("problem", problem), ("answer", gold)):
            if not isinstance(value, str) or not value.strip():
                if key == "answer" and skip_unanswered:
                    break
                raise ValueError(f"{path}: row {number}: {key!r} must be non-empty text (a MATH "
                                 "row has \"problem\" and \"answer\", or a solution with a "
                                 f"\\boxed{{}} answer), got {value!r}")
        else:
            problems.append({"question": problem, "solution": solution, "gold": gold.strip(),
                             "subject": str(row.get("subject", row.get("type", ""))),
                             "level": math_level(row.get("level")),
                             "unique_id": str(row.get("unique_id", ""))})
    return problems


def load_problem_file(path: str) -> list[dict]:
    """Problem rows of one JSONL file in either format, told by its first row: MATH's (a "problem"
    key: math_rows) or GSM8K's (load_gsm8k_file)."""
    rows = load_jsonl(path, required_keys=())
    if rows and "problem" in rows[0]:
        return math_rows(rows, path)
    return load_gsm8k_file(path)


def download_math(out_dir: str, url: str | None = None, sha256: str | None = None):
    """Download MATH's training problems (url, default MATH_TRAIN_URL) to out_dir/train.jsonl,
    verified against sha256 (default MATH_TRAIN_SHA256), with out_dir/SOURCE_AND_LICENSE.txt; the
    file appears only once complete. Offline, a FileNotFoundError says where to get the file and
    where to put it."""
    url = url or MATH_TRAIN_URL
    sha256 = sha256 or MATH_TRAIN_SHA256
    path = os.path.join(out_dir, "train.jsonl")
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            payload = response.read()
    except (urllib.error.URLError, OSError) as error:
        raise FileNotFoundError(
            f"{path} not found, and downloading it failed ({error}). dataset='math' trains on "
            f"MATH's training problems, {url} ({MATH_TRAIN_BYTES:,} bytes, a Git LFS file). "
            "Offline: download that file on a machine with a network (or `git lfs pull` in a "
            f"clone of openai/prm800k) and copy it to {path}; its sha256 must be {sha256}. Then "
            f"run again (`python data.py math --out {out_dir}` retries the download)") from None
    if payload.startswith(b"version https://git-lfs"):
        raise ValueError(f"{url} gave a Git LFS pointer, not the file: download it from "
                         f"github.com/.../raw/ (or `git lfs pull`), whose sha256 must be {sha256}")
    check_sha256(payload, sha256, url)
    os.makedirs(out_dir, exist_ok=True)
    temporary = f"{path}.tmp{os.getpid()}"  # one per process: torchrun's ranks may download at once
    with open(temporary, "wb") as f:
        f.write(payload)
    # atomic: an interrupted download never leaves a partial file under the real name
    os.replace(temporary, path)
    with open(os.path.join(out_dir, "SOURCE_AND_LICENSE.txt"), "w") as f:
        f.write(MATH_SOURCE)
    print(f"wrote {path} ({len(payload):,} bytes, sha256 verified)")


def problem_key(question: str) -> str:
    """A problem's text with its whitespace normalised: the same problem, however it is spaced, has
    one key."""
    return " ".join(question.split())


def load_math_train(data_dir: str, split: str, levels: tuple, heldout: list[dict]) -> list[dict]:
    """dataset="math"'s training rows: {data_dir}/{split}.jsonl (MATH format; the split "train" is
    downloaded on first use, download_math) at the given levels, less every problem whose text
    (problem_key) is a held-out one."""
    path = os.path.join(data_dir, f"{split}.jsonl")
    if not os.path.isfile(path):
        if split != "train":
            raise FileNotFoundError(f"{path} not found (dataset='math' reads "
                                    "data_dir/{train_split}.jsonl in MATH's format; only the "
                                    "split 'train' is downloaded: `python data.py math --out "
                                    f"{data_dir}`)")
        print(f"{path} not found: downloading MATH's training problems, {MATH_TRAIN_BYTES:,} bytes",
              file=sys.stderr)
        download_math(data_dir)
    raw = load_jsonl(path, required_keys=())
    if raw and "problem" not in raw[0]:
        raise ValueError(f"{path} is not in MATH's format (\"problem\", \"answer\", \"level\", "
                         "...): dataset='math' reads MATH's; use dataset='jsonl' for GSM8K-format "
                         "files")
    rows = math_rows(raw, path, skip_unanswered=True)
    at_levels = [row for row in rows if row["level"] in levels]
    held = {problem_key(row["question"]) for row in heldout}
    kept = [row for row in at_levels if problem_key(row["question"]) not in held]
    print(f"MATH training set {path}: {len(kept)} of {len(raw)} problems (levels "
          f"{', '.join(map(str, levels))}; "
          f"{len(at_levels) - len(kept)} dropped as held-out problems"
          + (f"; {len(raw) - len(rows)} without a gold answer left out"
             if len(raw) > len(rows) else "")
          + ")",
          file=sys.stderr)
    return kept


def check_sha256(payload: bytes, expected: str, source: str):
    """Refuse data whose sha256 differs from the pinned one: a changed upstream file would change
    results."""
    digest = hashlib.sha256(payload).hexdigest()
    if digest != expected:
        raise ValueError(f"{source}: sha256 is {digest}, expected {expected}; the download is "
                         "corrupt or changed")


def download_gsm8k(out_dir: str, url_template: str = GSM8K_URL):
    """Download GSM8K's train.jsonl and test.jsonl into out_dir, verified; a file appears only once
    complete."""
    os.makedirs(out_dir, exist_ok=True)
    for split, expected in GSM8K_SHA256.items():
        url = url_template.format(split=split)
        path = os.path.join(out_dir, f"{split}.jsonl")
        with urllib.request.urlopen(url, timeout=60) as response:
            payload = response.read()
        check_sha256(payload, expected, url)
        with open(path + ".tmp", "wb") as f:
            f.write(payload)
        # atomic: an interrupted run never leaves a partial file under the real name
        os.replace(path + ".tmp", path)
        print(f"wrote {path}")

# -----------------------------------------------------------------------------
# synthetic GSM8K-format word problems, and synthetic_split's warm-start, RL and held-out families

PEOPLE = (("Tom", "He"), ("Anna", "She"), ("Sam", "He"), ("Mia", "She"), ("Leo", "He"),
          ("Zoe", "She"))
THINGS = ("apples", "marbles", "stickers", "coins", "books", "pencils", "cookies", "shells")
VERBS = {"+": ("buys {} more", "finds {} more", "gets {} more"),
         "-": ("gives away {}", "loses {}", "sells {}")}
OP_BEFORE_NUMBER = {verb.split("{}")[0].split()[-1]: op
                    for op, verbs in VERBS.items() for verb in verbs}
# a chain's operations: drawn freely | all of one kind | additions and subtractions
MIXES = ("any", "one", "both")


def synthetic_problem(rng: random.Random, min_ops: int, max_ops: int, max_operand: int,
                      max_start: int, restate: bool = False, ask: bool = True) -> dict:
    """One word problem {"question", "solution", "gold"} drawn with rng (see synthetic_problems);
    restate: each solution line starts with the clause it computes ("gives away 4: 30-4=26"); ask
    False: the question without its last sentence ("How many apples does Tom have?"), the same
    draws."""
    (name, pronoun), thing = rng.choice(PEOPLE), rng.choice(THINGS)
    start = total = rng.randint(1, max_start)
    clauses, lines = [], []
    for _ in range(rng.randint(min_ops, max_ops)):
        # nothing left to take away: add instead
        op = "-" if total > 0 and rng.random() < 0.5 else "+"
        amount = rng.randint(1, min(total,
                                    max_operand)) if op == "-" else rng.randint(1, max_operand)
        new_total = total + amount if op == "+" else total - amount
        clauses.append(rng.choice(VERBS[op]).format(amount))
        lines.append(f"{clauses[-1] + ': ' if restate else ''}{total}{op}{amount}={new_total}")
        total = new_total
    actions = clauses[-1] if len(clauses) == 1 else ", ".join(clauses[:-1]) + " and " + clauses[-1]
    question = f"{name} has {start} {thing}. {pronoun} {actions}."
    if ask:
        question += f" How many {thing} does {name} have?"
    return {"question": question, "solution": "\n".join(lines + [f"#### {total}"]),
            "gold": str(total)}


def synthetic_problems(n: int, seed: int | str, min_ops: int = 1, max_ops: int = 3,
                       max_operand: int = 20, max_start: int | None = None) -> list[dict]:
    """n word problems {"question", "solution", "gold"} in GSM8K format, a deterministic function of
    seed (int or str): a start amount of 1..max_start (None: max_operand), then min_ops..max_ops
    additions/subtractions of 1..max_operand; the total never goes negative. e.g. "Tom has 12
    apples. He buys 7 more and gives away 5. How many apples does Tom have?" -> solution
    "12+7=19\\n19-5=14\\n#### 14", gold "14".
    """
    check_problem_values(dict(min_ops=min_ops, max_ops=max_ops, max_operand=max_operand,
                              max_start=max_start))
    max_start = max_operand if max_start is None else max_start
    rng = random.Random(seed)
    return [synthetic_problem(rng, min_ops, max_ops, max_operand, max_start) for _ in range(n)]


def chain_key(question: str) -> str:
    """The arithmetic of a synthetic question with its names and things dropped: the start amount,
    then each operation and operand in order, e.g. "Tom has 12 apples. He buys 7 more and gives away
    5. ..." -> "12+7-5"."""
    words = question.replace(",", " ").replace(".", " ").split()
    at = words.index("has") + 1 if "has" in words else 0  # the start amount follows "has"
    if not at or not words[at].isdecimal():
        raise ValueError(f"not a synthetic question (no 'has N'): {question!r}")
    key = words[at]
    for before, word in zip(words[at:], words[at + 1:]):
        if word.isdecimal():
            if before not in OP_BEFORE_NUMBER:
                raise ValueError(f"not a synthetic question ({before!r} before {word}): "
                                 f"{question!r}")
            key += OP_BEFORE_NUMBER[before] + word
    return key


def chain_mix(key: str) -> str:
    """"one" if a chain_key's operations are all additions or all subtractions, else "both"."""
    return "both" if {"+", "-"} <= set(key) else "one"


def answer_only(row: dict) -> dict:
    """The row as the RL stage gets it: question and final answer, the worked solution replaced by
    "#### N"."""
    return {"question": row["question"], "solution": f"#### {row['gold']}", "gold": row["gold"]}


# a planted wrong result is the right one plus one of these (never negative)
PLANTED_SLIPS = (-10, -2, -1, 1, 2, 10)


def count_check(expression: str) -> str:
    """A line's re-check by counting one at a time, each step a true equation: "30-4" ->
    "30-4=29-3=28-2=27-1=26", "26+3" -> "26+3=27+2=28+1=29". Slower than the line's own "30-4=26",
    but each step only adds or takes away 1. A total below 0 (after an unchecked slip: "-3+4")
    counts the same way."""
    op = "+" if "+" in expression[1:] else "-"
    total, _, amount = expression.rpartition(op)
    total, amount = int(total), int(amount)
    steps = [expression]
    while amount > 0:
        total, amount = total + (1 if op == "+" else -1), amount - 1
        steps.append(f"{total}{op}{amount}" if amount else str(total))
    return "=".join(steps)


def carries(total: int, op: str, amount: int) -> bool:
    """True if total op amount crosses a ten, so that a quick sum has a carry or a borrow: 17+5,
    23-5 (a total below 0, which only a slipped solution reaches, never)."""
    return (total >= 0
            and (total % 10 + amount >= 10 if op == "+" else total >= 10 and total % 10 < amount))


def rework_solution(row: dict, rng: random.Random, check: bool, error_rate: float = 0.0,
                    carry_slip: float = 0.0) -> dict:
    """The row's worked solution written again line by line, for configs/demo_aha.py: each line's
    quick result drops its carry or borrow with probability carry_slip where it has one (carries:
    "17+5=12", "23-5=28"), and with check every line is re-checked by counting (count_check), which
    finds a slip and corrects it:
        check:      "gives away 4: 30-4=26 check 30-4=29-3=28-2=27-1=26"
        slip found: "buys 5 more: 17+5=12 wait, 12 is wrong: 17+5=18+4=19+3=20+2=21+1=22"
    In a checked line error_rate also plants other slips (PLANTED_SLIPS) for the check to find. A
    checked line ends with its right result and the next line goes on from it; in an unchecked line
    a slip stands and the next line goes on from the slipped result, so the answer (the row's gold)
    is what the slips make it, as a solver who does not check would write it. Lines are "clause:
    total op amount=result" (or without the clause)."""
    lines, total = [], None
    for line in row["solution"].splitlines():
        head, equals, _ = line.rpartition("=")
        if not equals or line.lstrip().startswith("####"):
            continue
        clause, _, expression = head.rpartition(": ")
        op = "+" if "+" in expression else "-"
        start, amount = map(int, expression.split(op))  # the row's own lines: never below 0
        # the first line's start; then wherever the last line ended
        total = start if total is None else total
        expression = f"{total}{op}{amount}"
        right = total + amount if op == "+" else total - amount
        first = right
        if carry_slip > 0 and carries(total, op, amount) and rng.random() < carry_slip:
            first = right - 10 if op == "+" else right + 10
        elif check and error_rate > 0 and rng.random() < error_rate:
            first = rng.choice([right + d for d in PLANTED_SLIPS if right + d >= 0])
        lead = f"{clause}: {expression}" if clause else expression
        if not check:
            lines.append(f"{lead}={first}")
            total = first
        else:
            verdict = "check" if first == right else f"wait, {first} is wrong:"
            lines.append(f"{lead}={first} {verdict} {count_check(expression)}")
            total = right
    return {**row, "solution": "\n".join(lines + [f"#### {total}"]), "gold": str(total)}


def has_worked_solution(row: dict) -> bool:
    """True if the solution holds more than its final "#### N" line."""
    return any(line.strip() and not line.lstrip().startswith("####")
               for line in row["solution"].splitlines())


def family_problems(n: int, rng: random.Random, exclude: set[str], ops: tuple, mix: str,
                    max_operand: int, max_start: int, restate: bool, ask: bool,
                    what: str) -> list[dict]:
    """n problems of ops[0]..ops[1] operations whose chains (chain_key) are distinct, of the mix
    asked for and not in exclude; a clear error if the family runs out."""
    rows, seen = [], set(exclude)
    for _ in range(100 * n + 1000):  # plenty for a family with room; the draws are cheap
        if len(rows) == n:
            break
        row = synthetic_problem(rng, *ops, max_operand, max_start, restate, ask)
        key = chain_key(row["question"])
        if key not in seen and mix in ("any", chain_mix(key)):
            seen.add(key)
            rows.append(row)
    if len(rows) < n:
        raise ValueError(f"found only {len(rows)} of {n} {what} problems with a new chain "
                         f"({ops[0]}..{ops[1]} operations of 1..{max_operand} from 1..{max_start}, "
                         f"mix {mix!r}): ask for fewer, or widen the family")
    return rows


def synthetic_split(seed: int, warm_size: int = 5000, rl_size: int = 5000, heldout_size: int = 300,
                    warm_ops: tuple = (1, 4), rl_ops: tuple = (2, 3), warm_mix: str = "one",
                    rl_mix: str = "both",
                    max_operand: int = 9, max_start: int = 50, restate: bool = True,
                    direct_share: float = 0.0, reflect_share: float = 0.0,
                    reflect_error: float = 0.0,
                    cue_share: float = 0.0, reflect_cue: str = "Check each step.",
                    carry_slip: float = 0.0, ask: bool = True) -> tuple[list, list, list]:
    """dataset="synthetic_split": three sets, a deterministic function of seed (each set from its
    own stream, so one size does not change another set's draws); every set holds distinct chains
    (chain_key), of its ops range and mix (MIXES: "one" = only additions or only subtractions,
    "both" = both kinds in one chain); restate: each worked-solution line starts with the clause it
    computes; ask False: questions without their last sentence (synthetic_problem). The defaults
    are those of the novel-split demo (docs/experiments.md, 2026-11-23):
    - warm: warm_size problems with worked solutions (the SFT warm start), except that with
      direct_share > 0 a seeded coin per problem (its own stream) gives about that share of them the
      answer alone (answer_only: the target "</think> <answer>N</answer>", no work), so the warm
      start mixes the two behaviours (configs/demo.py); direct_share 0 draws no coin.
      configs/demo_aha.py's re-checks (rework_solution), drawn with a third coin (its own stream)
      per worked solution: about cue_share of them are asked with reflect_cue before the question
      (before, so the question's clauses lie as far from the answer as in an uncued prompt) and
      answered with a re-check by counting on each line; of the others, asked as usual, about
      reflect_share re-check every line too (a coin per solution: a coin per line gave RL nothing to
      amplify, docs/experiments.md). So the warm start learns to re-check where the question asks
      for it, and does so only rarely unprompted, as the RL and held-out questions (never cued) are
      asked. carry_slip: the share of lines with a carry or borrow whose quick result drops it, in
      every worked solution: a re-check corrects it, an unchecked solution keeps it and ends at the
      answer it leads to (its gold). reflect_error plants other slips, in re-checked lines only. All
      four 0 draw no coin;
    - rl: rl_size problems, question and final answer only (answer_only), no chain of which occurs
      in warm: no worked solution of an RL problem exists anywhere;
    - heldout: heldout_size problems of the RL family, answer only, strictly novel: no chain occurs
      in warm or rl."""
    check_split_values(dict(warm_ops=warm_ops, rl_ops=rl_ops, warm_mix=warm_mix, rl_mix=rl_mix,
                            max_operand=max_operand, max_start=max_start, restate=restate, ask=ask,
                            direct_share=direct_share, reflect_share=reflect_share,
                            reflect_error=reflect_error, cue_share=cue_share,
                            carry_slip=carry_slip))
    warm = family_problems(warm_size, random.Random(f"{seed}:warm"), set(), warm_ops, warm_mix,
                           max_operand, max_start, restate, ask, "warm-start")
    warm_chains = {chain_key(row["question"]) for row in warm}
    # a coin per warm-start problem, from its own stream; the chains stay warm chains
    if direct_share > 0:
        coin = random.Random(f"{seed}:direct")
        warm = [answer_only(row) if coin.random() < direct_share else row for row in warm]
    # a coin per worked solution, then its slips
    if reflect_share > 0 or cue_share > 0 or carry_slip > 0:
        coin = random.Random(f"{seed}:reflect")
        rows = []
        for row in warm:
            if has_worked_solution(row):
                # below cue_share: cued and checked; else checked with probability reflect_share
                draw = coin.random()
                row = rework_solution(row, coin, draw < cue_share + (1 - cue_share) * reflect_share,
                                      reflect_error, carry_slip)
                if draw < cue_share:
                    row = {**row, "question": f"{reflect_cue} {row['question']}"}
            rows.append(row)
        warm = rows
    rl = family_problems(rl_size, random.Random(f"{seed}:rl"), warm_chains, rl_ops, rl_mix,
                         max_operand, max_start, restate, ask, "RL")
    seen_chains = warm_chains | {chain_key(row["question"]) for row in rl}
    heldout = family_problems(heldout_size, random.Random(f"{seed}:heldout"), seen_chains, rl_ops,
                              rl_mix, max_operand, max_start, restate, ask, "held-out")
    return warm, [answer_only(row) for row in rl], [answer_only(row) for row in heldout]


DATASETS = ("gsm8k", "jsonl", "synthetic", "synthetic_split", "math")
# the generators' arguments that are not settings
SET_SIZES = ("n", "seed", "warm_size", "rl_size", "heldout_size")


def check_settings(cfg):
    """A ValueError naming the key unless the data a config names can be built: math_levels, and
    for the synthetic sets synthetic_args (check_synthetic_args); the dataset's name is checked by
    its setting's rule, files when the run loads them."""
    if not (cfg.math_levels and all(level in (1, 2, 3, 4, 5) for level in cfg.math_levels)):
        raise ValueError(f"math_levels must be MATH levels, some of 1 to 5, got {cfg.math_levels}")
    # another dataset does not read synthetic_args
    if cfg.dataset in ("synthetic", "synthetic_split"):
        check_synthetic_args(cfg.dataset, cfg.synthetic_args)


def check_synthetic_args(dataset: str, args: dict):
    """A ValueError unless args are keywords that dataset's generator (synthetic_problems for
    "synthetic", synthetic_split for "synthetic_split") takes, with values it accepts; the ones not
    given take its defaults."""
    maker = synthetic_split if dataset == "synthetic_split" else synthetic_problems
    parameters = inspect.signature(maker).parameters
    known = [name for name in parameters if name not in SET_SIZES]
    unknown = sorted(set(args) - set(known))
    if unknown:
        raise ValueError(f"synthetic_args has unknown key(s) {unknown}; data.{maker.__name__} "
                         f"takes {sorted(known)}")
    values = {**{name: parameters[name].default for name in known}, **args}
    (check_split_values if dataset == "synthetic_split" else check_problem_values)(values)


def check_problem_values(a: dict):
    """A ValueError unless synthetic_problems' arguments a (every one) make a family it can draw
    from."""
    max_start = a["max_operand"] if a["max_start"] is None else a["max_start"]
    if not 1 <= a["min_ops"] <= a["max_ops"] or a["max_operand"] < 1 or max_start < 1:
        raise ValueError("need 1 <= min_ops <= max_ops, max_operand >= 1 and max_start >= 1, got "
                         f"min_ops={a['min_ops']}, max_ops={a['max_ops']}, "
                         f"max_operand={a['max_operand']}, max_start={max_start}")


def check_split_values(a: dict):
    """A ValueError unless synthetic_split's arguments a (every one but the sizes) make families it
    can draw from."""
    if not 0 <= a["direct_share"] < 1:
        raise ValueError("direct_share must be in [0, 1) (the warm start needs some worked "
                         f"solutions), got {a['direct_share']}")
    shares = [a[name] for name in ("reflect_share", "cue_share", "reflect_error", "carry_slip")]
    if not all(0 <= share <= 1 for share in shares):
        raise ValueError("reflect_share, cue_share, reflect_error and carry_slip must be in [0, "
                         f"1], got {', '.join(map(str, shares[:3]))} and {shares[3]}")
    if a["max_operand"] < 1 or a["max_start"] < 1:
        raise ValueError(f"need max_operand >= 1 and max_start >= 1, got {a['max_operand']} and "
                         f"{a['max_start']}")
    for name in ("restate", "ask"):
        if not isinstance(a[name], bool):
            raise ValueError(f"{name} must be True or False, got {a[name]!r}")
    for name in ("warm_ops", "rl_ops"):
        if len(a[name]) != 2 or not 1 <= a[name][0] <= a[name][1]:
            raise ValueError(f"{name} must be (min, max) operations with 1 <= min <= max, got "
                             f"{a[name]}")
    for name, ops in (("warm_mix", a["warm_ops"]), ("rl_mix", a["rl_ops"])):
        if a[name] not in MIXES or (a[name] == "both" and ops[1] < 2):
            raise ValueError(f"{name} must be one of {MIXES} ('both' needs 2 or more operations), "
                             f"got {a[name]!r} with {ops} operations")


def load_problems(cfg) -> tuple[list[dict], list[dict], list[dict]]:
    """The (warm-start, training, held-out) problem sets a train.py config names, each a list of
    rows {"question", "solution", "gold"}. The warm start trains on the training problems, except
    with dataset="synthetic_split": there it has its own family, and the training and held-out rows
    are answer only."""
    eval_dir = cfg.eval_data_dir or cfg.data_dir
    # a missing file raises FileNotFoundError naming the path and the remedy
    if cfg.dataset in ("jsonl", "gsm8k"):
        warm = problems = load_gsm8k(cfg.data_dir, cfg.train_split, cfg.dataset)
        heldout = load_gsm8k(eval_dir, cfg.eval_split, cfg.dataset)[:cfg.eval_size]
        names = (os.path.join(cfg.data_dir, f"{cfg.train_split}.jsonl"),
                 os.path.join(eval_dir, f"{cfg.eval_split}.jsonl"))
    elif cfg.dataset == "math":
        # held out: MATH-500 (shipped); training: the rest of MATH at math_levels
        names = (os.path.join(cfg.data_dir, f"{cfg.train_split}.jsonl"),
                 os.path.join(eval_dir, f"{cfg.eval_split}.jsonl"))
        if not os.path.isfile(names[1]):
            raise FileNotFoundError(f"{names[1]} not found (dataset='math' holds out "
                                    "eval_data_dir/{eval_split}.jsonl"
                                    ", MATH-500 by default: it ships in data/math500/test.jsonl)")
        every_heldout = load_problem_file(names[1])
        warm = problems = load_math_train(cfg.data_dir, cfg.train_split, cfg.math_levels,
                                          every_heldout)
        heldout = every_heldout[:cfg.eval_size]
    elif cfg.dataset == "synthetic":
        # different seeds for the two sets; a held-out question also in training is dropped
        warm = problems = synthetic_problems(cfg.synthetic_train_size, seed=cfg.seed,
                                             **cfg.synthetic_args)
        seen = {p["question"] for p in problems}
        heldout = [p for p in synthetic_problems(cfg.synthetic_eval_size, seed=cfg.seed + 1,
                                                 **cfg.synthetic_args)
                   if p["question"] not in seen][:cfg.eval_size]
        names = ("the synthetic training set", "the synthetic held-out set")
    else:  # three families from one seed; no held-out chain occurs in the other two
        split_seed = cfg.seed if cfg.data_seed is None else cfg.data_seed
        warm, problems, heldout = synthetic_split(split_seed, cfg.synthetic_warm_size,
                                                  cfg.synthetic_train_size,
                                                  cfg.synthetic_eval_size, **cfg.synthetic_args)
        heldout = heldout[:cfg.eval_size]
        names = ("synthetic_split's RL set", "synthetic_split's held-out set")
    if not problems:
        raise ValueError(f"{names[0]} is empty: nothing to train on")
    if not heldout and cfg.eval_every > 0:
        raise ValueError(f"{names[1]} is empty: nothing to evaluate (set eval_every=0 to train "
                         "without evaluation)")
    worked = list(map(has_worked_solution, warm))
    # answers alone too
    direct = cfg.dataset == "synthetic_split" and cfg.synthetic_args.get("direct_share", 0) > 0
    if ((cfg.warm_starts or cfg.method == "sft_more")
        and not (any(worked) if direct else warm and all(worked))):
        raise ValueError("the warm start needs worked solutions: its set is empty or has a row "
                         "with only '#### N' (answer-only rows are kept on purpose only with "
                         "synthetic_split's direct_share)")
    return warm, problems, heldout


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    gsm8k = commands.add_parser("gsm8k",
                                help="download GSM8K train.jsonl and test.jsonl, sha256-verified")
    gsm8k.add_argument("--out", default="data/gsm8k", help="output directory")
    math = commands.add_parser("math",
                               help="download MATH's training problems (PRM800K's train split, "
                                    "every level), "
                               "sha256-verified; dataset='math' does this on first use")
    math.add_argument("--out", default="data/math", help="output directory")
    synthetic = commands.add_parser("synthetic",
                                    help="write synthetic problems as one GSM8K-format JSONL file")
    synthetic.add_argument("--n", type=int, default=200)
    synthetic.add_argument("--seed", type=int, default=1)
    synthetic.add_argument("--min-ops", type=int, default=1)
    synthetic.add_argument("--max-ops", type=int, default=3)
    synthetic.add_argument("--max-operand", type=int, default=20)
    synthetic.add_argument("--out", required=True, help="output .jsonl file")
    split = commands.add_parser("synthetic_split",
                                help="write synthetic_split's warm.jsonl, rl.jsonl and "
                                "heldout.jsonl, as train.py builds them with "
                                "dataset='synthetic_split'")
    split_parameters = inspect.signature(synthetic_split).parameters.items()
    split_defaults = {k: p.default for k, p in split_parameters if k != "seed"}
    split.add_argument("--seed", type=int, default=1337, help="train.py's seed")
    for key, default in split_defaults.items():
        split.add_argument(f"--{key}",
                           type=type(default) if type(default) in (int, str) else ast.literal_eval,
                           default=default, help=f"default {default!r}")
    split.add_argument("--out", required=True, help="output directory")
    args = parser.parse_args(argv)
    if args.command == "gsm8k":
        download_gsm8k(args.out)
    elif args.command == "math":
        download_math(args.out)
    elif args.command == "synthetic":
        rows = synthetic_problems(args.n, args.seed, args.min_ops, args.max_ops, args.max_operand)
        write_jsonl(rows, args.out)
        print(f"wrote {args.n} problems to {args.out}")
    else:
        sets = synthetic_split(args.seed, **{key: getattr(args, key) for key in split_defaults})
        for name, rows in zip(("warm", "rl", "heldout"), sets):
            write_jsonl(rows, os.path.join(args.out, f"{name}.jsonl"))
            print(f"wrote {len(rows)} problems to {os.path.join(args.out, name + '.jsonl')}")


if __name__ == "__main__":
    main()
