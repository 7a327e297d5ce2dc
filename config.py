"""
The training config: one typed dataclass, every value checked when it loads, before any work.

    python train.py configs/demo.py --lr=1e-3 --beta=0  # a config file, then --key=value overrides

A config file is plain Python assigning some of TrainConfig's fields (nanoGPT style); several files
load in order, each overriding the last. On the command line a value is a Python literal, or plain
text for a str key, and a bare --flag sets a bool key. An unknown key is refused, naming the closest
known one. Each concept checks its own keys (grpo, rewards, data, model and template: a
check_settings or check each); validate() runs them and the checks that span several concepts.
"""
import ast
import dataclasses
import difflib
import importlib.util
import math
import os
import runpy
import types
import typing
from dataclasses import dataclass, field

import data
import grpo
import model
import rewards
from answers import ANSWER_CHECKERS
from distributed import world_size
from rewards import REFLECTION_MARKERS
from settings import AT_LEAST_0, AT_LEAST_1, Rule, check, help_line, one_of, setting, within
from template import TEMPLATES, template_dict, template_of

METHODS = ("grpo", "ppo", "rft", "sft_answers", "sft_more")
SUPERVISIONS = ("outcome", "process", "both")


@dataclass
class TrainConfig(grpo.LossSettings, grpo.AdvantageSettings, grpo.CriticSettings):
    # model, tokenizer, prompt
    # a Hugging Face name or local dir, or "scratch": a new model of shape model_args
    model: str = "Qwen/Qwen2.5-0.5B"
    # ModelConfig fields for model="scratch" (vocab_size defaults to the tokenizer's)
    model_args: dict = field(default_factory=dict)
    # a GGUF file inside `model` (a local dir or hub repo) to load the weights and tokenizer from
    gguf_file: str = ""
    tokenizer: str = ""  # "" = the model's own; "char" = template.CharTokenizer
    # the prompt and the tags the completion writes: a template.TEMPLATES name ("r1_zero", "plain",
    # "chat": the tokenizer's chat template) or a dict of template.Template's fields, e.g.
    # {"think": ("<reasoning>", "</reasoning>"), "answer": ("<final>", "</final>")}; kept as the
    # whole template, recorded in every checkpoint
    template: str | dict = setting("r1_zero", f"a template.TEMPLATES name ({', '.join(TEMPLATES)}) "
                                   "or a dict of template.Template's fields")
    # data: "gsm8k"; "jsonl", your own GSM8K-format files (data_dir/{train_split,eval_split}.jsonl,
    # rows {"question", "answer" ending in "#### N"}); "synthetic" (data.synthetic_problems:
    # training and held-out questions of one family); "synthetic_split" (data.synthetic_split: a
    # warm-start family with worked solutions, an answer-only RL family, held-out questions whose
    # chains occur in neither); "math": MATH-format rows {"problem", "solution", "answer",
    # "subject", "level"}, training from data/math/train.jsonl (downloaded and sha256-checked on
    # first use: `python data.py math`) at math_levels, held out from data/math500 (MATH-500)
    dataset: str = setting("gsm8k", "the training and held-out problems (above)",
                           one_of(data.DATASETS))
    data_dir: str = "data/gsm8k"  # dataset="math": "data/math" unless set
    train_split: str = "train"
    eval_split: str = "test"
    # the held-out file's directory ("" = data_dir; dataset="math": "data/math500")
    eval_data_dir: str = ""
    # dataset="math": the MATH levels (1-5) of the training problems (SimpleRL-Zoo's)
    math_levels: tuple = (3, 4, 5)
    synthetic_warm_size: int = 5000  # "synthetic_split": warm-start problems (worked solutions)
    # training problems ("synthetic_split": the RL family, answer only)
    synthetic_train_size: int = 5000
    synthetic_eval_size: int = 200
    # keyword arguments of data.synthetic_problems / synthetic_split (checked only when dataset is
    # "synthetic" or "synthetic_split")
    synthetic_args: dict = field(default_factory=dict)
    # "synthetic_split": the seed of its three sets (None: seed), so seeds can share one
    data_seed: int | None = None
    # what a step does: "grpo"; "ppo" (PPO with a learned critic: GAE for the group baseline, the
    # critic's clipped value loss; the keys below); or a baseline with the same rows and completions
    # per step: "rft" (sample as GRPO does, SFT on the correct samples), "sft_answers" (SFT on the
    # training rows: with "synthetic_split" their answers alone, "</think> <answer>N</answer>"),
    # "sft_more" (SFT on the warm-start rows: more warm start)
    method: str = setting("grpo", "grpo, ppo, or a baseline with GRPO's rows and completions per "
                          "step: rft, sft_answers, sft_more", one_of(METHODS))
    # sampling
    group_size: int = 8  # G completions per question
    prompts_per_step: int = 32
    max_new_tokens: int = 512
    # > 0; log-probs for the ratio use the same temperature (no top-p/top-k: on-policy)
    temperature: float = 1.0
    # rewards, then the post-sampling stage (rollout.SHAPING)
    # {reward: weight}, the total is the weighted sum; a reward is "correctness", "format",
    # "FILE.py:FUNCTION", "model:NAME[:LABEL]" (a reward model) or "judge:NAME" (an LLM judge): see
    # reward_models.py
    reward_weights: dict = field(default_factory=lambda: {"correctness": 1.0, "format": 0.1})
    # how correctness reads and compares answers (answers.ANSWER_CHECKERS): "gsm8k" (numbers:
    # answers.is_equiv) or "math" (LaTeX: math_answers.is_equiv_math, answers in the answer tag,
    # \boxed{} or "the answer is"); "auto" = "math" for dataset="math", else "gsm8k"
    answer_checker: str = setting("auto", "how correctness reads and compares answers (above)",
                                  one_of(("auto", *ANSWER_CHECKERS)))
    # a control: correctness replaced by a coin landing 1 with this probability, independent of the
    # answer (0 = off; rollout.random_reward); the logged accuracy stays the true one
    random_reward: float = 0.0
    # DAPO's soft overlong punishment (rollout.overlong_penalty): 0 = off; else the last N of
    # max_new_tokens cost up to overlong_penalty_factor of reward, linearly
    overlong_buffer_len: int = 0
    overlong_penalty_factor: float = 1.0
    # DAPO: drop groups whose rewards are all equal and draw more questions
    dynamic_sampling: bool = False
    # dynamic sampling's cap: draws of prompts_per_step questions per step, the first included; a
    # batch still short then is filled up with dropped groups (rollout.dynamic_groups)
    max_num_gen_batches: int = 4
    # the loss's, the advantages' and PPO's critic's keys are declared in grpo.py (LossSettings,
    # AdvantageSettings, CriticSettings), each beside the part that reads it; TrainConfig inherits
    # them
    # "outcome" (an advantage per completion) | "process" (per token, arithmetic) | "both"
    supervision: str = setting("outcome", "outcome (an advantage per completion), process (per "
                               "token, arithmetic claims) or both", one_of(SUPERVISIONS))
    # "both": advantage = outcome advantage + process_weight * process advantage
    process_weight: float = setting(1.0, "both: the outcome advantage + this times the process "
                                    "advantage", AT_LEAST_0)
    # optimizer steps per batch of samples; > 1 computes old log-probs once before the first
    mu: int = 1
    # iterative GRPO: copy the policy into the reference every N steps (0 = never)
    ref_reset_every: int = 0
    # TR-DPO's reference (arXiv:2404.09656; TRL's names): pi_ref = alpha pi_theta + (1 - alpha)
    # pi_ref every tau steps
    sync_ref_model: bool = setting(
        False, "pull the reference toward the policy every tau steps (needs beta > 0, no LoRA)",
        needs=Rule(lambda v, s: not v or (s.beta > 0 and s.lora_rank == 0 and not s.ref_reset_every
                                          and s.method in ("grpo", "ppo")),
                   "beta > 0 and method 'grpo' or 'ppo', no ref_reset_every, and no LoRA: the "
                   "reference's sync (TR-DPO) pulls a frozen reference copy toward the policy, "
                   "and with LoRA the reference is the policy with its adapters off, no copy of "
                   "its own (merging a share of the adapters into the base weights would move the "
                   "policy as well)"))
    ref_model_mixup_alpha: float = setting(0.6, "TR-DPO's alpha: the policy's share of the new "
                                           "reference", within(0, 1, "(]"))
    ref_model_sync_steps: int = setting(512, "TR-DPO's tau: the steps between two syncs",
                                        AT_LEAST_1)
    # LoRA (model.py): only low-rank adapters train; the reference is the same network with its
    # adapters off
    lora_rank: int = 0  # 0 = full fine-tuning
    lora_alpha: float = 16.0  # the update is scaled by lora_alpha / lora_rank
    lora_dropout: float = 0.0
    lora_targets: tuple = ("q_proj", "k_proj", "v_proj", "o_proj")  # any of model.LORA_TARGETS
    # optimization
    max_steps: int = 200
    lr: float = 1e-6
    warmup_steps: int = 10  # the lr climbs linearly over these steps (the warm start's too)
    weight_decay: float = 0.0
    adam_betas: tuple = (0.9, 0.99)
    grad_clip: float = 1.0  # max global grad norm; 0 = no clipping
    # completions per forward/backward; the loss normalisers are whole-batch
    micro_batch_size: int = 16
    # completion tokens per lm_head + log_softmax chunk (bounds the logits memory)
    logprob_chunk: int = 2048
    # recompute each layer's activations in the backward instead of holding them: None chooses at
    # set-up (on a GPU on only where the update would not fit without it, said in the output:
    # run_management.grad_checkpointing_of; elsewhere off); True is the lean setting
    grad_checkpointing: bool | None = None
    # supervised warm start (the SFT stage of the R1 pipeline): worked solutions as
    # "...</think> <answer>N</answer>"
    sft_steps: int = 0
    sft_batch_size: int = 32
    sft_lr: float = 1e-4
    # the warm start's learning rate falls linearly to 0 over its steps (after the warm-up); False:
    # constant. A decayed warm start settles on its data's rates (configs/demo_aha.py)
    sft_lr_decay: bool = False
    sft_rows_per_pass: int = setting(
        0, "SFT (the warm start, the rft/sft baselines): 0 = the update's micro-batches (prompts "
        "left-padded, a dense mask); n = n rows of a length a pass, right-padded, causal with no "
        "mask (faster on the CPU, sums in another order: sft.causal_passes)", AT_LEAST_0)
    # a train.py checkpoint (e.g. out/x/sft.pt) to start from instead of running the warm start
    init_from: str = ""
    # save the warm start's progress to ckpt.pt every N steps (and when stopped)
    sft_checkpoint_every: int = 500
    # evaluation, logging, checkpoints
    # held-out pass@1 (greedy) before step 1, every N steps and at the end; 0 = never
    eval_every: int = 25
    eval_size: int = 500  # held-out questions used (the first N)
    eval_batch_size: int = 64
    sample_every: int = 10  # print and save a few completions every N steps; 0 = never
    # log keys on the progress bar
    progress_keys: tuple = ("reward", "accuracy", "response_length", "kl", "loss")
    # re-check phrases: reflect_rate (rewards.reflects) in the logs
    reflection_markers: tuple = REFLECTION_MARKERS
    checkpoint_every: int = 50  # and at the end; 0 = only at the end
    # False: no ckpt.pt, sft.pt or hf/ export at all (a throwaway run, e.g. the gsm8k_shapes part of
    # tools/bench.py --gpu_check): a stop or a crash then keeps nothing to resume from
    save_checkpoints: bool = True
    out_dir: str = "out/gsm8k"
    # log every record to Weights & Biases under this project ("" = off; pip install wandb)
    wandb_project: str = ""
    tensorboard: bool = False  # and/or to TensorBoard, out_dir/tb (pip install tensorboard)
    # continue out_dir/ckpt.pt; its config wins, only RESUMABLE keys may differ
    resume: bool = False
    overwrite: bool = False  # start again in an out_dir that holds a run, deleting that run's files
    # system
    seed: int = 1337
    device: str = setting("auto", "auto (cuda if available), cuda or cpu",
                          one_of(("auto", "cuda", "cpu")))
    dtype: str = setting("auto", "the forward passes' compute dtype: auto (bfloat16 on cuda, "
                         "float32 on cpu)", one_of(("auto", "bfloat16", "float32")))
    # under torchrun: "ddp" (replicas) | "fsdp" (FSDP2 shards weights, gradients, AdamW state)
    sharding: str = setting("ddp", "under torchrun: ddp (replicas) or fsdp (FSDP2 shards)",
                            one_of(("ddp", "fsdp")))
    # CPU threads of torch, 0 = its default; CPU sums depend on it, so pinning it pins the run
    threads: int = 0
    # the sampler replays each decode step as a CUDA graph; False: the plain eager loop (the same
    # tokens, slower). Tried on CUDA only; a capture that fails falls back to the eager loop alone
    cuda_graphs: bool = True
    # the sampler keeps its CUDA graphs, and the KV cache they read, from one rollout to the next
    # (later rollouts replay them, capturing nothing), the cache held through the update; False:
    # captured anew in each rollout, the cache freed. None chooses at set-up (kept where the run's
    # memory estimate with the cache held still fits, grad_checkpointing's choice unchanged:
    # run_management.keep_graphs_of)
    keep_graphs: bool | None = None
    # on CUDA, the sampler's fused Triton kernel draws the tokens; False: torch ops (other draws,
    # the same distribution). A kernel that fails to build or launch falls back to the torch ops
    fused_sampling: bool = True
    # on CUDA, the sampler's decode steps run the model's layers in fused Triton kernels
    # (kernels.decode_step: fused q/k/v and gate/up products, RoPE with the cache write, attention
    # over each row's real keys, add + RMSNorm, SiLU·mul); False: the model's torch forward (the
    # same function, other roundings). A kernel that fails to build or launch falls back to it
    fused_decode: bool = True

    @property
    def critic_rate(self) -> float:
        """PPO's critic's learning rate: critic_lr, or ten times lr."""
        return self.critic_lr or 10 * self.lr

    @property
    def warm_starts(self) -> bool:
        """This run begins with the supervised warm start (a new run; init_from starts from a
        checkpoint instead)."""
        return self.sft_steps > 0 and not self.init_from

    def __post_init__(self):
        hints = typing.get_type_hints(TrainConfig)
        for f in dataclasses.fields(self):
            setattr(self, f.name, checked_type(f.name, getattr(self, f.name), hints[f.name]))
        # the whole template, so that a checkpoint records it (a name alone could change meaning)
        try:
            self.template = template_dict(self.template)
        except (ValueError, TypeError) as error:
            raise ValueError(f"config: {error}") from None
        dataset_defaults(self)
        validate(self)


GSM8K_DIR = TrainConfig.data_dir  # data_dir's default, GSM8K's
# dataset="math": training (downloaded on first use), held out (shipped)
MATH_DIRS = ("data/math", "data/math500")
# keys a resumed run may change: they do not change what is computed, only how often or in what
# pieces (out_dir too: a run resumes wherever it now lies)
RESUMABLE = ("max_steps", "eval_every", "eval_batch_size", "sample_every", "checkpoint_every",
             "sft_checkpoint_every",
             "micro_batch_size", "logprob_chunk", "grad_checkpointing", "device", "dtype",
             "sharding", "resume",
             "overwrite", "out_dir", "wandb_project", "tensorboard", "cuda_graphs", "progress_keys",
             "reflection_markers")
def checked_type(key: str, value, hint):
    """value if it has the field's type (an int is a float, a list a tuple), else a ValueError
    naming the key."""
    kinds = typing.get_args(hint) or (hint,)
    if float in kinds and type(value) is int:
        return float(value)
    if tuple in kinds and type(value) is list:
        return tuple(value)
    if any(type(value) is kind for kind in kinds):
        return value
    names = " or ".join("None" if kind is type(None) else kind.__name__ for kind in kinds)
    raise ValueError(f"config key {key!r} expects {names}, got {value!r}")


def dataset_defaults(cfg: TrainConfig):
    """Keys whose default follows the dataset, resolved in place (config.json and checkpoints record
    the result): answer_checker "auto" is "math" for dataset="math", else "gsm8k"; dataset="math"
    reads MATH_DIRS unless the config names other directories."""
    if cfg.answer_checker == "auto":
        cfg.answer_checker = "math" if cfg.dataset == "math" else "gsm8k"
    if cfg.dataset == "math":
        cfg.data_dir = MATH_DIRS[0] if cfg.data_dir == GSM8K_DIR else cfg.data_dir
        cfg.eval_data_dir = cfg.eval_data_dir or MATH_DIRS[1]


def validate(cfg: TrainConfig):
    """Every setting checked before any work: a bad one stops the run here, not after the warm
    start. Each concept checks its own keys (grpo.check_settings, rewards.check_settings,
    data.check_settings, model.check_settings, template.Template.check); the checks here are ranges
    and what spans several concepts."""
    def need(ok: bool, message: str):
        if not ok:
            raise ValueError(f"config: {message}")
    try:  # each setting's own rule (settings.setting), then what spans several
        check(cfg)
    except ValueError as error:
        raise ValueError(f"config: {error}") from None
    for key in ("group_size", "prompts_per_step", "max_new_tokens", "mu", "micro_batch_size",
                "logprob_chunk", "eval_batch_size", "sft_batch_size", "synthetic_train_size",
                "synthetic_eval_size", "max_num_gen_batches"):
        need(getattr(cfg, key) >= 1, f"{key} must be >= 1, got {getattr(cfg, key)}")
    for key in ("max_steps", "warmup_steps", "sft_steps", "synthetic_warm_size", "eval_every",
                "eval_size", "sample_every", "checkpoint_every", "sft_checkpoint_every",
                "ref_reset_every", "weight_decay", "grad_clip", "threads", "overlong_buffer_len"):
        need(getattr(cfg, key) >= 0, f"{key} must be >= 0, got {getattr(cfg, key)}")
    need(cfg.temperature > 0,
         f"temperature must be > 0, got {cfg.temperature}: GRPO needs the log-probs of a "
         "sampling distribution (temperature 0 is greedy decoding)")
    need(cfg.lr > 0 and cfg.sft_lr > 0, f"lr and sft_lr must be > 0, got {cfg.lr} and {cfg.sft_lr}")
    need(len(cfg.adam_betas) == 2 and all(0 <= b < 1 for b in cfg.adam_betas),
         f"adam_betas must be two numbers in [0, 1), got {cfg.adam_betas}")
    need(cfg.eval_size >= 1 or cfg.eval_every == 0,
         "eval_size=0 with eval_every > 0: nothing to evaluate")
    need(not (cfg.resume and cfg.overwrite), "resume and overwrite exclude each other")
    need(cfg.save_checkpoints or not cfg.resume,
         "resume goes on from out_dir/ckpt.pt, and save_checkpoints=False writes none")
    need(cfg.lora_rank == 0 or cfg.ref_reset_every == 0,
         "ref_reset_every with LoRA is not supported: the reference is the base model with the "
         "adapters off")
    need(cfg.prompts_per_step % world_size() == 0,
         f"prompts_per_step={cfg.prompts_per_step} does not split over WORLD_SIZE={world_size()} "
         "ranks (each rank samples whole groups): make prompts_per_step a multiple of "
         f"{world_size()}, or run a number of processes that divides {cfg.prompts_per_step}")
    need(cfg.method == "grpo" or world_size() == 1,
         f"method={cfg.method!r} runs in one process only (its steps do not split over ranks); run "
         f"it without torchrun (WORLD_SIZE={world_size()})")
    need(cfg.out_dir.strip() != "", "out_dir is empty: name the run's directory, e.g. out/NAME")
    need(not cfg.init_from or cfg.resume or os.path.isfile(cfg.init_from),
         f"init_from={cfg.init_from!r}: no such file (a train.py checkpoint, e.g. "
         "out/demo_warm/sft.pt)")
    need(not cfg.wandb_project or installed("wandb"),
         "wandb_project asks for wandb, which is not installed: pip install wandb "
         "(WANDB_MODE=offline logs without a network)")
    need(not cfg.tensorboard or installed("tensorboard"),
         "tensorboard asks for tensorboard, which is not installed: pip install tensorboard")
    need(0 <= cfg.random_reward <= 1,
         f"random_reward must be a probability in [0, 1], got {cfg.random_reward}")
    need(not cfg.random_reward or (cfg.method == "grpo"
                                   and cfg.reward_weights.get("correctness", 0) > 0),
         "random_reward replaces the correctness reward of GRPO's samples, so it needs "
         f"method='grpo' and a correctness weight in reward_weights; got method={cfg.method!r}, "
         f"reward_weights={cfg.reward_weights}")
    need(cfg.overlong_buffer_len < cfg.max_new_tokens,
         f"overlong_buffer_len={cfg.overlong_buffer_len} must be below "
         f"max_new_tokens={cfg.max_new_tokens}: the penalty starts that many tokens before the "
         "limit")
    need(0 <= cfg.overlong_penalty_factor < math.inf,
         f"overlong_penalty_factor must be a finite number >= 0, got "
         f"{cfg.overlong_penalty_factor}")
    need(not cfg.dynamic_sampling or (cfg.method == "grpo" and cfg.supervision == "outcome"),
         "dynamic_sampling drops groups whose outcome rewards are all equal, which carry no "
         f"outcome advantage: it needs method='grpo' and supervision='outcome', got {cfg.method!r} "
         f"and {cfg.supervision!r}")
    need(all(isinstance(key, str) for key in cfg.progress_keys),
         f"progress_keys must be log keys (strings), got {cfg.progress_keys}")
    try:  # each concept owns its allowed values
        grpo.check_settings(cfg)  # the loss's and the advantages' knobs
        model.check_settings(cfg)  # model_args, LoRA, device and dtype
        data.check_settings(cfg)  # dataset, math_levels, synthetic_args
        template_of(cfg.template).check()  # a well-formed template ...
        # ... whose completions the rules read; reward_weights, answer_checker
        rewards.check_settings(cfg)
    except (ValueError, TypeError) as error:
        raise ValueError(f"config: {error}") from None


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def load_config(argv: list[str]) -> TrainConfig:
    """`[CONFIG.py ...] [--key=value ...]` -> TrainConfig. A config file is Python assigning
    variables (names starting with "_", modules, functions and classes are ignored); see the module
    docstring. A bad config raises a ValueError (a missing file: FileNotFoundError) that says what
    is wrong."""
    hints = typing.get_type_hints(TrainConfig)
    values = {}
    for arg in argv:
        if arg in ("-h", "--help"):
            print(help_text())
            raise SystemExit(0)
        if arg.startswith("--"):
            key, has_value, text = arg[2:].partition("=")
            value = parse_value(text, hints.get(key)) if has_value else True
            items = [(key, value)]
            source = "command line"
        elif os.path.isfile(arg):
            skipped = (types.ModuleType, types.FunctionType, type)
            variables = runpy.run_path(arg).items()
            items = [(k, v) for k, v in variables
                     if not k.startswith("_") and not isinstance(v, skipped)]
            source = arg
        else:
            raise FileNotFoundError(f"config file {arg} not found")
        for key, value in items:
            if key not in hints:
                close = difflib.get_close_matches(key, hints, n=1)
                raise ValueError(f"unknown config key {key!r} ({source})"
                                 + (f"; did you mean {close[0]!r}?" if close else ""))
            values[key] = value
    return TrainConfig(**values)


def help_text() -> str:
    """What `--help` prints: the module docstring, then every key with its default, and for a
    setting (settings.setting) its doc and rule."""
    keys = [help_line(f) for f in dataclasses.fields(TrainConfig)]
    return __doc__ + "\nConfig keys and their defaults:\n" + "\n".join(keys)


def parse_value(text: str, hint):
    if hint is str:
        return text
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)  # numbers, None, dicts, tuples, lists
    except (ValueError, SyntaxError):
        return text  # then checked_type names the key and the expected type
