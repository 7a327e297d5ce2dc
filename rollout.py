"""
The rollout: prompts -> sampled, decoded and scored completions. One path from tokens to rewards, for training
(sample_groups: G completions of each of a step's questions) and for evaluation (eval.score_questions).

    samples = sample_and_score(model, tokenizer, prompts, golds, template, max_new_tokens, temperature, seed, weights)
    samples.completions[i], samples.texts[i], samples.rewards[i]      # row i answers prompts[i]
"""
import statistics
import time
from dataclasses import dataclass

import torch

from data import response_prefix, stop_sequences, stop_token_ids
from distributed import rank, world_size
from reward_models import reward_log_name
from rewards import claim_rewards, score_completions, shows_work
from sample import generate


def rollout_seed(seed: int, index: int) -> int:
    """The sampler's seed for rollout number `index` of a run seeded `seed` (a training step's rows on one rank, or
    one evaluation sample): distinct per (seed, index), so a resumed run draws the same samples."""
    return (seed * 1_000_003 + index) % 2 ** 31


@dataclass
class Samples:
    """Completions of a batch of prompts, decoded and scored; row i answers prompts[i]."""
    completions: list[list[int]]  # generated token ids, stop token included
    texts: list[str]  # decoded completions, without a final end-of-text token (a final "</answer>" is kept)
    stopped: list[bool]  # False: cut at max_new_tokens
    logprobs: list[list[float]]  # the sampler's log-prob of each completion token (at the sampling temperature)
    rewards: list[float]  # weighted sum of the reward components
    components: dict[str, list[float]]  # each reward, unweighted; "correctness" and "format" always present
    seconds_sampling: float  # generate, to the tokens on the host
    seconds_scoring: float  # decoding and rewards
    claims: list[list[tuple[int, float]]] | None = None  # process=True: (token index of a claim's end, reward) each


def sample_and_score(model, tokenizer, prompts: list[list[int]], golds: list[str], template: str,
                     max_new_tokens: int, temperature: float, seed: int | list[int], weights: dict[str, float],
                     top_p: float = 1.0, top_k: int = 0, questions: list[str] | None = None, functions=None,
                     process: bool = False, cuda_graphs: bool = True) -> Samples:
    """Sample one completion per prompt, ending at an end-of-text token or "</answer>", decode it and score it against
    its gold answer: weights names the rewards, functions holds the loaded ones (reward_models.load_rewards),
    questions the problems' text they may read. process: also the claims' rewards of process supervision.
    cuda_graphs=False: the sampler's plain eager decode loop on CUDA (the first thing to try if a GPU run misbehaves)."""
    end_of_text, start = set(stop_token_ids(tokenizer)), time.perf_counter()
    rollout = generate(model, prompts, max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                       stop_sequences=stop_sequences(tokenizer, template), seed=seed, pad_id=tokenizer.pad_token_id,
                       cuda_graphs=cuda_graphs)
    tokens, lengths, stopped = rollout.tokens.tolist(), rollout.lengths.tolist(), rollout.stopped.tolist()
    logprobs = [row[:n] for row, n in zip(rollout.logprobs.tolist(), lengths)]
    completions, sampled = [row[:n] for row, n in zip(tokens, lengths)], time.perf_counter()
    texts = [tokenizer.decode(c[:-1] if c[-1] in end_of_text else c) for c in completions]  # "</answer>" is kept
    prefix = response_prefix(template)  # the prompt ends in "<think>": the format reward judges the whole response
    # accuracy and format are measured whatever the weights; a 0 weight keeps them out of the reward
    rewards, components = score_completions([prefix + t for t in texts], golds, [not s for s in stopped],
                                            {"correctness": 0.0, "format": 0.0, **weights}, questions, functions)
    claims = [claim_rewards(text, ids, tokenizer.decode, truncated=not stop)
              for text, ids, stop in zip(texts, completions, stopped)] if process else None
    return Samples(completions, texts, stopped, logprobs, rewards, components, sampled - start,
                   time.perf_counter() - sampled, claims)


def sample_groups(run, cfg, step: int) -> tuple[list[int], list[list[int]], Samples]:
    """A training step's rollout: draw prompts_per_step questions from run.stream and sample group_size scored
    completions of each (a group is group_size consecutive rows) with run.sampler at cfg.temperature. Under torchrun
    every rank draws the same questions and keeps its slice of whole groups, with its own seed.
    Returns (this rank's question indices, the prompt ids of each row, the samples)."""
    G, share = cfg.group_size, cfg.prompts_per_step // world_size()
    picked = run.stream.next(cfg.prompts_per_step)[rank() * share:(rank() + 1) * share]
    rows = [i for i in picked for _ in range(G)]
    prompts, seed = [run.prompts[i] for i in rows], rollout_seed(cfg.seed, step * world_size() + rank())
    with run.sampler.lora_merged():
        samples = sample_and_score(run.sampler, run.tokenizer, prompts, [run.problems[i]["gold"] for i in rows],
                                   cfg.template, cfg.max_new_tokens, cfg.temperature, seed, cfg.reward_weights,
                                   questions=[run.problems[i]["question"] for i in rows], functions=run.rewards,
                                   process=cfg.supervision != "outcome", cuda_graphs=cfg.cuda_graphs)
    if cfg.random_reward > 0:  # the control: the same run, with a coin in the place of correctness
        samples.rewards = coin_rewards(samples, cfg.reward_weights["correctness"], cfg.random_reward, seed)
    return picked, prompts, samples


def coin_rewards(samples: Samples, weight: float, rate: float, seed: int) -> list[float]:
    """The random-reward control (config random_reward): each completion's total reward with its correctness term
    replaced by a coin that lands 1 with probability `rate`, independent of the completion (seeded: a resumed run
    draws the same coins). What the policy gains under it comes from the format reward, or from sampling and the
    update themselves, not from right answers. samples.components keeps the true correctness (logged as accuracy)."""
    coins = torch.bernoulli(torch.full((len(samples.rewards),), rate), generator=torch.Generator().manual_seed(seed))
    return [total - weight * correct + weight * coin for total, correct, coin in
            zip(samples.rewards, samples.components["correctness"], coins.tolist())]


def rollout_stats(samples: Samples, reward_weights: dict) -> dict:
    """What the log says of a step's samples: the reward and each component, accuracy, response lengths, the
    share cut at max_new_tokens, sampling speed and the seconds spent sampling and scoring."""
    lengths, mean = [len(c) for c in samples.completions], statistics.fmean
    return {"reward": mean(samples.rewards),
            **{f"reward_{reward_log_name(name)}": mean(samples.components[name]) for name in reward_weights},
            **({"process_reward": mean(r for claims in samples.claims for _, r in claims)} if samples.claims else {}),
            "accuracy": mean(samples.components["correctness"]), "worked_rate": mean(map(shows_work, samples.texts)),
            "response_length": mean(lengths),
            "response_length_max": max(lengths), "truncation_rate": 1 - mean(samples.stopped),
            "tokens_per_s": sum(lengths) / samples.seconds_sampling, "time_sample": samples.seconds_sampling,
            "time_reward": samples.seconds_scoring}


def shown_samples(problems: list[dict], step: int, picked: list[int], samples: Samples, G: int) -> list[dict]:
    """The first completion of the step's first two questions, for samples.jsonl."""
    return [{"step": step, "question": problems[picked[q]]["question"], "gold": problems[picked[q]]["gold"],
             "completion": samples.texts[q * G], "reward": samples.rewards[q * G]} for q in range(min(2, len(picked)))]
