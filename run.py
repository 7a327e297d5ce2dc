"""
A run: what it holds between steps (Run: the models, the optimizer, the loss, the data and its
order) and how it is set up (setup): a new run loads the data, the tokenizer and the model and does
the supervised warm start; a resumed one loads ckpt.pt (in the warm start's phase or RL's). Every
check runs before any work and before out_dir changes. train.py's loop runs the steps on it;
checkpoint.save_checkpoint saves it.
"""
import contextlib
import os
import typing
import uuid
from dataclasses import dataclass

import torch

from checkpoint import (fingerprint, load_init_weights, load_policy, restore, save_checkpoint,
                        tokenizer_of)
from config import TrainConfig
from data import load_problems
from distributed import broadcast_weights, from_every_rank, init_distributed, rank, sharded, spread
from grpo import Loss, loss_of
from model import Critic, Transformer, resolve_device, set_attention_backends
from reward_models import load_rewards
from rollout import QuestionStream, Sampling, Scoring, sampling_of
from run_management import (check_machine, check_out_dir, check_reachable, grad_checkpointing_of,
                            hub_names, keep_graphs_of, model_config, refusals, start_out_dir)
from sft import sft_target, warm_start
from template import Template, encode_prompt, template_of
from update import configure_optimizer


@dataclass
class Run:
    """What a run holds between steps; save_checkpoint() saves it and setup() rebuilds it."""
    policy: Transformer  # fp32 master weights, trained
    sampler: Transformer  # generates rollouts: the policy itself, or its bf16 copy on CUDA
    reference: Transformer | None  # frozen KL anchor (beta > 0 without LoRA)
    optimizer: torch.optim.Optimizer
    loss: Loss  # what the update minimises, built from the config's loss keys (grpo.loss_of)
    stream: QuestionStream  # the order of the training questions
    tokenizer: typing.Any
    template: Template  # the prompt and the tags (template.py)
    problems: list[dict]  # training problems {"question", "solution", "gold"}
    prompts: list[list[int]]  # their prompt token ids
    heldout: list[dict]
    autocast: typing.Any  # bf16 autocast on CUDA, a null context in fp32
    sampling: Sampling  # how rollouts sample (cfg's settings, the stop sequences)
    scoring: Scoring  # how they are scored (the template, the rewards' weights and functions)
    step: int = 0  # steps completed
    ddp: torch.nn.Module | None = None  # torchrun, sharding="ddp": the loss runs through it
    warm_set: str = ""  # the warm-start set's fingerprint (checkpoint.fingerprint)
    run_id: str = ""  # the run's own id (a resumed run goes on in the same wandb run)
    critic: Critic | None = None  # method="ppo": the value model, and its own optimizer
    critic_optimizer: torch.optim.Optimizer | None = None


def setup(cfg: TrainConfig, stop=None) -> Run | None:
    """Load data, tokenizer and model; a new run does the warm start, a resumed one loads ckpt.pt
    (in the warm start's phase or RL's). Every check runs before any work and before out_dir
    changes. None: `stop` was requested during the warm start."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    with refusals():  # a bad input, a missing file, a machine short of something: a few lines
        device, dtype = resolve_device(cfg.device, cfg.dtype)
        device = init_distributed(device)
        state = check_out_dir(cfg)
        template = template_of(cfg.template)
        check_reachable(hub_names(cfg))  # cached, or the hub answers: before a minute of retries
        tokenizer = tokenizer_of(cfg.model, cfg.tokenizer, cfg.gguf_file)
        warm, problems, heldout = load_problems(cfg)
        if cfg.method == "sft_more":  # the baseline that continues the warm start, on its family
            problems = warm
        def encode(rows):
            return [encode_prompt(tokenizer, row["question"], template) for row in rows]
        prompts = encode(problems)
        warming = cfg.warm_starts and (state is None or state.get("phase") == "warm_start")
        warm_prompts = [] if not warming else prompts if warm is problems else encode(warm)
        every_prompt = prompts + ([] if warm_prompts is prompts else warm_prompts) + encode(heldout)
        prompt_len = max(map(len, every_prompt))  # the longest: what memory is sized for
        check_machine(cfg, device, model_config(cfg, len(tokenizer)), prompt_len)
        rewards = load_rewards(cfg.reward_weights, device, dtype, cfg.micro_batch_size)
        policy = load_policy(cfg, state, tokenizer)
        policy.config.check_context(every_prompt, cfg.max_new_tokens)
        checkpointing, chosen = grad_checkpointing_of(cfg, device, policy.config, prompt_len)
        keep_graphs, kept = keep_graphs_of(cfg, device, policy.config, prompt_len, checkpointing)
        if state is None and cfg.init_from:
            load_init_weights(policy, cfg.init_from, warm, cfg.dataset == "synthetic_split")
        start_out_dir(cfg, state, heldout)  # all checked: clear an old run, or cut its logs
    set_attention_backends(device)  # on CUDA: no cuDNN attention, as eval.py and tools/bench.py
    # fp32 master weights and AdamW; bf16 forward passes under autocast (bf16 AdamW loses lr 1e-6)
    autocast = (torch.autocast(device.type, dtype=dtype) if dtype != torch.float32
                else contextlib.nullcontext())
    policy.to(device).grad_checkpointing = checkpointing
    for said in (chosen, kept):
        if said and rank() == 0:
            print(said, flush=True)
    run_id = (state or {}).get("run_id") or from_every_rank(uuid.uuid4().hex[:12])[0]
    if warm_prompts:  # the warm start; a saved one goes on where it stopped
        targets = [sft_target(tokenizer, p, template) for p in warm]
        done = warm_start(policy, warm_prompts, targets, cfg, tokenizer.pad_token_id, device,
                          autocast, state, stop, fingerprint(warm), run_id)
        if done < cfg.sft_steps:
            return None  # stopped by a signal: saved, and said how to go on
        state = None  # the warm start is done: RL starts as a new run does
    if state is None and cfg.lora_rank > 0:  # after the warm start: SFT trains every weight
        policy.add_lora(cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets)
    broadcast_weights(policy)  # torchrun: every rank starts from rank 0's weights
    one_model = dtype == torch.float32 and not sharded(cfg.sharding)  # the policy samples itself
    # the sampler: the policy itself, or its copy with fused projections (kernels.decode_step)
    sampler = policy if one_model else policy.frozen_copy(dtype).fuse_projections()
    with_reference = cfg.beta > 0 and cfg.lora_rank == 0 and cfg.method in ("grpo", "ppo")
    reference = policy.frozen_copy(dtype) if with_reference else None
    critic = Critic(policy) if cfg.method == "ppo" else None  # PPO: from the policy's weights
    ddp = spread(policy, cfg.sharding, device)  # torchrun: DDP replicas, or FSDP2 shards
    run = Run(policy=policy, sampler=sampler, reference=reference,
              optimizer=configure_optimizer(policy, cfg.lr, cfg.weight_decay, cfg.adam_betas),
              loss=loss_of(cfg),
              stream=QuestionStream(len(problems), cfg.seed), tokenizer=tokenizer,
              template=template, problems=problems, prompts=prompts, heldout=heldout,
              autocast=autocast, ddp=ddp, warm_set=fingerprint(warm), run_id=run_id, critic=critic,
              critic_optimizer=critic and configure_optimizer(critic, cfg.critic_rate,
                                                              cfg.weight_decay, cfg.adam_betas),
              sampling=sampling_of(tokenizer, template, cfg.max_new_tokens, cfg.temperature,
                                   cuda_graphs=cfg.cuda_graphs, keep_graphs=keep_graphs,
                                   fused_sampling=cfg.fused_sampling, fused_decode=cfg.fused_decode,
                                   checked=True),
              scoring=Scoring(template, cfg.reward_weights, cfg.answer_checker, rewards,
                              process=cfg.supervision != "outcome"))
    if state is not None:
        restore(run, state)
    else:  # RL's first resume point, before anything can fail (sft.pt first: ckpt.pt implies it)
        if cfg.warm_starts:  # eval.py can score the warm start alone after ckpt.pt moves on
            save_checkpoint(run, cfg, os.path.join(cfg.out_dir, "sft.pt"), full=False)
        save_checkpoint(run, cfg, os.path.join(cfg.out_dir, "ckpt.pt"))
    return run
