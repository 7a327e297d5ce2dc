"""
A setting declared once: a dataclass field of the concept that reads it (grpo.LossSettings,
grpo.AdvantageSettings, grpo.CriticSettings; config.TrainConfig inherits them), with its default,
a one-line doc and its rule. Every list of settings is derived from those fields: the config's
checks and --help (config.py), grpo_loss's keywords, the switches a baseline leaves off, the
tests' key lists.

    clip_eps: float = setting(0.2, "the ratio's clip below 1: [1 - clip_eps, ...]", within(0, 1))
"""
import dataclasses
import math
import typing
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """What a setting may be: ok(value) -> bool, and what it asks for, in words."""
    ok: typing.Callable
    says: str


def setting(default, doc: str, rule: Rule | None = None, switch: bool = False,
            needs: Rule | None = None):
    """A dataclass field declaring a setting: its default, its doc (--help prints it), its rule
    (checked when the config loads), whether it is a switch (its default is off, and only
    method="grpo" and "ppo" read it), and what it needs of the other settings: needs.ok(value,
    settings)."""
    return dataclasses.field(default=default, metadata={"doc": doc, "rule": rule, "switch": switch,
                                                        "needs": needs})


def one_of(table) -> Rule:
    """One of the table's names (a part's table, or a tuple of choices)."""
    return Rule(lambda value: value in table, f"one of {tuple(table)}")


def within(low: float, high: float, closed: str = "[)") -> Rule:
    """A number in [low, high) (closed "[]": [low, high]; high may be math.inf)."""
    bottom = (lambda v: low <= v) if closed[0] == "[" else (lambda v: low < v)
    top = (lambda v: v <= high) if closed[1] == "]" else (lambda v: v < high)
    return Rule(lambda v: v is not None and bottom(v) and top(v), f"a number in {closed[0]}{low}, "
                f"{high}{closed[1]}")


def optional(rule: Rule) -> Rule:
    """None (off), or what rule allows."""
    return Rule(lambda value: value is None or rule.ok(value), f"None (off) or {rule.says}")


POSITIVE = Rule(lambda v: 0 < v < math.inf, "a finite number > 0")
AT_LEAST_0 = Rule(lambda v: 0 <= v < math.inf, "a finite number >= 0")
AT_LEAST_1 = Rule(lambda v: 1 <= v < math.inf, "a finite number >= 1")
PROBABILITY = within(0, 1, "[]")


def fields_of(settings) -> tuple:
    """The settings' fields: every dataclass field with a setting's metadata."""
    return tuple(f for f in dataclasses.fields(settings) if "doc" in f.metadata)


def check(settings):
    """A ValueError naming the first setting of `settings` (a dataclass) whose rule refuses its
    value, or whose needs the other settings do not meet."""
    for f in fields_of(settings):
        rule, value = f.metadata["rule"], getattr(settings, f.name)
        if rule is not None and not rule.ok(value):
            raise ValueError(f"{f.name} must be {rule.says}, got {value!r}")
    for f in fields_of(settings):
        needs, value = f.metadata["needs"], getattr(settings, f.name)
        if needs is not None and not needs.ok(value, settings):
            raise ValueError(f"{f.name}={value!r} needs {needs.says}")


def defaults(cls, switches: bool = False) -> dict:
    """{name: default} of cls's settings (switches=True: its switches only)."""
    return {f.name: f.default for f in fields_of(cls) if f.metadata["switch"] or not switches}


def changed(cls, settings) -> list[str]:
    """The names of cls's settings whose value in `settings` is not their default."""
    return [name for name, default in defaults(cls).items() if getattr(settings, name) != default]


def help_line(f: dataclasses.Field) -> str:
    """--help's line for a dataclass field: --name=default ('...' for a default made by a factory),
    and for a setting its doc and its rule."""
    default = "..." if f.default is dataclasses.MISSING else f.default
    if "doc" not in f.metadata:
        return f"  --{f.name}={default!r}"
    rule = f.metadata["rule"]
    return f"  --{f.name}={default!r}  {f.metadata['doc']}" + (f" ({rule.says})" if rule else "")
