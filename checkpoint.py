"""
What a run keeps on disk and reads back: ckpt.pt written atomically, reading a checkpoint,
init_from, and loading a model with its tokenizer (train.py and eval.py alike); out_dir's own rules
are in run_management.py.

ckpt.pt holds everything --resume needs: model, optimizer, reference, step, question order, config
(PPO: its critic and the critic's optimizer);
sft.pt the weights right after the warm start. Both are dicts of tensors and plain values, read with
weights_only=True.
"""
import dataclasses
import hashlib
import json
import os
import shutil

import torch

from distributed import gathered_to_rank0, rank, shard_optimizer_state
from model import ModelConfig, Transformer
from template import load_tokenizer


def fingerprint(rows: list[dict]) -> str:
    """sha256 of problem rows: a checkpoint records its warm-start set's, so init_from can compare
    sets."""
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def save_checkpoint(run, cfg, path: str, full: bool = True):
    """Write the run (full: everything --resume needs; else the weights eval.py needs) to path,
    atomically (write_checkpoint). Under torchrun every rank calls it and rank 0 writes whole
    tensors in the single-process layout (FSDP2 shards gathered), so a run resumes under any number
    of ranks and either sharding. Nothing with save_checkpoints=False."""
    if not cfg.save_checkpoints:
        return
    state = {"model": gathered_to_rank0(run.policy.state_dict()),
             "model_config": dataclasses.asdict(run.policy.config),
             "config": dataclasses.asdict(cfg), "step": run.step, "warm_set": run.warm_set,
             "run_id": run.run_id}
    if full:
        # its per-weight dicts are the optimizer's own: gather copies
        optimizer = run.optimizer.state_dict()
        optimizer["state"] = {i: gathered_to_rank0(dict(moments))
                              for i, moments in optimizer["state"].items()}
        state.update(optimizer=optimizer, stream=run.stream.state_dict(),
                     reference=run.reference.state_dict() if run.reference is not None else None)
        if run.loss.state_dict():  # the loss's parts that keep state (an adaptive coefficient)
            state.update(loss=run.loss.state_dict())
        if run.critic is not None:  # PPO: the value model and its own optimizer
            state.update(critic=run.critic.state_dict(),
                         critic_optimizer=run.critic_optimizer.state_dict())
    if rank() == 0:
        write_checkpoint(state, path, f"step {run.step}")


def save_warm_start(policy, optimizer, cfg, warm_step: int, rng_state: tuple, warm_set: str,
                    run_id: str, path: str):
    """A checkpoint in the middle of the warm start (phase "warm_start"): its weights, its optimizer
    and the state of its batch order after warm_step steps; --resume goes on from there
    (sft.warm_start). RL's step is 0. Rank 0 writes (the warm start runs whole on every rank).
    Nothing with save_checkpoints=False."""
    if not cfg.save_checkpoints:
        return
    state = {"phase": "warm_start", "model": policy.state_dict(),
             "model_config": dataclasses.asdict(policy.config),
             "config": dataclasses.asdict(cfg), "step": 0, "warm_step": warm_step,
             "warm_rng": rng_state,
             "optimizer": optimizer.state_dict(), "warm_set": warm_set, "run_id": run_id}
    if rank() == 0:
        write_checkpoint(state, path, f"warm-start step {warm_step}")


def write_checkpoint(state: dict, path: str, what: str):
    """torch.save(state) to path, atomically: a temporary file is renamed over the old one, so a
    stop or a crash mid-write keeps the previous checkpoint; first the weights must be finite (what:
    the step, for the message) and the disk must have room, else an error that says so and keeps the
    previous file."""
    if not all(torch.isfinite(t).all() for t in state["model"].values()):
        raise FloatingPointError(f"the weights are not finite after {what}; {path} was not "
                                 "overwritten")
    tmp = path + ".tmp"
    # left by a kill mid-write: ours, and it must not count against the space
    if os.path.exists(tmp):
        os.remove(tmp)
    need = checkpoint_bytes(state)
    free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
    if need > free:
        raise OSError(f"disk full: {path} needs about {size(need)} but {size(free)} is free there; "
                      "free some space (the previous checkpoint, if any, is kept)")
    try:
        torch.save(state, tmp)
    except (OSError, RuntimeError) as error:
        # torch reports a full disk as "RuntimeError: ... iostream error"
        written = os.path.getsize(tmp) if os.path.exists(tmp) else 0
        if os.path.exists(tmp):
            os.remove(tmp)
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
        raise OSError(f"{'disk full: ' if free < need - written else ''}writing {path} failed "
                      f"after {size(written)} of about {size(need)}, with {size(free)} free there "
                      f"({type(error).__name__}: {error}); the partial file is removed and the "
                      "previous checkpoint, if any, is kept") from None
    os.replace(tmp, path)


def checkpoint_bytes(state: dict) -> int:
    """About how many bytes torch.save writes for state: its tensors, plus under 200 bytes a tensor
    of zip records (measured) and some KB of pickled config and data order."""
    weights = ("model", "reference", "critic")
    tensors = ([t for part in weights for t in (state.get(part) or {}).values()]
               + [t for name in ("optimizer", "critic_optimizer")
                  for s in state.get(name, {"state": {}})["state"].values() for t in s.values()])
    return sum(t.numel() * t.element_size() for t in tensors) + 4096 * len(tensors) + 2**20


def restore(run, state: dict):
    """Put a full checkpoint's training state into a freshly set-up run: step, optimizer (FSDP2:
    each rank keeps its shard), question order, reference, the loss's state, run id. The weights
    came in with the model (load_policy)."""
    run.step = state["step"]
    run.run_id = state.get("run_id") or run.run_id
    run.optimizer.load_state_dict(state["optimizer"])
    shard_optimizer_state(run.optimizer)
    run.stream.load_state_dict(state["stream"])
    if run.reference is not None:
        run.reference.load_state_dict(state["reference"])
    if "loss" in state:
        run.loss.load_state_dict(state["loss"])
    if run.critic is not None:
        run.critic.load_state_dict(state["critic"])
        run.critic_optimizer.load_state_dict(state["critic_optimizer"])


def size(nbytes: int) -> str:
    """A byte count for a message: GB above 1 GB, else MB (10^9, 10^6 bytes)."""
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.2f} MB"


def read_checkpoint(path: str, mmap: bool = False) -> dict:
    """A train.py checkpoint as a dict, or an error that names the file and what is wrong with it.
    mmap: its tensors stay in the file, read when used (eval.py and the export read the model alone,
    not the AdamW state that makes up three quarters of a 21.6 GB checkpoint at 1.5B)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path} not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as error:
        # torch raises EOFError, UnpicklingError, RuntimeError... for damaged files
        raise ValueError(f"checkpoint {path} cannot be read ({type(error).__name__}: {error}); it "
                         "is damaged or not a train.py checkpoint") from None
    missing = ({"model", "model_config", "config", "step"}
               - (set(state) if isinstance(state, dict) else set()))
    if missing:
        raise ValueError(f"checkpoint {path} is not a train.py checkpoint: it lacks "
                         f"{sorted(missing)}")
    return state


def model_from_checkpoint(state: dict) -> Transformer:
    """The fp32 model saved in a train.py checkpoint dict, with its LoRA adapters if the run had
    them: built on the meta device and given the checkpoint's tensors (no random init of weights
    about to be overwritten, no copy)."""
    config = ModelConfig(**state["model_config"])
    saved = state["config"]
    with torch.device("meta"):
        model = Transformer(config)
        # adapters come after the warm start
        if saved.get("lora_rank", 0) > 0 and state.get("phase") != "warm_start":
            model.add_lora(saved["lora_rank"], saved["lora_alpha"], saved["lora_dropout"],
                           tuple(saved["lora_targets"]))
    return model.assign_state(state["model"])


def load_init_weights(policy: Transformer, path: str, warm: list[dict], check_warm_set: bool):
    """policy's weights := those of the train.py checkpoint at path, after checking it has the same
    shape and, with check_warm_set, that its run warm-started on this run's warm-start set `warm`
    (else it may hold held-out chains)."""
    state = read_checkpoint(path)
    theirs = state["model_config"]
    ours = dataclasses.asdict(policy.config)
    differ = [f"{key} {theirs.get(key)!r} (this run: {ours[key]!r})" for key in ours
              if theirs.get(key) != ours[key]]
    if differ:
        raise ValueError(f"init_from={path} holds a model of another shape: {', '.join(differ)}")
    if state["config"].get("lora_rank", 0) > 0:
        raise ValueError(f"init_from={path} was trained with LoRA adapters; start from a "
                         "checkpoint without them")
    if check_warm_set and state.get("warm_set") != fingerprint(warm):
        raise ValueError(f"init_from={path} was warm-started on another set than this run's "
                         "(another seed, data_seed, synthetic_warm_size or warm-start family, or "
                         "a checkpoint that does not record its set): it may have seen this run's "
                         "held-out chains; set data_seed to its run's seed")
    policy.load_state_dict(state["model"])


def load_policy(cfg, state: dict | None, tokenizer) -> Transformer:
    """The fp32 policy a run starts from: a resumed run's checkpoint (state), a new model of shape
    cfg.model_args (model="scratch", seeded by cfg.seed), or a Hugging Face / GGUF checkpoint; its
    vocabulary must hold the tokenizer's."""
    if state is not None:
        policy = model_from_checkpoint(state)
    elif cfg.model == "scratch":
        torch.manual_seed(cfg.seed)
        policy = Transformer(ModelConfig(**{"vocab_size": len(tokenizer), **cfg.model_args}))
    else:
        policy = Transformer.from_pretrained(cfg.model, dtype=torch.float32,
                                             gguf_file=cfg.gguf_file or None)
    if policy.config.vocab_size < len(tokenizer):
        raise ValueError(f"the model's vocab_size {policy.config.vocab_size} is smaller than the "
                         f"tokenizer's {len(tokenizer)} tokens")
    return policy


def tokenizer_of(model: str, tokenizer: str = "", gguf_file: str = ""):
    """The tokenizer of a run or an evaluation: the one named ("char", a Hugging Face name or dir),
    else the model's own (a GGUF file carries its own)."""
    return (load_tokenizer(tokenizer) if tokenizer
            else load_tokenizer(model, gguf_file=gguf_file or None))


def export_hf(ckpt_path: str, directory: str, tokenizer):
    """The model of a checkpoint as a Hugging Face directory (config.json, model.safetensors, the
    tokenizer), for vLLM, lm-eval-harness, the hub; read from the checkpoint, whole even when
    training sharded it (FSDP2). Written to directory.tmp and renamed: a stop mid-export leaves no
    half directory under the real name, and doing it again (the same command with --resume) writes
    it whole."""
    tmp = directory.rstrip(os.sep) + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model_from_checkpoint(read_checkpoint(ckpt_path, mmap=True)).save_pretrained(tmp, tokenizer)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)


def load_model(name: str, dtype=torch.float32, tokenizer: str = "", gguf_file: str = ""):
    """(model, tokenizer, run config) from a train.py checkpoint (.pt) or a Hugging Face
    name/directory (with gguf_file: a GGUF file in it); the run config is the checkpoint's
    TrainConfig as a dict ({} for Hugging Face models): it supplies eval defaults. The model is on
    the CPU, in dtype."""
    if name.endswith(".pt"):
        state = read_checkpoint(name, mmap=True)
        run_config = state["config"]
        return (model_from_checkpoint(state).to(dtype=dtype),
                tokenizer_of(run_config["model"], tokenizer or run_config["tokenizer"],
                             run_config["gguf_file"]),
                run_config)
    return (Transformer.from_pretrained(name, dtype=dtype, gguf_file=gguf_file or None),
            tokenizer_of(name, tokenizer, gguf_file), {})
