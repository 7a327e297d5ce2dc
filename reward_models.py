"""
Rewards a config names beyond rewards.py's rules, loaded once per run by load_rewards(). A
reward_weights key is

    "correctness", "format"            rewards.REWARD_FUNCTIONS, the rule-based rewards
    "path/to/file.py:function"         your function: function(completion, gold) -> float; or,
                                       marked by an attribute function.batched = True,
                                       function(completions, golds, questions) -> N floats
    "model:NAME" or "model:NAME:LABEL" a learned reward model: a Hugging Face
                                       sequence-classification checkpoint (a local dir or hub name)
                                       scoring question + completion on the training device
    "judge:NAME"                       an LLM judge: a causal LM (model.py) that grades the
                                       completion 0-10 under JUDGE_RUBRIC; its greedy verdict, read
                                       by parse_verdict, scaled to [0, 1]

A function may also read, by naming them as parameters (or all of them, with **kwargs),
rewards.REWARD_INFO: question, truncated (cut at max_new_tokens), length (tokens, stop token
included), max_new_tokens, template and answer_checker (None is "gsm8k"; a **kwargs function gets
it only when it is given); a batched one rewards.BATCHED_REWARD_INFO, as lists. E.g.
`def short(completion, gold, length, max_new_tokens): return 1 - length / max_new_tokens`.
The two models are batched rewards (rewards.score_completions calls them and checks every value).
Each component is logged on its own as reward_<rewards.reward_log_name(key)>;
rewards.check_reward_names checks the keys when the config loads.
"""
import importlib.util
import os

import torch

from answers import extract_answer, parse_number
from model import Transformer
from rewards import parse_reward_name
from sample import generate
from template import load_tokenizer, stop_token_ids

JUDGE_RUBRIC = ("You are grading a student's solution to a math word problem. Check the reasoning "
                "and the final answer, then rate the solution from 0 (wrong or no answer) to 10 "
                "(correct, with sound reasoning). Reply with the score only, a whole number from "
                "0 to 10.\n\nProblem: {question}\n\nSolution: {completion}\n\nScore:")
JUDGE_MAX_NEW_TOKENS = 8  # room for "Score: 10": the verdict is a number, not an essay


def load_rewards(names, device, dtype, batch_size: int) -> dict:
    """{key: reward function} for the keys that are not rule-based, each loaded once: a file's
    function, a RewardModel or a Judge on device in dtype, scoring batch_size completions per
    forward."""
    loaded = {}
    for name in names:
        kind, target, detail = parse_reward_name(name)
        if kind == "file":
            spec = importlib.util.spec_from_file_location(
                os.path.splitext(os.path.basename(target))[0], target)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            if not callable(getattr(module, detail, None)):
                raise ValueError(f"reward {name!r}: {target} defines no function {detail!r}")
            loaded[name] = getattr(module, detail)
        elif kind == "model":
            loaded[name] = RewardModel(target, detail or None, device, dtype, batch_size)
        elif kind == "judge":
            loaded[name] = Judge(target, device, dtype, batch_size)
    return loaded


class RewardModel:
    """A learned reward model: a transformers AutoModelForSequenceClassification checkpoint scoring
    the question and the completion (through the tokenizer's chat template as a user turn and an
    assistant turn when it has one, else as a text pair) under no_grad, batch_size at a time,
    right-padded. The score is the raw logit of the head's single output, or with label of the
    output config.id2label names so; unbounded, so choose its weight with its scale in mind."""
    batched = True

    def __init__(self, name: str, label: str | None, device, dtype, batch_size: int):
        # only reward-model runs need them
        from transformers import AutoConfig, AutoModelForSequenceClassification
        id2label = AutoConfig.from_pretrained(name).id2label
        labels = {label_name: index for index, label_name in id2label.items()}
        if label is None and len(labels) != 1:
            raise ValueError(f"reward model {name} has {len(labels)} outputs {sorted(labels)}: "
                             f"name the one to use as 'model:{name}:LABEL'")
        if label is not None and label not in labels:
            raise ValueError(f"reward model {name} has no output labelled {label!r}; its labels "
                             f"are {sorted(labels)}")
        # guarantees a pad token (eos when the tokenizer has none)
        self.tokenizer = load_tokenizer(name)
        self.tokenizer.padding_side = "right"
        self.model = (AutoModelForSequenceClassification.from_pretrained(name, dtype=dtype)
                      .to(device).eval())
        # the head reads the last non-pad token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.column = labels[label] if label else 0
        self.device = device
        self.batch_size = batch_size

    def _encode(self, questions, completions):
        if self.tokenizer.chat_template:
            texts = [self.tokenizer.apply_chat_template([{"role": "user", "content": q},
                                                         {"role": "assistant", "content": c}],
                                                        tokenize=False)
                     for q, c in zip(questions, completions)]
            return self.tokenizer(texts, add_special_tokens=False, padding=True,
                                  return_tensors="pt")
        return self.tokenizer(list(questions), list(completions), padding=True, return_tensors="pt")

    @torch.no_grad()
    def __call__(self, completions: list[str], golds: list[str],
                 questions: list[str]) -> list[float]:
        scores = []
        for start in range(0, len(completions), self.batch_size):
            batch = self._encode(questions[start:start + self.batch_size],
                                 completions[start:start + self.batch_size])
            scores += self.model(**batch.to(self.device)).logits[:, self.column].float().tolist()
        return scores


def parse_verdict(verdict: str) -> float:
    """A judge's verdict as a reward in [0, 1]: the answer on its first non-empty line, read by
    answers.extract_answer and parse_number ("7", "Score: 7", "**7**", "\\boxed{7}", "7/10"), must
    be a whole number from 0 to 10, and is divided by 10; anything else ("seven", "7.5", "7 or 8",
    "11", no verdict) is 0.0: when in doubt, lean to 0."""
    answer = extract_answer(verdict.strip().partition("\n")[0])
    score = parse_number(answer.removesuffix("/10")) if answer is not None else None
    return (float(score) / 10 if score is not None and score.denominator == 1 and 0 <= score <= 10
            else 0.0)


class Judge:
    """An LLM judge: a causal LM loaded by model.Transformer.from_pretrained with its own tokenizer,
    prompted with rubric (its {question} and {completion} filled in; wrapped as a user turn by the
    chat template when the tokenizer has one), decoding greedily up to max_new_tokens, batch_size
    prompts at a time; the verdict is parse_verdict's."""
    batched = True

    def __init__(self, name: str, device, dtype, batch_size: int, rubric: str = JUDGE_RUBRIC,
                 max_new_tokens: int = JUDGE_MAX_NEW_TOKENS):
        self.model = Transformer.from_pretrained(name, dtype=dtype, device=device).eval()
        self.tokenizer = load_tokenizer(name)
        self.rubric = rubric
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size

    def prompt(self, question: str, completion: str) -> list[int]:
        text = self.rubric.format(question=question, completion=completion)
        chat = self.tokenizer.chat_template
        if chat:
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                      tokenize=False, add_generation_prompt=True)
        # a chat text holds its own special tokens
        return self.tokenizer.encode(text, add_special_tokens=not chat)

    def verdicts(self, completions: list[str], questions: list[str]) -> list[str]:
        """The judge's greedy replies, without their stop token."""
        replies = []
        for start in range(0, len(completions), self.batch_size):
            prompts = [self.prompt(q, c)
                       for q, c in zip(questions[start:start + self.batch_size],
                                       completions[start:start + self.batch_size])]
            rollout = generate(self.model, prompts, self.max_new_tokens, temperature=0.0,
                               stop_ids=stop_token_ids(self.tokenizer),
                               pad_id=self.tokenizer.pad_token_id)
            replies += [self.tokenizer.decode(row[:length - stopped]) for row, length, stopped in
                        zip(rollout.tokens.tolist(), rollout.lengths.tolist(),
                            rollout.stopped.tolist())]
        return replies

    def __call__(self, completions: list[str], golds: list[str],
                 questions: list[str]) -> list[float]:
        return [parse_verdict(verdict) for verdict in self.verdicts(completions, questions)]
