"""Issue 17: process supervision that runs. Arithmetic claims checked exactly, their ends located in tokens, per-token
advantages from them, the loss taking those, and the supervision switch of train.py."""
import json
import math
import os
import time

import pytest
import torch

import grpo
import update
import train
from answers import parse_number
from conftest import qwen_tokenizer_dir
from grpo import grpo_loss, process_advantages
from rewards import arithmetic_claims, claim_rewards, token_ends
from template import CharTokenizer, load_tokenizer
from test_guards import log_steps, tiny
from test_rewards import GSM8K_DIR


@pytest.mark.parametrize("text, claims", [
    ("3 * 4 = 12", [(10, True)]),
    ("12+7=19", [(7, True)]),
    ("12+7=20", [(7, False)]),
    ("Tom has 3+4=7 apples.", [(13, True)]),  # words around a claim do not count
    ("$1,000 + $2,500 = $3,500", [(24, True)]),  # thousands commas, dollar signs
    ("1,000 + 2,500 = 3,501", [(21, False)]),
    ("2.5 * 4 = 10.0", [(14, True)]),
    (".25 * 8 = 2", [(11, True)]),
    ("1/2 + 1/4 = 3/4", [(15, True)]),  # fractions, exactly: no float rounding
    ("1/3 + 1/3 = 0.6667", [(18, False)]),
    ("20 = 4 x 5", [(10, True)]),  # the operator may stand on the right
    ("3×4=12 and 6÷4=1.5 and 10 − 4 = 6", [(6, True), (18, True), (33, True)]),
    ("3 + 4 * 2 = 11", [(14, True)]),  # * before +
    ("3 + 4 * 2 = 14", [(14, False)]),
    ("(3 + 4) * 2 = 14", [(16, True)]),  # brackets
    ("3*-2=-6", [(7, True)]),
    ("3+4=7+1=8", [(7, False), (9, True)]),  # a chain: 3+4 = 7+1 is false, 7+1 = 8 is true
    ("12+7=19\n19-5=14</think> <answer>14</answer>", [(7, True), (15, True)]),
    ("The total (3+4 = 7) is small.", [(18, True)]),
    ("5/0 = 0", [(7, False)]),  # division by zero: wrong
    ("x = 5", []), ("7 = 7", []), ("2x + 3 = 7", []), ("a <= 5", []), ("a == b", []),  # not claims
    ("a*2 = 10", []), ("3+4 = 7 + apples", []),  # cut at an operator: the value is unknown
    ("12.", []), ("", []),
    ("word " * 100 + "3+4=7", [(505, True)]),  # a long line before the claim does not matter
    ("+".join(["1"] * 50) + "=50", [(102, True)]),  # 99 tokens: MAX_CLAIM_TOKENS
    ("+".join(["1"] * 51) + "=51", []),
])
def test_arithmetic_claims_by_hand(text, claims):
    assert arithmetic_claims(text) == claims


def test_claims_take_time_linear_in_the_text():
    """Each side is read up to the neighbouring "=" or newline: ten times the claims cost about ten times the time
    (reading each side from the text's start would make it a hundred times)."""
    def seconds(n):
        text = "=1+1" * n
        best = math.inf
        for _ in range(3):
            start = time.perf_counter()
            assert len(arithmetic_claims(text)) == n - 1
            best = min(best, time.perf_counter() - start)
        return best
    assert seconds(5_000) < 30 * seconds(500)


def test_every_gsm8k_calculator_annotation_holds_and_holds_no_more_when_its_result_changes():
    """GSM8K's solutions carry their arithmetic as calculator annotations <<48/2=24>>: every one that computes
    something is a claim that holds, and the same claim with its result plus one does not."""
    annotations = []
    for split in ("train", "test"):
        with open(os.path.join(GSM8K_DIR, f"{split}.jsonl")) as f:
            annotations += [part.partition(">>")[0] for line in f for part in json.loads(line)["answer"].split("<<")[1:]]
    assert len(annotations) == 27998
    skipped = []
    for annotation in annotations:
        claims = arithmetic_claims(annotation)
        if not claims:
            skipped.append(annotation)
            continue
        assert claims == [(len(annotation), True)], annotation
        expression, _, result = annotation.rpartition("=")
        wrong = f"{expression}={parse_number(result) + 1}"
        assert arithmetic_claims(wrong) == [(len(wrong), False)], wrong
    # the only ones left out compute nothing ("<<12=12>>", "<<+10=10>>") or use Python's floor division "//"
    assert len(skipped) == 435
    assert all(parse_number(a.partition("=")[0]) is not None or "//" in a for a in skipped)


def char_ends_to_tokens_by_hand(tokenizer, ids, char_ends):
    """The slow, obvious definition: the first token after which the decoded text reaches each end."""
    return [next(i for i in range(len(ids)) if len(tokenizer.decode(ids[:i + 1])) >= end) for end in char_ends]


TEXT = "Le café coûte 3×4=12 €, puis 12 + 7 = 19.\n19-5=14 donc « 14 ». 1/2 + 1/4 = 3/4</think> <answer>14</answer>"


def test_claim_ends_in_tokens_are_exact_for_the_qwen_tokenizer():
    tokenizer = load_tokenizer(qwen_tokenizer_dir())
    ids = tokenizer.encode(TEXT)
    assert tokenizer.decode(ids) == TEXT and len(ids) < len(TEXT)  # tokens of several characters
    char_ends = [end for end, _ in arithmetic_claims(TEXT)]
    assert len(char_ends) == 4
    ends = token_ends(ids, tokenizer.decode, char_ends)
    assert ends == char_ends_to_tokens_by_hand(tokenizer, ids, char_ends)
    for end, token in zip(char_ends, ends):  # the token writes the claim's last character
        assert len(tokenizer.decode(ids[:token])) < end <= len(tokenizer.decode(ids[:token + 1]))
        assert tokenizer.decode(ids[:token + 1])[:end] == TEXT[:end]
    # a sampled sequence need not be the canonical encoding: one token per byte of "é" (0xC3 0xA9), then one per
    # character; the first prefix decodes to one replacement character, so lengths still grow with the prefix
    text = "é 3+4=7 and 2*3=6"
    ids = tokenizer.convert_tokens_to_ids(["Ã", "©"]) + [tokenizer.encode(char)[0] for char in text[1:]]
    assert tokenizer.decode(ids) == text and tokenizer.decode(ids[:1]) == "\ufffd"
    assert token_ends(ids, tokenizer.decode, [end for end, _ in arithmetic_claims(text)]) == [7, 17]


def test_claim_ends_in_tokens_are_exact_for_the_char_tokenizer():
    tokenizer = CharTokenizer()
    text = TEXT.replace("é", "e").replace("û", "u").replace("×", "*").replace("€", "E").replace("«", "").replace("»", "")
    char_ends = [end for end, _ in arithmetic_claims(text)]
    assert token_ends(tokenizer.encode(text), tokenizer.decode, char_ends) == [end - 1 for end in char_ends]


def test_claim_rewards_one_per_claim_and_a_zero_claim_at_the_end_without_claims():
    tokenizer = CharTokenizer()
    stop = [tokenizer.eos_token_id]
    text = "12+7=19\n19-5=15\n15+2=17</think> <answer>17</answer>"
    assert claim_rewards(text, tokenizer.encode(text) + stop, tokenizer.decode) == [(6, 1.0), (14, 0.0), (22, 1.0)]
    for no_work in ("I think it is 17</think> <answer>17</answer>", "x = 5"):
        ids = tokenizer.encode(no_work) + stop
        assert claim_rewards(no_work, ids, tokenizer.decode) == [(len(ids) - 1, 0.0)]
    cut = tokenizer.encode("12+7=19\n19-5=14\n14+")  # truncated: never finished, earns nothing
    assert claim_rewards("12+7=19\n19-5=14\n14+", cut, tokenizer.decode, truncated=True) == [(len(cut) - 1, 0.0)]


def test_a_wrong_middle_step_lowers_the_advantages_of_the_tokens_up_to_it_and_the_loss_takes_them():
    tokenizer = CharTokenizer()
    texts = ["12+7=19\n19-5=15\n15+2=17</think> <answer>17</answer>",  # the middle step is wrong
             "12+7=19\n19-5=14\n14+2=16</think> <answer>16</answer>"]
    completions = [tokenizer.encode(t) + [tokenizer.eos_token_id] for t in texts]
    steps = [claim_rewards(t, c, tokenizer.decode) for t, c in zip(texts, completions)]
    (first, _), (middle, wrong), (last, _) = steps[0]
    assert wrong == 0.0 and [r for _, r in steps[1]] == [1.0, 1.0, 1.0]
    rewards, ends, mask = grpo.claim_tensors(steps)
    T = max(map(len, completions))
    advantages = process_advantages(rewards, ends, 2, T, mask)
    row = advantages[0]
    assert row[first + 1:middle + 1].max() < row[middle + 1:last + 1].min()  # tokens up to the wrong step: lower
    assert row[:middle + 1].max() < 0 < row[middle + 1:last + 1].min()
    assert torch.all(row[last + 1:] == 0)  # after the last step, nothing to credit
    assert torch.all(advantages[1, :last + 1] > 0)
    # the loss takes them token by token: with ratio 1 and no KL, d loss / d logp = -A / |o| / B (seq_mean)
    logp = torch.zeros(2, T, requires_grad=True)
    lengths = torch.tensor([len(c) for c in completions])
    token_mask = torch.arange(T)[None] < lengths[:, None]
    loss, _ = grpo_loss(logp, None, None, advantages, token_mask, beta=0.0)
    loss.backward()
    assert torch.allclose(logp.grad, -advantages * token_mask / lengths[:, None] / 2)


class Spy:
    """Wraps a function of grpo.py (the objective, and where update.py calls it) and keeps what it was called with
    and returned."""

    def __init__(self, monkeypatch, name, replace=None):
        self.calls, self.function = [], replace or getattr(grpo, name)
        for module in (grpo, update):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, self)

    def __call__(self, *args, **kwargs):
        result = self.function(*args, **kwargs)
        self.calls.append((args, kwargs, result))
        return result


def test_a_process_supervised_run_takes_two_steps_with_per_token_advantages_in_the_loss(tmp_path, monkeypatch):
    cfg = tiny(tmp_path, supervision="process", micro_batch_size=1, max_new_tokens=12)
    terms = Spy(monkeypatch, "terms_of")  # what the loss reads, per micro-batch
    train.train(cfg)
    assert log_steps(tmp_path) == [1, 2]
    with open(tmp_path / "log.jsonl") as f:
        assert all(0 <= json.loads(line)["process_reward"] <= 1 for line in f)
    assert len(terms.calls) == 2 * 4  # two steps of four one-row micro-batches
    for _, _, x in terms.calls:
        assert x.advantages.shape == x.logp.shape == x.mask.shape  # [1, N]: this micro-batch's columns


def test_both_adds_the_outcome_advantage_to_process_weight_times_the_process_one(tmp_path, monkeypatch):
    """A stand-in process_advantages returns fixed random per-token values (a random tiny model writes no claims,
    so the real ones would all be 0); the loss must see outcome + 0.5 * process, row by row, cut to each
    micro-batch's columns."""
    cfg = tiny(tmp_path, supervision="both", process_weight=0.5, micro_batch_size=3, max_steps=1, max_new_tokens=12)
    torch.manual_seed(0)
    process = Spy(monkeypatch, "process_advantages", replace=lambda rewards, ends, G, T, mask: torch.randn(len(rewards), T))
    outcome, terms = Spy(monkeypatch, "group_advantages"), Spy(monkeypatch, "terms_of")
    train.train(cfg)
    expected = outcome.calls[-1][2][:, None] + 0.5 * process.calls[-1][2]
    assert all(x.advantages.shape == x.logp.shape for _, _, x in terms.calls)
    rows = [row for _, _, x in terms.calls for row in x.advantages]
    assert len(rows) == 4 and all(any(torch.allclose(row, full[:len(row)]) for full in expected) for row in rows)


def test_outcome_supervision_keeps_one_advantage_per_completion(tmp_path, monkeypatch):
    cfg = tiny(tmp_path, max_steps=1)
    terms = Spy(monkeypatch, "terms_of")
    train.train(cfg)
    assert terms.calls and all(args[0].advantages.dim() == 1 for args, _, _ in terms.calls)
    with open(tmp_path / "log.jsonl") as f:
        assert "process_reward" not in json.loads(f.readline())


@pytest.mark.parametrize("setting, message", [
    (dict(supervision="processes"), r"supervision must be one of \('outcome', 'process', 'both'\)"),
    (dict(process_weight=-1.0), "process_weight must be a finite number >= 0"),
    (dict(process_weight=float("nan")), "process_weight must be a finite number >= 0"),
])
def test_supervision_settings_are_checked(tmp_path, setting, message):
    with pytest.raises(ValueError, match=message):
        tiny(tmp_path, **setting)
