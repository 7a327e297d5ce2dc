"""Issue 17: rewards a config names (a user's function, a learned reward model, an LLM judge), their weights, their
log keys, and the errors that stop a run when one misbehaves."""
import json
import math
import os
import shutil

import pytest
import torch

import train
from reward_models import Judge, RewardModel, load_rewards, parse_verdict
from rewards import SHOWN_CHARS, check_reward_names, correctness_reward, reward_log_name, score_completions
from test_guards import log_steps, saved_step, tiny
from conftest import qwen_tokenizer_dir

COMPLETIONS = ["<think>12+7=19</think> <answer>19</answer>", "<think>no idea</think> <answer>7</answer>",
               "19", "<think>" + "12+7=19\n" * 30 + "</think> <answer>19</answer>", "x"]
GOLDS = ["19", "19", "19", "19", "3"]
QUESTIONS = ["Tom has 12 apples. He buys 7 more. How many apples does Tom have?"] * 4 + ["What is 1+2?"]
USER_REWARDS = '''
import math


def length_bonus(completion, gold):
    return len(completion) / 100


def batched_length_bonus(completions, golds, questions):
    return [len(c) / 100 + len(q) / 1000 for c, q in zip(completions, questions)]
batched_length_bonus.batched = True


def asks_how_many(completions, golds, questions):
    return [1.0 if "How many" in q else 0.0 for q in questions]
asks_how_many.batched = True


def raises(completion, gold):
    if "bad" in completion:
        raise KeyError("no such key")
    return 1.0


def raises_batched(completions, golds, questions):
    return [1 / 0 if "bad" in c else 1.0 for c in completions]
raises_batched.batched = True


def nan_reward(completion, gold):
    return math.nan if "bad" in completion else 0.5


def inf_reward(completion, gold):
    return math.inf if "bad" in completion else 0.5


def none_reward(completion, gold):
    return None


def one_too_few(completions, golds, questions):
    return [0.0] * (len(completions) - 1)
one_too_few.batched = True


def always_nan(completion, gold):
    return math.nan
'''


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_REWARDS)
    return str(path)


def test_a_batched_user_function_scores_a_batch_as_it_scores_each_completion_alone(user_file):
    name = f"{user_file}:batched_length_bonus"
    functions = load_rewards([name, f"{user_file}:length_bonus"], "cpu", torch.float32, batch_size=2)
    _, batch = score_completions(COMPLETIONS, GOLDS, [False] * 5, {name: 1.0}, QUESTIONS, functions)
    alone = [score_completions([c], [g], [False], {name: 1.0}, [q], functions)[1][name][0]
             for c, g, q in zip(COMPLETIONS, GOLDS, QUESTIONS)]
    assert batch[name] == alone == [len(c) / 100 + len(q) / 1000 for c, q in zip(COMPLETIONS, QUESTIONS)]
    with pytest.raises(ValueError, match="reads the questions: pass questions="):
        score_completions(COMPLETIONS, GOLDS, [False] * 5, {name: 1.0}, functions=functions)


def test_weights_combine_as_a_weighted_sum_with_each_component_unweighted(user_file):
    name = f"{user_file}:length_bonus"
    weights = {"correctness": 2.0, "format": 0.1, name: -0.5}
    totals, components = score_completions(COMPLETIONS, GOLDS, [False] * 5, weights, QUESTIONS,
                                           load_rewards(weights, "cpu", torch.float32, batch_size=2))
    assert components[name] == [len(c) / 100 for c in COMPLETIONS]
    assert components["correctness"] == [correctness_reward(c, g) for c, g in zip(COMPLETIONS, GOLDS)]
    assert totals == pytest.approx([2.0 * c + 0.1 * f - 0.5 * n for c, f, n in
                                    zip(components["correctness"], components["format"], components[name])])
    assert components["correctness"][:3] == [1.0, 0.0, 1.0]


@pytest.mark.parametrize("function, message", [
    ("raises", r"reward '.*:raises' raised KeyError: 'no such key' on completion 'bad"),
    ("raises_batched", r"reward '.*:raises_batched' raised ZeroDivisionError: .* on completion 'bad"),
    ("nan_reward", r"reward '.*:nan_reward' returned nan for completion 'bad.*must be a finite number"),
    ("inf_reward", r"reward '.*:inf_reward' returned inf for completion 'bad"),
    ("none_reward", r"reward '.*:none_reward' returned None for completion 'fine"),
    ("one_too_few", r"reward '.*:one_too_few' returned \[0.0, 0.0\] for 3 completions \(the first: 'fine"),
])
def test_a_misbehaving_reward_stops_with_its_name_and_the_completion(user_file, function, message):
    name = f"{user_file}:{function}"
    completions = ["fine", "bad " + "y" * 500, "also fine"]
    with pytest.raises(RuntimeError, match=message) as error:
        score_completions(completions, ["1"] * 3, [False] * 3, {name: 1.0}, ["q"] * 3,
                          load_rewards([name], "cpu", torch.float32, batch_size=2))
    assert "y" * (SHOWN_CHARS + 1) not in str(error.value)  # the completion is shown cut to SHOWN_CHARS


def test_a_run_whose_reward_returns_nan_stops_before_any_update(user_file, tmp_path):
    cfg = tiny(tmp_path / "run", reward_weights={"correctness": 1.0, f"{user_file}:always_nan": 1.0},
               max_new_tokens=4)
    with pytest.raises(RuntimeError, match=r"reward '.*my_rewards.py:always_nan' returned nan for completion '"):
        train.train(cfg)
    assert saved_step(tmp_path / "run") == 0 and not os.path.exists(tmp_path / "run" / "log.jsonl")


def test_every_component_is_logged_under_its_short_name_and_rewards_read_the_questions(user_file, tmp_path):
    weights = {"correctness": 1.0, f"{user_file}:asks_how_many": 0.5, f"{user_file}:length_bonus": 0.0}
    train.train(tiny(tmp_path, reward_weights=weights, max_new_tokens=4))
    with open(tmp_path / "log.jsonl") as f:
        records = [json.loads(line) for line in f]
    assert log_steps(tmp_path) == [1, 2]
    for record in records:  # every synthetic question asks "How many ...?"
        assert record["reward_asks_how_many"] == 1.0 and record["reward_length_bonus"] > 0
        assert record["reward"] == pytest.approx(record["reward_correctness"] + 0.5)


@pytest.mark.parametrize("name, log_name", [
    ("format", "format"), ("rewards/mine.py:length_bonus", "length_bonus"),
    ("model:Skywork/Skywork-Reward-V2-Qwen3-0.6B", "model_Skywork_Reward_V2_Qwen3_0_6B"),
    ("model:/tmp/rm/:good", "model_rm_good"), ("judge:Qwen/Qwen2.5-7B-Instruct", "judge_Qwen2_5_7B_Instruct"),
])
def test_reward_log_names_are_short_and_safe(name, log_name):
    assert reward_log_name(name) == log_name


@pytest.mark.parametrize("weights, message", [
    ({"lenght": 1.0}, r"reward_weights must name rewards from \['correctness', 'format'\], 'FILE.py:FUNCTION'"),
    ({"model:": 1.0}, "got 'model:'"),
    ({"judge:": 1.0}, "got 'judge:'"),
    ({"my_rewards.py:not-a-name": 1.0}, "got 'my_rewards.py:not-a-name'"),
    ({"missing.py:f": 1.0}, r"reward 'missing.py:f': missing.py not found"),
    ({}, "reward_weights must name rewards from"),
])
def test_bad_reward_names_stop_the_config(tmp_path, weights, message):
    with pytest.raises(ValueError, match=message):
        tiny(tmp_path, reward_weights=weights)


def test_two_rewards_with_one_log_name_and_a_missing_function_are_refused(user_file, tmp_path):
    other = tmp_path / "other.py"
    shutil.copy(user_file, other)
    with pytest.raises(ValueError, match=r"would share the log name\(s\) \['length_bonus'\]"):
        check_reward_names([f"{user_file}:length_bonus", f"{other}:length_bonus"])
    with pytest.raises(ValueError, match="defines no function 'lenght_bonus'"):
        load_rewards([f"{user_file}:lenght_bonus"], "cpu", torch.float32, batch_size=2)

# -----------------------------------------------------------------------------
# a learned reward model and an LLM judge: tiny random Qwen2 models with the real Qwen2.5 tokenizer


def save_with_qwen_tokenizer(model, path) -> str:
    model.save_pretrained(path)
    for name in os.listdir(qwen_tokenizer_dir()):
        shutil.copy(os.path.join(qwen_tokenizer_dir(), name), path)
    return str(path)


def tiny_qwen_config(**extra):
    from transformers import Qwen2Config
    return Qwen2Config(vocab_size=151936, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024, **extra)


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    from transformers import Qwen2ForSequenceClassification
    torch.manual_seed(0)
    config = tiny_qwen_config(num_labels=2, id2label={0: "bad", 1: "good"}, pad_token_id=151643)
    return save_with_qwen_tokenizer(Qwen2ForSequenceClassification(config), tmp_path_factory.mktemp("rm"))


def test_reward_model_scores_a_batch_as_each_completion_alone_and_as_transformers_does(reward_model_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    rm = RewardModel(reward_model_dir, "good", "cpu", torch.float32, batch_size=3)
    batched = rm(COMPLETIONS, GOLDS, QUESTIONS)  # five completions of different lengths: padding in each batch
    alone = [rm([c], [g], [q])[0] for c, g, q in zip(COMPLETIONS, GOLDS, QUESTIONS)]
    assert batched == pytest.approx(alone, abs=1e-5) and rm(COMPLETIONS, GOLDS, QUESTIONS) == batched
    hf = AutoModelForSequenceClassification.from_pretrained(reward_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(reward_model_dir)
    for completion, question, score in zip(COMPLETIONS, QUESTIONS, batched):
        text = tokenizer.apply_chat_template([{"role": "user", "content": question},
                                              {"role": "assistant", "content": completion}], tokenize=False)
        assert question in text and completion.rpartition("</think>")[2].strip() in text  # the template may reformat
        # the reasoning between <think> tags (Qwen's moves it onto lines of its own)
        with torch.no_grad():
            logits = hf(torch.tensor([tokenizer.encode(text)])).logits[0]
        assert score == pytest.approx(logits[1].item(), abs=1e-5)  # the "good" column
    assert len(set(batched)) == len(batched)  # the score depends on the text


def test_reward_model_needs_a_label_when_it_has_several_outputs(reward_model_dir):
    with pytest.raises(ValueError, match=r"has 2 outputs \['bad', 'good'\]: name the one to use as 'model:.*:LABEL'"):
        RewardModel(reward_model_dir, None, "cpu", torch.float32, batch_size=2)
    with pytest.raises(ValueError, match=r"no output labelled 'great'; its labels are \['bad', 'good'\]"):
        RewardModel(reward_model_dir, "great", "cpu", torch.float32, batch_size=2)
    functions = load_rewards([f"model:{reward_model_dir}:bad"], "cpu", torch.float32, batch_size=2)
    assert functions[f"model:{reward_model_dir}:bad"].column == 0


@pytest.mark.parametrize("verdict, score", [
    ("7", 0.7), (" 10\n", 1.0), ("0", 0.0), ("Score: 7", 0.7), ("**8**", 0.8), ("\\boxed{3}", 0.3), ("7/10", 0.7),
    ("10/10", 1.0), ("I would give it a 6.", 0.6), ("6\nbecause 2+2=4", 0.6),
    ("7.5", 0.0), ("11", 0.0), ("-1", 0.0), ("7 or 8", 0.0), ("seven", 0.0), ("", 0.0), ("about 7", 0.0),
    ("Score:", 0.0), ("!!!!", 0.0),
])
def test_judge_verdict_parsing(verdict, score):
    assert parse_verdict(verdict) == score


@pytest.fixture(scope="module")
def random_judge_dir(tmp_path_factory):
    from transformers import Qwen2ForCausalLM
    torch.manual_seed(0)
    return save_with_qwen_tokenizer(Qwen2ForCausalLM(tiny_qwen_config(tie_word_embeddings=True)),
                                    tmp_path_factory.mktemp("judge"))


def test_random_judge_gives_a_well_defined_score_batched_as_alone(random_judge_dir):
    judge = load_rewards([f"judge:{random_judge_dir}"], "cpu", torch.float32, batch_size=2)[f"judge:{random_judge_dir}"]
    prompt = judge.tokenizer.decode(judge.prompt(QUESTIONS[0], COMPLETIONS[0]))
    assert QUESTIONS[0] in prompt and COMPLETIONS[0] in prompt and "from 0 to 10" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")  # the chat template's turn for the judge's reply
    verdicts = judge.verdicts(COMPLETIONS, QUESTIONS)
    scores = judge(COMPLETIONS, GOLDS, QUESTIONS)
    assert scores == [parse_verdict(v) for v in verdicts] and all(s in [k / 10 for k in range(11)] for s in scores)
    assert scores == [judge([c], [g], [q])[0] for c, g, q in zip(COMPLETIONS, GOLDS, QUESTIONS)]
    assert judge.verdicts(COMPLETIONS, QUESTIONS) == verdicts  # greedy: deterministic
    assert all(len(judge.tokenizer.encode(v)) <= judge.max_new_tokens for v in verdicts)


def test_judge_that_always_says_7_gives_0_7_to_every_completion(tmp_path):
    """A rigged judge: every token embeds to one vector v and the blocks add nothing, so every position's hidden
    state is the same and the untied head, zero but for the row of "7", makes "7" the greedy reply."""
    from transformers import AutoTokenizer, Qwen2ForCausalLM
    seven = AutoTokenizer.from_pretrained(qwen_tokenizer_dir()).convert_tokens_to_ids("7")
    model = Qwen2ForCausalLM(tiny_qwen_config(tie_word_embeddings=False))
    with torch.no_grad():
        v = torch.linspace(-1, 1, 16)
        model.model.embed_tokens.weight[:] = v
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.zero_()
        model.lm_head.weight[seven] = v
    judge = Judge(save_with_qwen_tokenizer(model, tmp_path), "cpu", torch.float32, batch_size=2, max_new_tokens=1)
    assert judge.verdicts(COMPLETIONS, QUESTIONS) == ["7"] * 5
    assert judge(COMPLETIONS, GOLDS, QUESTIONS) == [0.7] * 5
    assert math.isclose(score_completions(COMPLETIONS, GOLDS, [False] * 5, {"judge:x": 2.0}, QUESTIONS,
                                          {"judge:x": judge})[0][0], 1.4)
