"""
The rollout, GRPO's "act": prompts -> sampled, decoded and scored completions (Samples), then the
post-sampling stage (reward shaping, dynamic sampling's filter). One path from tokens to rewards,
for training (sample_groups: G completions of each of a step's questions) and for evaluation
(eval.score_questions).

    samples = sample_and_score(model, tokenizer, prompts, golds, seed, sampling, scoring)
    samples.completions[i], samples.texts[i], samples.rewards[i]   # row i answers prompts[i]
    samples.select([0, 1, 2]), Samples.concat([a, b])   # rows kept together, every field aligned

Where to add a reward shaping: a function and its config key in SHAPING. What a step logs of its
samples is records.py's.
"""
import contextlib
import dataclasses
import random
import time
from dataclasses import dataclass, field

import torch

from distributed import from_every_rank, rank, world_size
from rewards import claim_rewards, score_completions
from sample import generate
from template import Template, stop_sequences, stop_token_ids

# rollout_seed: the index distance between a step's draws (room for 16M step-rank indices)
DRAW_STRIDE = 2 ** 24


class QuestionStream:
    """The order in which training draws questions: indices in shuffled epochs from a seeded RNG;
    its whole state goes into the checkpoint, so a resumed run draws what an uninterrupted one
    would."""

    def __init__(self, n: int, seed: int):
        self.n = n
        self.rng = random.Random(seed)
        self.order = []
        self.cursor = 0

    def next(self, k: int) -> list[int]:
        picked = []
        while len(picked) < k:
            if self.cursor == len(self.order):  # a new epoch
                self.order, self.cursor = list(range(self.n)), 0
                self.rng.shuffle(self.order)
            picked.append(self.order[self.cursor])
            self.cursor += 1
        return picked

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), "order": self.order, "cursor": self.cursor}

    def load_state_dict(self, state: dict):
        self.rng.setstate(state["rng"])
        self.order, self.cursor = list(state["order"]), state["cursor"]


def rollout_seed(seed: int, index: int, draw: int = 0) -> int:
    """The sampler's seed for rollout `index`, draw `draw`: a resumed run draws the same."""
    return (seed * 1_000_003 + index + draw * DRAW_STRIDE) % 2 ** 31


@dataclass
class Samples:
    """Completions of a batch of prompts, decoded and scored; row i answers prompts[i]. The per-row
    fields (ROWS, and each list of components) stay aligned through select and concat. In a training
    step, each group is group_size consecutive rows."""
    prompts: list[list[int]]  # prompt token ids
    completions: list[list[int]]  # generated token ids, stop token included
    # decoded completions, without a final end-of-text token (a final "</answer>" is kept)
    texts: list[str]
    stopped: list[bool]  # False: cut at max_new_tokens
    # the sampler's log-prob of each completion token (at the sampling temperature)
    logprobs: list[list[float]] | None
    rewards: list[float]  # weighted sum of the reward components, then shaped (SHAPING)
    # each reward unweighted ("correctness", "format" always), each shaping's term
    components: dict[str, list[float]]
    seconds_sampling: float  # generate, to the tokens on the host
    seconds_scoring: float  # decoding and rewards
    # process=True: (token index of a claim's end, reward) each
    claims: list[list[tuple[int, float]]] | None = None
    problems: list[int] | None = None  # training: the index of each row's problem (sample_groups)
    # what the post-sampling stage reports; step_record logs it
    stats: dict = field(default_factory=dict)
    # sample.Rollout.fast_paths: {config key: it decoded these rows}
    fast_paths: dict = field(default_factory=dict)

    ROWS = ("prompts", "completions", "texts", "stopped", "logprobs", "rewards", "claims",
            "problems")

    @property
    def lengths(self) -> list[int]:
        """Completion lengths in tokens, stop token included."""
        return [len(c) for c in self.completions]

    def select(self, rows: list[int]) -> "Samples":
        """The samples of these rows, in this order; timings and stats are kept."""
        picked = {name: None if getattr(self, name) is None
                  else [getattr(self, name)[i] for i in rows] for name in self.ROWS}
        components = {name: [values[i] for i in rows] for name, values in self.components.items()}
        return dataclasses.replace(self, **picked, components=components, stats=dict(self.stats))

    @staticmethod
    def concat(parts: list["Samples"]) -> "Samples":
        """One Samples of the parts' rows in order; seconds add up, stats merge (a later part's key
        wins). A per-row field absent (None) in any part is None."""
        rows = {name: None if any(getattr(p, name) is None for p in parts) else
                [x for p in parts for x in getattr(p, name)] for name in Samples.ROWS}
        components = {name: [x for p in parts for x in p.components[name]]
                      for name in parts[0].components}
        paths = dict.fromkeys(key for p in parts for key in p.fast_paths)
        fast_paths = {key: all(p.fast_paths.get(key, False) for p in parts)  # it decoded every part
                      for key in paths}
        return Samples(**rows, components=components,
                       seconds_sampling=sum(p.seconds_sampling for p in parts),
                       seconds_scoring=sum(p.seconds_scoring for p in parts),
                       stats={key: value for p in parts for key, value in p.stats.items()},
                       fast_paths=fast_paths)


@dataclass
class Sampling:
    """How a rollout samples: sample.generate's settings and what ends a completion, made once for a
    run (or an evaluation) by sampling_of."""
    max_new_tokens: int
    temperature: float  # 0 is greedy
    stops: list[list[int]]  # token-id sequences that end a completion (template.stop_sequences)
    # the stop ids that end the text itself: dropped from the decoded completion
    end_of_text: set[int]
    top_p: float = 1.0
    top_k: int = 0
    cuda_graphs: bool = True  # the sampler's GPU-only fast paths (sample.generate)
    keep_graphs: bool = True
    fused_sampling: bool = True
    fused_decode: bool = True
    checked: bool = False  # prompts and settings checked at set-up (train.py): generate skips it


def sampling_of(tokenizer, template: Template, max_new_tokens: int, temperature: float,
                **settings) -> Sampling:
    """A Sampling for this tokenizer and template: the stops are the end-of-text ids and the answer
    close tag as the tokenizer writes it; settings: top_p, top_k, cuda_graphs, fused_sampling,
    fused_decode, checked."""
    return Sampling(max_new_tokens, temperature, stop_sequences(tokenizer, template),
                    set(stop_token_ids(tokenizer)), **settings)


@dataclass
class Scoring:
    """How a rollout's completions are scored (rewards.score_completions), made once for a run or an
    evaluation."""
    template: Template  # whose tags the rules read
    # reward name -> weight; correctness and format are measured at weight 0 too
    weights: dict[str, float]
    answer_checker: str = "gsm8k"  # how answers are read and compared (answers.ANSWER_CHECKERS)
    functions: dict | None = None  # the config's own rewards, loaded (reward_models.load_rewards)
    process: bool = False  # also the claims' rewards of process supervision


# -----------------------------------------------------------------------------
# a training step's rollout


def sample_groups(run, cfg, step: int) -> Samples:
    """A step's rollout: group_size scored completions of each of prompts_per_step questions."""
    if cfg.dynamic_sampling:
        return dynamic_groups(run, cfg, step)
    share = cfg.prompts_per_step // world_size()
    picked = run.stream.next(cfg.prompts_per_step)[rank() * share:(rank() + 1) * share]
    return scored_groups(run, cfg, picked, rollout_seed(cfg.seed, step * world_size() + rank()))


def dynamic_groups(run, cfg, step: int) -> Samples:
    """sample_groups with DAPO's dynamic sampling: groups whose rewards are all equal are dropped
    and more questions drawn, up to max_num_gen_batches draws, until prompts_per_step groups are
    kept; at the cap the batch is filled up with dropped groups, as plain GRPO would train on them.
    Draw d samples with rollout_seed(seed, step * world_size + rank, d); each rank fills its own
    share, and the ranks draw until all are full."""
    share = cfg.prompts_per_step // world_size()
    G = cfg.group_size
    kept, dropped, drawn = [], [], []
    for draw in range(cfg.max_num_gen_batches):
        picked = run.stream.next(cfg.prompts_per_step)[rank() * share:(rank() + 1) * share]
        if len(kept) < share:  # a full rank draws the questions the others draw, and samples none
            samples = scored_groups(run, cfg, picked,
                                    rollout_seed(cfg.seed, step * world_size() + rank(), draw))
            informative = informative_groups(samples.rewards, G)
            for g in range(share):
                group = samples.select(range(g * G, (g + 1) * G))
                (kept if informative[g] else dropped).append(group)
            drawn.append(samples)
        if all(from_every_rank(len(kept) >= share)):  # a collective: the ranks draw together
            break
    filled = dropped[:max(0, share - len(kept))]
    samples = Samples.concat(kept[:share] + filled)
    samples.stats = dynamic_sampling_stats(Samples.concat(drawn), G, draw + 1, len(filled))
    return samples


def scored_groups(run, cfg, picked: list[int], seed: int) -> Samples:
    """group_size completions of each picked question, sampled with seed, scored and shaped."""
    rows = [i for i in picked for _ in range(cfg.group_size)]
    prompts = [run.prompts[i] for i in rows]
    golds = [run.problems[i]["gold"] for i in rows]
    questions = [run.problems[i]["question"] for i in rows]
    with run.sampler.lora_merged() if cfg.lora_rank else contextlib.nullcontext():
        samples = sample_and_score(run.sampler, run.tokenizer, prompts, golds, seed, run.sampling,
                                   run.scoring, questions)
    samples.problems = rows
    for shape, key in SHAPING:
        if getattr(cfg, key):  # the shapings its config asks for
            shape(samples, cfg, seed)
    return samples


def sample_and_score(model, tokenizer, prompts: list[list[int]], golds: list[str],
                     seed: int | list[int], sampling: Sampling, scoring: Scoring,
                     questions: list[str] | None = None) -> Samples:
    """One completion per prompt, sampled, decoded and scored against its gold answer."""
    start = time.perf_counter()
    rollout = generate(model, prompts, sampling.max_new_tokens, temperature=sampling.temperature,
                       top_p=sampling.top_p, top_k=sampling.top_k, stop_sequences=sampling.stops,
                       seed=seed, pad_id=tokenizer.pad_token_id, cuda_graphs=sampling.cuda_graphs,
                       keep_graphs=sampling.keep_graphs,
                       fused_sampling=sampling.fused_sampling, fused_decode=sampling.fused_decode,
                       check=not sampling.checked)
    lengths = rollout.lengths.tolist()
    stopped = rollout.stopped.tolist()
    completions = [row[:n] for row, n in zip(rollout.tokens.tolist(), lengths)]
    logprobs = [row[:n] for row, n in zip(rollout.logprobs.tolist(), lengths)]
    sampled = time.perf_counter()
    texts = [tokenizer.decode(c[:-1] if c[-1] in sampling.end_of_text else c) for c in completions]
    # from the response prefix on; correctness and format always logged
    template = scoring.template
    weights = {"correctness": 0.0, "format": 0.0, **scoring.weights}
    rewards, components = score_completions(
        [template.prefix + t for t in texts], golds, [not s for s in stopped], weights, questions,
        scoring.functions, template=template, lengths=lengths,
        max_new_tokens=sampling.max_new_tokens, answer_checker=scoring.answer_checker,
        check=False)  # checked with the config
    claims = [claim_rewards(text, ids, tokenizer.decode, truncated=not stop)
              for text, ids, stop in zip(texts, completions, stopped)] if scoring.process else None
    return Samples(prompts, completions, texts, stopped, logprobs, rewards, components,
                   sampled - start, time.perf_counter() - sampled, claims,
                   fast_paths=rollout.fast_paths)

# -----------------------------------------------------------------------------
# the post-sampling stage: reward shaping (SHAPING, in order, on every draw of a training step, each
# where its config key is set) and dynamic sampling's filter. A shaping may read
# samples.lengths, .stopped, .texts, .components, cfg.max_new_tokens and so on; seed is the draw's
# sampler seed, for any coins. Nothing here reaches evaluation: eval.py scores the rewards' rules
# alone.


def add_reward(samples: Samples, name: str, values: list[float]):
    """Add a shaping term to each row's reward and keep it as the component `name` (logged as
    reward_<name>)."""
    samples.rewards = [reward + value for reward, value in zip(samples.rewards, values)]
    samples.components[name] = list(values)


def random_reward(samples: Samples, cfg, seed: int):
    """The random-reward control (config random_reward > 0): see coin_rewards."""
    samples.rewards = coin_rewards(samples, cfg.reward_weights["correctness"], cfg.random_reward,
                                   seed)


def coin_rewards(samples: Samples, weight: float, rate: float, seed: int) -> list[float]:
    """Each completion's total reward with its correctness term replaced by a coin that lands 1 with
    probability `rate`, independent of the completion (seeded: a resumed run draws the same coins).
    What the policy gains under it comes from the format reward, or from sampling and the update
    themselves, not from right answers. samples.components keeps the true correctness (logged as
    accuracy)."""
    coins = torch.bernoulli(torch.full((len(samples.rewards),), rate),
                            generator=torch.Generator().manual_seed(seed))
    return [total - weight * correct + weight * coin for total, correct, coin in
            zip(samples.rewards, samples.components["correctness"], coins.tolist())]


def overlong_penalty(samples: Samples, cfg, seed: int):
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13), config
    overlong_buffer_len > 0: with L_max = max_new_tokens and L_cache = overlong_buffer_len, a
    completion of L tokens gets
        0                                  if L <= L_max - L_cache
        ((L_max - L_cache) - L) / L_cache  if L_max - L_cache < L <= L_max  (-1 at L = L_max)
    times overlong_penalty_factor (verl's name; DAPO's is 1), added to its reward and logged as
    reward_overlong. Eq. 13's -1 beyond L_max never applies here: the sampler stops at L_max."""
    start = cfg.max_new_tokens - cfg.overlong_buffer_len
    add_reward(samples, "overlong",
               [cfg.overlong_penalty_factor * min(0.0, (start - n) / cfg.overlong_buffer_len)
                for n in samples.lengths])


# (shaping, the config key that turns it on), in this order, on every draw of a training step
SHAPING = ((random_reward, "random_reward"), (overlong_penalty, "overlong_buffer_len"))


def informative_groups(rewards: list[float], group_size: int) -> list[bool]:
    """Dynamic sampling's filter (DAPO, arXiv:2503.14476, sec. 3.2): for each group of group_size
    consecutive rewards, whether they differ. A group whose rewards are all equal (all right, all
    wrong) has zero advantages and no policy gradient. The rewards are the shaped totals, so a
    shaping term that tells a group's completions apart keeps it (verl's DAPO recipe filters on
    accuracy alone)."""
    return [len(set(rewards[start:start + group_size])) > 1
            for start in range(0, len(rewards), group_size)]


def dynamic_sampling_stats(drawn: Samples, group_size: int, draws: int, filled: int) -> dict:
    """What dynamic sampling logs for a step, over every rank (collectives under torchrun):
    dynamic_draws (draws of prompts_per_step questions, the first included), dynamic_dropped_frac
    (the share of the drawn groups whose rewards were all equal), dynamic_filled (dropped groups put
    back at the cap, max_num_gen_batches) and accuracy_sampled (the accuracy of every drawn
    completion; the log's accuracy is the kept batch's)."""
    informative = informative_groups(drawn.rewards, group_size)
    mine = [len(informative), informative.count(False), filled,
            sum(drawn.components["correctness"]), len(drawn.rewards)]
    counts = [sum(column) for column in zip(*from_every_rank(mine))]
    return {"dynamic_draws": draws, "dynamic_dropped_frac": counts[1] / counts[0],
            "dynamic_filled": counts[2], "accuracy_sampled": counts[3] / counts[4]}
