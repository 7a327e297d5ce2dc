import json

import pytest
import torch

import run as run_module
import train
from conftest import qwen_tokenizer_dir
from config import load_config
from eval import main as eval_main
from rewards import correctness_reward, extract_answer, format_reward, shows_work
from sft import sft_text
from template import (R1_ZERO, R1_ZERO_INSTRUCTION, TEMPLATES, CharTokenizer, encode_prompt, format_prompt,
                      load_tokenizer, stop_sequences, template_of)
from test_guards import tiny

# R1-Zero's prompt (DeepSeek-R1-Zero, table 1) as the repo wrote it before templates were objects: pinned, so the
# object that now builds it builds the same text
R1_ZERO_TEXT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The assistant "
    "first thinks about the reasoning process in the mind and then provides the user with the answer. The reasoning "
    "process and answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., "
    "<think> reasoning process here </think> <answer> answer here </answer>.")
REASONING = {"think": ("<reasoning>", "</reasoning>"), "answer": ("<final>", "</final>")}


@pytest.fixture(scope="module")
def qwen_dir():
    return qwen_tokenizer_dir()


def test_the_shipped_templates_write_the_prompts_they_always_wrote():
    question = "What is {x} + 1?"  # braces in a question are text, not template fields
    assert format_prompt(question, "r1_zero") == f"{R1_ZERO_TEXT} User: {question}\nAssistant: <think>"
    assert format_prompt(question, "plain") == f"Question: {question}\nAnswer: <think>"
    for name in TEMPLATES:
        assert TEMPLATES[name].prefix == "<think>" and TEMPLATES[name].name == name
    assert R1_ZERO.fill(R1_ZERO_INSTRUCTION) == R1_ZERO_TEXT
    with pytest.raises(ValueError, match=r"'chatml'.*'chat', 'plain', 'r1_zero'"):
        format_prompt(question, "chatml")
    with pytest.raises(ValueError, match="'chatml'"):
        stop_sequences(CharTokenizer(), "chatml")


def test_chat_template_puts_the_instruction_in_the_system_turn_and_opens_think(qwen_dir):
    tok = load_tokenizer(qwen_dir)
    question = "What is {x} + 1?"
    text = format_prompt(question, "chat", tok)
    assert text == (f"<|im_start|>system\n{R1_ZERO_TEXT}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
                    f"<|im_start|>assistant\n<think>")
    ids = encode_prompt(tok, question, "chat")
    assert tok.decode(ids) == text and ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3  # markers, not text


def test_encode_prompt_of_a_text_template_encodes_its_text(qwen_dir):
    for tok in (CharTokenizer(), load_tokenizer(qwen_dir)):
        for name in ("r1_zero", "plain"):
            assert encode_prompt(tok, "2+2?", name) == tok.encode(format_prompt("2+2?", name))


def test_chat_template_without_one_is_a_clear_error(qwen_dir):
    with pytest.raises(ValueError, match="'chat' applies the tokenizer's own chat template, and CharTokenizer has"):
        encode_prompt(CharTokenizer(), "q", "chat")
    with pytest.raises(ValueError, match="no tokenizer was given"):
        format_prompt("q", "chat")
    tok = load_tokenizer(qwen_dir)
    tok.chat_template = None
    with pytest.raises(ValueError, match=r"has none: use a text template, one of \['plain', 'r1_zero'\]"):
        encode_prompt(tok, "q", "chat")


def test_other_tags_flow_into_the_prompt_stop_warm_start_and_every_reward():
    template = template_of({"prompt": "Q: {question}\nA: ", **REASONING})
    template.check()
    assert format_prompt("2+2?", template) == "Q: 2+2?\nA: <reasoning>"
    r1_zero_with_tags = template_of({**REASONING})  # R1-Zero's instruction names the template's own tags
    assert "<reasoning> reasoning process here </reasoning> <final> answer here </final>" in \
        format_prompt("q", r1_zero_with_tags)
    row = {"question": "q", "solution": "2+2=4\n#### 4", "gold": "4"}
    target = sft_text(row, template)
    assert target == "2+2=4</reasoning> <final>4</final>"
    tok = CharTokenizer()
    assert stop_sequences(tok, template)[1] == tok.encode("</final>")
    completion = template.prefix + target
    assert format_reward(completion, "4", template=template) == 1.0
    assert correctness_reward(completion, "4", template=template) == 1.0
    assert correctness_reward(completion, "5", template=template) == 0.0
    assert extract_answer(completion, template=template) == "4" and shows_work(target, template)
    # R1-Zero's readers do not take the other tags' answer, nor the other way round: a template is one object
    assert format_reward(completion, "4") == 0.0
    assert format_reward("<think>2+2=4</think> <answer>4</answer>", "4", template=template) == 0.0
    assert extract_answer("<reasoning>x</reasoning> <final>7</final> <answer>8</answer>") == "8"
    assert extract_answer("<reasoning>x</reasoning> <final>7</final> <answer>8</answer>", template=template) == "7"


@pytest.mark.parametrize("spec, message", [
    ({"answer": ("<final>", "<final>")}, "repeated"),
    ({"answer": ("<answer>", "</answer>x"), "think": ("<think>", "</answer>")}, "inside"),
    ({"answer": ("", "</final>")}, "non-empty"),
    ({"answer": (" <final>", "</final>")}, "whitespace"),
    ({"answer": ("+", ";")}, "the rewards cannot read"),  # "3+4=7" in the reasoning holds a second "+"
    ({"prompt": "Question: {question} {question}"}, "exactly once"),
    ({"prompt": "Question: {query}"}, "unknown field"),
    ({"prompt": "Use {braces}: {question}"}, "unknown field"),
    ({"tags": ("<a>", "</a>")}, "unknown key"),
])
def test_templates_the_rewards_cannot_read_are_refused_at_config_load(spec, message):
    with pytest.raises(ValueError, match=message):
        tiny("unused", template=spec)


def test_a_run_with_reasoning_and_final_tags_trains_on_them_and_eval_reads_them_back(tmp_path, monkeypatch):
    """The modification a researcher makes: other tags, one config value. The warm start's targets hold them,
    config.json and the checkpoint record the whole template, and eval.py scores with the recorded one."""
    spec = {"prompt": "Q: {question}\nA: ", **REASONING}
    seen, real = {}, run_module.warm_start
    monkeypatch.setattr(run_module, "warm_start", lambda model, prompts, targets, *args, **kwargs: seen.update(
        prompts=prompts, targets=targets) or real(model, prompts, targets, *args, **kwargs))
    train.train(tiny(tmp_path / "run", template=spec, sft_steps=2, sft_batch_size=4, max_steps=1))
    tok = CharTokenizer()
    assert tok.decode(seen["prompts"][0]).startswith("Q: ") and tok.decode(seen["prompts"][0]).endswith("A: <reasoning>")
    assert all(tok.decode(t).endswith("</reasoning> <final>" + tok.decode(t).split("<final>")[1]) and
               "<answer>" not in tok.decode(t) for t in seen["targets"])
    recorded = json.load(open(tmp_path / "run" / "config.json"))["template"]
    assert recorded == {**json.loads(json.dumps(template_of(spec).__dict__))}
    summary = eval_main(["--model", str(tmp_path / "run" / "ckpt.pt"), "--data",
                         str(tmp_path / "run" / "heldout.jsonl"), "--limit", "2", "--out", str(tmp_path / "eval")])
    assert tuple(summary["template"]["answer"]) == ("<final>", "</final>")


def test_a_checkpoint_that_names_its_template_is_refused_on_resume(tmp_path):
    """A checkpoint written before templates were recorded whole holds the name ("plain"); no shim reads it as the
    whole template: --resume refuses it, naming the key, and leaves the run as it was."""
    train.train(tiny(tmp_path / "run", max_steps=1))
    path = tmp_path / "run" / "ckpt.pt"
    state = torch.load(path, weights_only=True)
    state["config"]["template"] = "plain"
    torch.save(state, path)
    with pytest.raises(ValueError, match="this command changes template='plain'"):
        train.train(tiny(tmp_path / "run", max_steps=2, resume=True))
    assert torch.load(path, weights_only=True)["step"] == 1


def test_config_files_name_templates_or_spell_them_out(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("template = {'think': ('<reasoning>', '</reasoning>'), 'answer': ('<final>', '</final>')}\n")
    assert template_of(load_config([str(path)]).template).answer == ("<final>", "</final>")
    assert load_config(["--template=plain"]).template["name"] == "plain"
