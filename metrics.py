"""
A step's log record, made in one place: step_record(step, samples, stats, cfg) runs every function of METRICS on the
step's samples (rollout.Samples, every rank's rows) and adds what the post-sampling stage reported (samples.stats)
and the update's own figures (stats: loss, KL, clip fractions, grad norm, timings, ...). GRPO and the baselines
alike log through it; the progress bar shows cfg.progress_keys of the record.

    def my_metric(samples, cfg):                       # add it to METRICS: its keys join log.jsonl
        return {"answer_chars": statistics.fmean(len(t) for t in samples.texts)}

completion_flags() holds the yes/no properties of one completion (worked, reflect): each is logged as <name>_rate
per step, and eval.py reports its rate and the accuracy of the completions with and without it.
"""
import math
import statistics

import torch

from grpo import zero_std_group_fraction
from reward_models import reward_log_name
from rewards import REFLECTION_MARKERS, reflects, shows_work
from template import template_of


def completion_flags(template, reflection_markers: tuple = REFLECTION_MARKERS) -> dict:
    """{name: flag(text) -> bool} for a template.Template: worked (rewards.shows_work: an arithmetic claim before the
    think close tag) and reflect (rewards.reflects: a re-check phrase of reflection_markers there). Adding a flag =
    one entry here; its <name>_rate reaches log.jsonl, eval.jsonl and eval.py's summary."""
    return {"worked": lambda text: shows_work(text, template),
            "reflect": lambda text: reflects(text, template, reflection_markers)}


def reward_metrics(samples, cfg) -> dict:
    """The mean reward, and of each component: the rewards cfg weighs (their log names) and the shaping terms."""
    logged = {reward_log_name(name): values for name, values in samples.components.items()
              if name in cfg.reward_weights}
    shaped = {name: values for name, values in samples.components.items()  # the rules are measured at weight 0 too
              if name not in cfg.reward_weights and name not in ("correctness", "format")}
    return {"reward": statistics.fmean(samples.rewards),
            **{f"reward_{name}": statistics.fmean(values) for name, values in {**logged, **shaped}.items()},
            **({"process_reward": statistics.fmean(r for claims in samples.claims for _, r in claims)}
               if samples.claims else {})}


def accuracy_metrics(samples, cfg) -> dict:
    """The share of correct completions, and of each completion flag (completion_flags) as <name>_rate."""
    flags = completion_flags(template_of(cfg.template), cfg.reflection_markers)
    return {"accuracy": statistics.fmean(samples.components["correctness"]),
            **{f"{name}_rate": statistics.fmean(map(flag, samples.texts)) for name, flag in flags.items()}}


def length_metrics(samples, cfg) -> dict:
    """Response lengths in tokens (mean, max) and the share cut at max_new_tokens."""
    lengths = samples.lengths
    return {"response_length": statistics.fmean(lengths), "response_length_max": max(lengths),
            "truncation_rate": 1 - statistics.fmean(samples.stopped)}


def speed_metrics(samples, cfg) -> dict:
    """Sampling speed and the seconds spent sampling and scoring."""
    return {"tokens_per_s": sum(samples.lengths) / samples.seconds_sampling, "time_sample": samples.seconds_sampling,
            "time_reward": samples.seconds_scoring}


def group_metrics(samples, cfg) -> dict:
    """The share of groups whose rewards are all equal (they carry no signal)."""
    return {"zero_std_frac": zero_std_group_fraction(torch.tensor(samples.rewards), cfg.group_size).item()}


METRICS = (reward_metrics, accuracy_metrics, length_metrics, speed_metrics, group_metrics)


def step_record(step: int, samples, stats: dict, cfg) -> dict:
    """The log record of a step: {"step"}, then METRICS of samples (None: a step that sampled nothing, the SFT
    baselines), samples.stats, and stats; a NaN (the KL without a reference) is logged as None."""
    record = {"step": step}
    if samples is not None:
        for metric in METRICS:
            record.update(metric(samples, cfg))
        record.update(samples.stats)
    record.update(stats)
    return {key: None if isinstance(value, float) and math.isnan(value) else value for key, value in record.items()}


def progress(record: dict, keys: tuple) -> dict:
    """The progress bar's figures: cfg.progress_keys that the record holds, each to 4 significant digits."""
    return {key: f"{record[key]:.4g}" for key in keys if record.get(key) is not None}
