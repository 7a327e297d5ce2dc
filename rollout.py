"""
The rollout, GRPO's "act": prompts -> sampled, decoded and scored completions (Samples), then the post-sampling
stage (reward shaping, dynamic sampling's filter) and the step's metrics. One path from tokens to rewards, for
training (sample_groups: G completions of each of a step's questions) and for evaluation (eval.score_questions).

    samples = sample_and_score(model, tokenizer, prompts, golds, template, max_new_tokens, temperature, seed, weights)
    samples.completions[i], samples.texts[i], samples.rewards[i]      # row i answers prompts[i]
    samples.select([0, 1, 2]), Samples.concat([a, b])                  # rows kept together, every field aligned

Where to add a reward shaping: a function in SHAPING; a logged metric: a function in METRICS; a yes/no property of
a completion (logged as its rate): an entry of completion_flags.
"""
import dataclasses
import math
import random
import statistics
import time
from dataclasses import dataclass, field

import torch

from distributed import all_samples, from_every_rank, rank, world_size
from grpo import zero_std_group_fraction
from rewards import REFLECTION_MARKERS, claim_rewards, reflects, reward_log_name, score_completions, shows_work
from sample import generate
from template import Template, stop_sequences, stop_token_ids, template_of

DRAW_STRIDE = 2 ** 24  # rollout_seed: the index distance between a step's draws (room for 16M step-rank indices)


class QuestionStream:
    """The order in which training draws questions: indices in shuffled epochs from a seeded RNG; its whole state
    goes into the checkpoint, so a resumed run draws what an uninterrupted one would."""

    def __init__(self, n: int, seed: int):
        self.n, self.rng, self.order, self.cursor = n, random.Random(seed), [], 0

    def next(self, k: int) -> list[int]:
        picked = []
        while len(picked) < k:
            if self.cursor == len(self.order):
                self.order, self.cursor = list(range(self.n)), 0
                self.rng.shuffle(self.order)
            take = min(k - len(picked), len(self.order) - self.cursor)
            picked += self.order[self.cursor:self.cursor + take]
            self.cursor += take
        return picked

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), "order": self.order, "cursor": self.cursor}

    def load_state_dict(self, state: dict):
        self.rng.setstate(state["rng"])
        self.order, self.cursor = list(state["order"]), state["cursor"]


def rollout_seed(seed: int, index: int, draw: int = 0) -> int:
    """The sampler's seed for rollout number `index` of a run seeded `seed` (a training step's rows on one rank,
    step * world_size + rank, or one evaluation sample), and for dynamic sampling's extra draws in one step, draw
    1, 2, ... (draw 0 is the step's first): distinct per (seed, index, draw), so a resumed run draws the same
    samples. Draw d takes index + d * DRAW_STRIDE."""
    return (seed * 1_000_003 + index + draw * DRAW_STRIDE) % 2 ** 31


@dataclass
class Samples:
    """Completions of a batch of prompts, decoded and scored; row i answers prompts[i]. The per-row fields (ROWS, and
    each list of components) stay aligned through select and concat. In a training step, each group is group_size
    consecutive rows."""
    prompts: list[list[int]]  # prompt token ids
    completions: list[list[int]]  # generated token ids, stop token included
    texts: list[str]  # decoded completions, without a final end-of-text token (a final "</answer>" is kept)
    stopped: list[bool]  # False: cut at max_new_tokens
    logprobs: list[list[float]] | None  # the sampler's log-prob of each completion token (at the sampling temperature)
    rewards: list[float]  # weighted sum of the reward components, then shaped (SHAPING)
    components: dict[str, list[float]]  # each reward unweighted ("correctness", "format" always), each shaping's term
    seconds_sampling: float  # generate, to the tokens on the host
    seconds_scoring: float  # decoding and rewards
    claims: list[list[tuple[int, float]]] | None = None  # process=True: (token index of a claim's end, reward) each
    problems: list[int] | None = None  # training: the index of each row's problem (sample_groups)
    stats: dict = field(default_factory=dict)  # what the post-sampling stage reports; step_record logs it
    fast_paths: dict = field(default_factory=dict)  # sample.Rollout.fast_paths: {config key: it decoded these rows}

    ROWS = ("prompts", "completions", "texts", "stopped", "logprobs", "rewards", "claims", "problems")

    @property
    def lengths(self) -> list[int]:
        """Completion lengths in tokens, stop token included."""
        return [len(c) for c in self.completions]

    def select(self, rows: list[int]) -> "Samples":
        """The samples of these rows, in this order; timings and stats are kept."""
        picked = {name: None if getattr(self, name) is None else [getattr(self, name)[i] for i in rows]
                  for name in self.ROWS}
        components = {name: [values[i] for i in rows] for name, values in self.components.items()}
        return dataclasses.replace(self, **picked, components=components, stats=dict(self.stats))

    @staticmethod
    def concat(parts: list["Samples"]) -> "Samples":
        """One Samples of the parts' rows in order; seconds add up, stats merge (a later part's key wins). A per-row
        field absent (None) in any part is None."""
        rows = {name: None if any(getattr(p, name) is None for p in parts) else
                [x for p in parts for x in getattr(p, name)] for name in Samples.ROWS}
        components = {name: [x for p in parts for x in p.components[name]] for name in parts[0].components}
        paths = dict.fromkeys(key for p in parts for key in p.fast_paths)  # a fast path ran if it decoded every part
        return Samples(**rows, components=components, seconds_sampling=sum(p.seconds_sampling for p in parts),
                       seconds_scoring=sum(p.seconds_scoring for p in parts),
                       stats={key: value for p in parts for key, value in p.stats.items()},
                       fast_paths={key: all(p.fast_paths.get(key, False) for p in parts) for key in paths})


def sample_and_score(model, tokenizer, prompts: list[list[int]], golds: list[str], template: Template,
                     max_new_tokens: int, temperature: float, seed: int | list[int], weights: dict[str, float],
                     top_p: float = 1.0, top_k: int = 0, questions: list[str] | None = None, functions=None,
                     process: bool = False, cuda_graphs: bool = True, fused_sampling: bool = True,
                     answer_checker: str = "gsm8k") -> Samples:
    """Sample one completion per prompt, ending at an end-of-text token or the template's answer close tag, decode it
    and score it against its gold answer: weights names the rewards, functions holds the config's own
    (reward_models.load_rewards), questions the problems' text they may read; answer_checker (answers.ANSWER_CHECKERS)
    how correctness reads and compares answers. process: also the claims' rewards of process supervision.
    cuda_graphs, fused_sampling: the sampler's GPU-only fast paths (sample.generate)."""
    end_of_text, start = set(stop_token_ids(tokenizer)), time.perf_counter()
    rollout = generate(model, prompts, max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                       stop_sequences=stop_sequences(tokenizer, template), seed=seed, pad_id=tokenizer.pad_token_id,
                       cuda_graphs=cuda_graphs, fused_sampling=fused_sampling)
    tokens, lengths, stopped = rollout.tokens.tolist(), rollout.lengths.tolist(), rollout.stopped.tolist()
    logprobs = [row[:n] for row, n in zip(rollout.logprobs.tolist(), lengths)]
    completions, sampled = [row[:n] for row, n in zip(tokens, lengths)], time.perf_counter()
    texts = [tokenizer.decode(c[:-1] if c[-1] in end_of_text else c) for c in completions]  # "</answer>" is kept
    # the prompt ends in the response prefix ("<think>"): the format reward judges the whole response.
    # accuracy and format are measured whatever the weights; a 0 weight keeps them out of the reward
    rewards, components = score_completions([template.prefix + t for t in texts], golds, [not s for s in stopped],
                                            {"correctness": 0.0, "format": 0.0, **weights}, questions, functions,
                                            template=template, lengths=lengths, max_new_tokens=max_new_tokens,
                                            answer_checker=answer_checker)
    claims = None
    if process:
        claims = [claim_rewards(text, ids, tokenizer.decode, truncated=not stop)
                  for text, ids, stop in zip(texts, completions, stopped)]
    return Samples(prompts, completions, texts, stopped, logprobs, rewards, components, sampled - start,
                   time.perf_counter() - sampled, claims, fast_paths=rollout.fast_paths)

# -----------------------------------------------------------------------------
# a training step's rollout


def sample_groups(run, cfg, step: int) -> Samples:
    """A training step's rollout: draw prompts_per_step questions from run.stream, sample group_size scored
    completions of each (a group is group_size consecutive rows) with run.sampler at cfg.temperature, and shape
    their rewards (SHAPING). With dynamic_sampling (DAPO), groups whose rewards are all equal are dropped and more
    questions drawn, up to max_num_gen_batches draws, until prompts_per_step groups are kept; at the cap the batch is
    filled up with dropped groups, as plain GRPO would train on them. Draw d of step s samples with
    rollout_seed(seed, s * world_size + rank, d). Under torchrun every rank draws the same questions and keeps its
    slice of whole groups, with its own seed; with dynamic sampling each rank fills its own share, and the ranks
    draw until all are full."""
    share, G = cfg.prompts_per_step // world_size(), cfg.group_size
    kept, dropped, drawn = [], [], []
    for draw in range(cfg.max_num_gen_batches if cfg.dynamic_sampling else 1):
        picked = run.stream.next(cfg.prompts_per_step)[rank() * share:(rank() + 1) * share]
        if len(kept) < share:  # a full rank draws the questions the others draw, and samples none
            samples = scored_groups(run, cfg, picked, rollout_seed(cfg.seed, step * world_size() + rank(), draw))
            if not cfg.dynamic_sampling:
                return samples
            informative = informative_groups(samples.rewards, G)
            for g in range(share):
                (kept if informative[g] else dropped).append(samples.select(range(g * G, (g + 1) * G)))
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
    with run.sampler.lora_merged():
        samples = sample_and_score(run.sampler, run.tokenizer, [run.prompts[i] for i in rows],
                                   [run.problems[i]["gold"] for i in rows], run.template, cfg.max_new_tokens,
                                   cfg.temperature, seed, cfg.reward_weights,
                                   questions=[run.problems[i]["question"] for i in rows], functions=run.rewards,
                                   process=cfg.supervision != "outcome", cuda_graphs=cfg.cuda_graphs,
                                   fused_sampling=cfg.fused_sampling, answer_checker=cfg.answer_checker)
    samples.problems = rows
    for shape in SHAPING:
        shape(samples, cfg, seed)
    return samples

# -----------------------------------------------------------------------------
# the post-sampling stage: reward shaping (SHAPING, in order, on every draw of a training step; each does nothing
# unless its config key asks) and dynamic sampling's filter. A shaping may read samples.lengths, .stopped, .texts,
# .components, cfg.max_new_tokens and so on; seed is the draw's sampler seed, for any coins. Nothing here reaches
# evaluation: eval.py scores the rewards' rules alone.


def add_reward(samples: Samples, name: str, values: list[float]):
    """Add a shaping term to each row's reward and keep it as the component `name` (logged as reward_<name>)."""
    samples.rewards = [reward + value for reward, value in zip(samples.rewards, values)]
    samples.components[name] = list(values)


def random_reward(samples: Samples, cfg, seed: int):
    """The random-reward control (config random_reward > 0): see coin_rewards."""
    if cfg.random_reward > 0:
        samples.rewards = coin_rewards(samples, cfg.reward_weights["correctness"], cfg.random_reward, seed)


def coin_rewards(samples: Samples, weight: float, rate: float, seed: int) -> list[float]:
    """Each completion's total reward with its correctness term replaced by a coin that lands 1 with probability
    `rate`, independent of the completion (seeded: a resumed run draws the same coins). What the policy gains under
    it comes from the format reward, or from sampling and the update themselves, not from right answers.
    samples.components keeps the true correctness (logged as accuracy)."""
    coins = torch.bernoulli(torch.full((len(samples.rewards),), rate), generator=torch.Generator().manual_seed(seed))
    return [total - weight * correct + weight * coin for total, correct, coin in
            zip(samples.rewards, samples.components["correctness"], coins.tolist())]


def overlong_penalty(samples: Samples, cfg, seed: int):
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13), config overlong_buffer_len > 0:
    with L_max = max_new_tokens and L_cache = overlong_buffer_len, a completion of L tokens gets
        0                                  if L <= L_max - L_cache
        ((L_max - L_cache) - L) / L_cache  if L_max - L_cache < L <= L_max      (down to -1 at L = L_max)
    times overlong_penalty_factor (verl's name; DAPO's is 1), added to its reward and logged as reward_overlong.
    Eq. 13's -1 beyond L_max never applies here: the sampler stops at L_max."""
    if cfg.overlong_buffer_len > 0:
        start = cfg.max_new_tokens - cfg.overlong_buffer_len
        add_reward(samples, "overlong", [cfg.overlong_penalty_factor * min(0.0, (start - n) / cfg.overlong_buffer_len)
                                         for n in samples.lengths])


SHAPING = (random_reward, overlong_penalty)  # in this order, on every draw of a training step


def informative_groups(rewards: list[float], group_size: int) -> list[bool]:
    """Dynamic sampling's filter (DAPO, arXiv:2503.14476, sec. 3.2): for each group of group_size consecutive rewards,
    whether they differ. A group whose rewards are all equal (all right, all wrong) has zero advantages and no
    policy gradient. The rewards are the shaped totals, so a shaping term that tells a group's completions apart
    keeps it (verl's DAPO recipe filters on accuracy alone)."""
    return [len(set(rewards[start:start + group_size])) > 1 for start in range(0, len(rewards), group_size)]


def dynamic_sampling_stats(drawn: Samples, group_size: int, draws: int, filled: int) -> dict:
    """What dynamic sampling logs for a step, over every rank (collectives under torchrun): dynamic_draws (draws of
    prompts_per_step questions, the first included), dynamic_dropped_frac (the share of the drawn groups whose
    rewards were all equal), dynamic_filled (dropped groups put back at the cap, max_num_gen_batches) and
    accuracy_sampled (the accuracy of every drawn completion; the log's accuracy is the kept batch's)."""
    informative = informative_groups(drawn.rewards, group_size)
    mine = [len(informative), informative.count(False), filled, sum(drawn.components["correctness"]),
            len(drawn.rewards)]
    counts = [sum(column) for column in zip(*from_every_rank(mine))]
    return {"dynamic_draws": draws, "dynamic_dropped_frac": counts[1] / counts[0], "dynamic_filled": counts[2],
            "accuracy_sampled": counts[3] / counts[4]}

# -----------------------------------------------------------------------------
# the step's metrics: step_record runs every function of METRICS on the step's samples (every rank's rows), then
# adds what the post-sampling stage reported and the update's own figures; GRPO and the baselines log through it


def completion_flags(template, reflection_markers: tuple = REFLECTION_MARKERS) -> dict:
    """{name: flag(text) -> bool} for a template.Template: worked (rewards.shows_work: an arithmetic claim before the
    think close tag) and reflect (rewards.reflects: a re-check phrase of reflection_markers there). Each is logged
    as <name>_rate, and eval.py reports the accuracy of the completions with and without it."""
    return {"worked": lambda text: shows_work(text, template),
            "reflect": lambda text: reflects(text, template, reflection_markers)}


def reward_metrics(samples: Samples, cfg) -> dict:
    """The mean reward, and of each component: the rewards cfg weighs (by their log names) and the shaping terms."""
    means = {"reward": statistics.fmean(samples.rewards)}
    for name, values in samples.components.items():
        if name in cfg.reward_weights:
            means[f"reward_{reward_log_name(name)}"] = statistics.fmean(values)
    for name, values in samples.components.items():  # the rules are measured at weight 0 too: not logged then
        if name not in cfg.reward_weights and name not in ("correctness", "format"):
            means[f"reward_{name}"] = statistics.fmean(values)
    if samples.claims:
        means["process_reward"] = statistics.fmean(r for claims in samples.claims for _, r in claims)
    return means


def accuracy_metrics(samples: Samples, cfg) -> dict:
    """The share of correct completions, and of each completion flag (completion_flags) as <name>_rate."""
    flags = completion_flags(template_of(cfg.template), cfg.reflection_markers)
    rates = {f"{name}_rate": statistics.fmean(map(flag, samples.texts)) for name, flag in flags.items()}
    return {"accuracy": statistics.fmean(samples.components["correctness"]), **rates}


def length_metrics(samples: Samples, cfg) -> dict:
    """Response lengths in tokens (mean, max) and the share cut at max_new_tokens."""
    lengths = samples.lengths
    return {"response_length": statistics.fmean(lengths), "response_length_max": max(lengths),
            "truncation_rate": 1 - statistics.fmean(samples.stopped)}


def speed_metrics(samples: Samples, cfg) -> dict:
    """Sampling speed, the seconds spent sampling and scoring, and on a GPU whether each fast path asked for decoded
    the rollout (<key>_ran 1) or not (0: it fell back, sample.py said why, or it does not apply)."""
    ran = {f"{key}_ran": int(used) for key, used in samples.fast_paths.items()}
    return {"tokens_per_s": sum(samples.lengths) / samples.seconds_sampling, "time_sample": samples.seconds_sampling,
            "time_reward": samples.seconds_scoring, **ran}


def group_metrics(samples: Samples, cfg) -> dict:
    """The share of groups whose rewards are all equal (they carry no signal)."""
    return {"zero_std_frac": zero_std_group_fraction(torch.tensor(samples.rewards), cfg.group_size).item()}


METRICS = (reward_metrics, accuracy_metrics, length_metrics, speed_metrics, group_metrics)


def step_record(step: int, samples: Samples | None, stats: dict, cfg) -> dict:
    """The log record of a step: {"step"}, then METRICS of every rank's samples (a collective under torchrun; None:
    a step that sampled nothing, the SFT baselines), samples.stats, and stats; a NaN (the KL without a reference)
    is logged as None."""
    record = {"step": step}
    if samples is not None:
        samples = all_samples(samples)
        for metric in METRICS:
            record.update(metric(samples, cfg))
        record.update(samples.stats)
    record.update(stats)
    return {key: None if isinstance(value, float) and math.isnan(value) else value for key, value in record.items()}


def progress(record: dict, keys: tuple) -> dict:
    """The progress bar's figures: the keys (cfg.progress_keys) that the record holds, each to 4 significant digits."""
    return {key: f"{record[key]:.4g}" for key in keys if record.get(key) is not None}


def shown_samples(problems: list[dict], step: int, samples: Samples, G: int) -> list[dict]:
    """The first completion of the step's first two groups, for samples.jsonl."""
    return [{"step": step, "question": problems[samples.problems[row]]["question"],
             "gold": problems[samples.problems[row]]["gold"], "completion": samples.texts[row],
             "reward": samples.rewards[row]} for row in range(0, min(2 * G, len(samples.texts)), G)]
