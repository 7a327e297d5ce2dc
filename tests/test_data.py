import json
import os
import re
import shutil

import pytest

from conftest import qwen_tokenizer_dir
from data import download_gsm8k, load_gsm8k, load_gsm8k_file, load_jsonl, synthetic_problems, write_jsonl
from template import CharTokenizer, format_prompt, load_tokenizer, stop_sequences, stop_token_ids

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GSM8K = os.path.join(ROOT, "data", "gsm8k")  # shipped with the repo (MIT, see its LICENSE_AND_SOURCE.txt)


@pytest.fixture(scope="module")
def qwen_dir():
    return qwen_tokenizer_dir()

# -----------------------------------------------------------------------------
# GSM8K files


def test_load_gsm8k_real_splits():
    train, test = load_gsm8k(GSM8K, "train"), load_gsm8k(GSM8K, "test")
    assert (len(train), len(test)) == (7473, 1319)
    first = train[0]
    assert first["question"].startswith("Natalia sold clips to 48 of her friends")
    assert first["solution"].endswith("#### 72") and first["gold"] == "72"
    assert all(set(row) == {"question", "solution", "gold"} and row["gold"] for row in train + test)


def test_missing_file_names_path_and_download_command(tmp_path):
    path = str(tmp_path / "nowhere" / "train.jsonl")
    with pytest.raises(FileNotFoundError, match=re.escape(path) + r".*python data.py gsm8k --out"):
        load_gsm8k(str(tmp_path / "nowhere"), "train")


def test_malformed_line_and_missing_key_name_the_line(tmp_path):
    good = json.dumps({"question": "q", "answer": "#### 1"})
    path = tmp_path / "bad.jsonl"
    path.write_text(good + "\n" + good[:-3] + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}:2") + ": not valid JSON"):
        load_jsonl(str(path))
    path.write_text(good + "\n\n" + json.dumps({"question": "q"}) + "\n")  # the blank line still counts
    with pytest.raises(ValueError, match=re.escape(f"{path}:3") + ": row has no 'answer' key"):
        load_jsonl(str(path))
    path.write_text(json.dumps({"question": "q", "answer": "no final line"}) + "\n")
    with pytest.raises(ValueError, match=re.escape(str(path)) + ": row 1: .*####"):
        load_gsm8k_file(str(path))


def test_write_jsonl_round_trips_through_the_gsm8k_loader(tmp_path):
    rows = synthetic_problems(20, seed=0)
    path = str(tmp_path / "held_out" / "test.jsonl")
    write_jsonl(rows, path)
    assert load_gsm8k(str(tmp_path / "held_out"), "test") == rows
    assert set(load_jsonl(path)[0]) == {"question", "answer"}  # GSM8K's on-disk keys


def test_download_verifies_sha256_and_writes_atomically(tmp_path):
    source = os.path.abspath(GSM8K)
    download_gsm8k(str(tmp_path / "good"), url_template="file://" + source + "/{split}.jsonl")
    for split in ("train", "test"):
        with open(tmp_path / "good" / f"{split}.jsonl", "rb") as got, open(os.path.join(source, f"{split}.jsonl"),
                                                                            "rb") as want:
            assert got.read() == want.read()
    tampered = tmp_path / "tampered"
    tampered.mkdir()
    for split in ("train", "test"):
        shutil.copy(os.path.join(source, f"{split}.jsonl"), tampered / f"{split}.jsonl")
    with open(tampered / "train.jsonl", "ab") as f:
        f.write(b"\n")
    with pytest.raises(ValueError, match="sha256"):
        download_gsm8k(str(tmp_path / "out"), url_template="file://" + str(tampered) + "/{split}.jsonl")
    assert os.listdir(tmp_path / "out") == []  # neither the file nor a temporary is left behind

# -----------------------------------------------------------------------------
# tokenizers


def test_char_tokenizer_round_trip_and_fixed_ids():
    tok = CharTokenizer()
    text = "".join(chr(c) for c in range(32, 127)) + "\nJanet's ducks lay 16 eggs.\n#### 18"
    assert tok.decode(tok.encode(text)) == text
    assert len(tok) == 2 + 1 + 95
    # checkpoints store only the name "char": these ids must never move
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 1)
    assert tok.encode("\n A~", add_special_tokens=True) == [2, 3, 36, 97]
    assert tok.decode([36, 1, 0, 36]) == "AA"
    assert tok.decode([36, 1], skip_special_tokens=False) == "A<|endoftext|>"
    assert tok.encode("<|endoftext|>") == [tok.get_vocab()[c] for c in "<|endoftext|>"]  # plain text, not eos


def test_char_tokenizer_errors():
    tok = CharTokenizer()
    with pytest.raises(ValueError, match="'é' at position 3"):
        tok.encode("caf\u00e9")
    with pytest.raises(ValueError, match="'\\\\t'"):
        tok.encode("a\tb")
    with pytest.raises(ValueError, match="token id 98 is outside"):
        tok.decode([5, 98])


def test_load_tokenizer_char_and_stop_ids():
    tok = load_tokenizer("char")
    assert isinstance(tok, CharTokenizer)
    assert stop_token_ids(tok) == [tok.eos_token_id]


def test_qwen_tokenizer_stop_ids(qwen_dir):
    tok = load_tokenizer(qwen_dir)
    assert stop_token_ids(tok) == [151643, 151645]  # <|endoftext|> and <|im_end|>
    assert tok.pad_token_id is not None
    assert tok.decode(tok.encode(format_prompt("2+2?", "r1_zero"), add_special_tokens=False)) == \
        format_prompt("2+2?", "r1_zero")


def test_char_stop_sequences_are_eos_and_the_nine_characters_of_answer_close():
    tok = CharTokenizer()
    assert stop_sequences(tok, "plain") == [[tok.eos_token_id], tok.encode("</answer>")]
    assert len(tok.encode("</answer>")) == 9


@pytest.mark.parametrize("template", ["r1_zero", "chat"])
def test_qwen_stop_sequences_end_completions_right_after_answer_close(qwen_dir, template):
    """Each completion, tokenized as the model would likely have written it, contains a stop sequence whose last
    token is the first one that completes "</answer>" (the splits differ: "</" or " </", ">" or ">\n" or ">\n\n")."""
    tok = load_tokenizer(qwen_dir)
    sequences = stop_sequences(tok, template)
    assert sequences[:2] == [[151643], [151645]]  # stop_token_ids, each alone
    for completion in (" 2+2=4</think> <answer>4</answer>", " so 4</think>\n<answer> 4 </answer>\nUser: next",
                       " 4</think> <answer>\n4\n</answer>\n\nUser:", " 4</think> <answer> 4 </answer>"):
        ids = tok.encode(completion)
        ends = [k for k in range(1, len(ids) + 1) if any(ids[:k][-len(s):] == s for s in sequences)]
        assert ends, f"no stop sequence in {tok.convert_ids_to_tokens(ids)}"
        assert "</answer>" in tok.decode(ids[:ends[0]]) and "</answer>" not in tok.decode(ids[:ends[0] - 1])


def test_hf_tokenizer_without_pad_pads_with_eos(qwen_dir, tmp_path):
    shutil.copytree(qwen_dir, tmp_path / "tok")
    config_path = tmp_path / "tok" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["pad_token"] = None
    config_path.write_text(json.dumps(config))
    tok = load_tokenizer(str(tmp_path / "tok"))
    assert tok.pad_token_id == tok.eos_token_id == 151645

# -----------------------------------------------------------------------------
# synthetic problems

LINE = re.compile(r"(\d+)([+-])(\d+)=(\d+)")


def test_synthetic_problems_are_deterministic():
    assert synthetic_problems(50, seed=3) == synthetic_problems(50, seed=3)
    assert synthetic_problems(50, seed=3) != synthetic_problems(50, seed=4)


@pytest.mark.parametrize("min_ops, max_ops, max_operand", [(1, 3, 20), (2, 2, 5), (3, 3, 99)])
def test_synthetic_arithmetic_is_right(min_ops, max_ops, max_operand):
    tok = CharTokenizer()
    rows = synthetic_problems(300, seed=7, min_ops=min_ops, max_ops=max_ops, max_operand=max_operand)
    for row in rows:
        *steps, final = row["solution"].split("\n")
        assert min_ops <= len(steps) <= max_ops
        total = int(re.search(r"has (\d+) ", row["question"]).group(1))  # the chain starts at the stated amount
        for step in steps:
            a, op, b, c = LINE.fullmatch(step).groups()
            assert int(a) == total and 1 <= int(b) <= max_operand
            total = int(a) + int(b) if op == "+" else int(a) - int(b)
            assert int(c) == total >= 0, step
        assert final == f"#### {total}" and row["gold"] == str(total)
        assert f" {b}" in row["question"]  # the last operand is stated in the question
        tok.encode(format_prompt(row["question"], "plain") + row["solution"])  # all printable ASCII
    assert len({row["question"] for row in rows}) > 250  # varied, not a handful of repeats


def test_synthetic_rejects_bad_knobs():
    with pytest.raises(ValueError, match="min_ops=3, max_ops=2"):
        synthetic_problems(1, seed=0, min_ops=3, max_ops=2)
    with pytest.raises(ValueError, match="max_operand=0"):
        synthetic_problems(1, seed=0, max_operand=0)


def test_shipped_gsm8k_files_are_the_pinned_originals():
    import hashlib
    from data import GSM8K_SHA256
    for split, expected in GSM8K_SHA256.items():
        with open(os.path.join(GSM8K, f"{split}.jsonl"), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == expected, split
