"""
What a run keeps on disk and reads back: its out_dir (refuse to clobber a run, clear it on --overwrite, cut the
logs back on --resume), ckpt.pt written atomically, reading a checkpoint, init_from, and loading a model with its
tokenizer (train.py and eval.py alike).

ckpt.pt holds everything --resume needs: model, optimizer, reference, step, question order, config; sft.pt the
weights right after the warm start. Both are dicts of tensors and plain values, read with weights_only=True.
"""
import dataclasses
import glob
import hashlib
import json
import os
import shutil

import torch

from config import RESUMABLE, saved_config
from data import load_tokenizer
from distributed import gathered_to_rank0, rank
from model import ModelConfig, Transformer

RUN_FILES = ("config.json", "log.jsonl", "eval.jsonl", "samples.jsonl", "sft_log.jsonl", "heldout.jsonl", "ckpt.pt",
             "sft.pt", "curves.png", "hf")


def prepare_out_dir(cfg) -> dict | None:
    """Make out_dir ready: refuse to clobber a run, clear it on overwrite; on resume return ckpt.pt's state after
    checking that the config only changes RESUMABLE keys, and cut the logs back to its step."""
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    holds_run = any(os.path.exists(os.path.join(cfg.out_dir, name)) for name in ("ckpt.pt", "log.jsonl"))
    os.makedirs(cfg.out_dir, exist_ok=True)
    if not cfg.resume:
        if holds_run and not cfg.overwrite:
            raise FileExistsError(f"{cfg.out_dir} already holds a run: add --resume to continue it, --overwrite to "
                                  "delete it and start again, or choose another --out_dir")
        doomed = [os.path.join(cfg.out_dir, name) for name in RUN_FILES] + glob.glob(os.path.join(cfg.out_dir, "eval_*.jsonl"))
        for path in doomed if rank() == 0 else []:  # one process deletes
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
        return None
    state = read_checkpoint(ckpt_path)
    saved, now = saved_config(state["config"]), dataclasses.asdict(cfg)
    changed = [f"{k}={saved[k]!r} -> {now[k]!r}" for k in now if k in saved and saved[k] != now[k] and k not in RESUMABLE]
    if changed:
        raise ValueError(f"--resume keeps the settings {ckpt_path} was trained with, but this command changes "
                         f"{', '.join(changed)}; only {', '.join(RESUMABLE)} may change on resume")
    for name in ("log.jsonl", "eval.jsonl", "samples.jsonl") if rank() == 0 else ():
        truncate_log(os.path.join(cfg.out_dir, name), state["step"])
    return state


def truncate_log(path: str, step: int):
    """Drop a log's lines after `step` (they are about to be redone), and a torn last line (a kill mid-write)."""
    if not os.path.isfile(path):
        return
    with open(path) as f:
        lines = f.readlines()
    kept = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number} is not valid JSON; fix or delete that line to resume") from None
        if record["step"] <= step:
            kept.append(line)
    with open(path, "w") as f:
        f.writelines(kept)


def fingerprint(rows: list[dict]) -> str:
    """sha256 of problem rows: a checkpoint records its warm-start set's, so init_from can compare sets."""
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def save_checkpoint(run, cfg, path: str, full: bool = True):
    """Write the run (full: everything --resume needs; else the weights eval.py needs) to path, atomically:
    a temporary file is renamed over the old one, so a crash mid-write keeps the previous checkpoint.
    Under torchrun every rank calls it and rank 0 writes whole tensors in the single-process layout (FSDP2 shards
    gathered), so a run resumes under any number of ranks and either sharding."""
    state = {"model": gathered_to_rank0(run.policy.state_dict()), "model_config": dataclasses.asdict(run.policy.config),
             "config": dataclasses.asdict(cfg), "step": run.step, "warm_set": run.warm_set}
    if full:
        optimizer = run.optimizer.state_dict()  # its per-weight dicts are the optimizer's own: gather copies
        optimizer["state"] = {i: gathered_to_rank0(dict(moments)) for i, moments in optimizer["state"].items()}
        state.update(optimizer=optimizer, stream=run.stream.state_dict(),
                     reference=run.reference.state_dict() if run.reference is not None else None)
    if rank() != 0:
        return
    if not all(torch.isfinite(t).all() for t in state["model"].values()):
        raise FloatingPointError(f"the weights are not finite after step {run.step}; {path} was not overwritten")
    tensors = [t for part in (state["model"], state.get("reference") or {}) for t in part.values()] + \
        [t for s in state.get("optimizer", {"state": {}})["state"].values() for t in s.values()]
    need = sum(t.numel() * t.element_size() for t in tensors)
    free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
    if need > free:
        raise OSError(f"{path} needs {need / 2**30:.2f} GiB but {free / 2**30:.2f} GiB is free there; free some "
                      f"space (the previous checkpoint, if any, is kept)")
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def read_checkpoint(path: str, device="cpu") -> dict:
    """A train.py checkpoint as a dict, or an error that names the file and what is wrong with it."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path} not found")
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as error:  # torch raises EOFError, UnpicklingError, RuntimeError... for damaged files
        raise ValueError(f"checkpoint {path} cannot be read ({type(error).__name__}: {error}); it is damaged or "
                         "not a train.py checkpoint") from None
    missing = {"model", "model_config", "config", "step"} - (set(state) if isinstance(state, dict) else set())
    if missing:
        raise ValueError(f"checkpoint {path} is not a train.py checkpoint: it lacks {sorted(missing)}")
    return state


def model_from_checkpoint(state: dict) -> Transformer:
    """The fp32 model saved in a train.py checkpoint dict, with its LoRA adapters if the run had them."""
    model, saved = Transformer(ModelConfig(**state["model_config"])), state["config"]
    if saved.get("lora_rank", 0) > 0:
        model.add_lora(saved["lora_rank"], saved["lora_alpha"], saved["lora_dropout"], tuple(saved["lora_targets"]))
    model.load_state_dict(state["model"])
    return model


def load_init_weights(policy: Transformer, path: str, warm: list[dict], check_warm_set: bool):
    """policy's weights := those of the train.py checkpoint at path, after checking it has the same shape and, with
    check_warm_set, that its run warm-started on this run's warm-start set `warm` (else it may hold held-out chains)."""
    state = read_checkpoint(path)
    theirs, ours = state["model_config"], dataclasses.asdict(policy.config)
    differ = [f"{key} {theirs.get(key)!r} (this run: {ours[key]!r})" for key in ours if theirs.get(key) != ours[key]]
    if differ:
        raise ValueError(f"init_from={path} holds a model of another shape: {', '.join(differ)}")
    if state["config"].get("lora_rank", 0) > 0:
        raise ValueError(f"init_from={path} was trained with LoRA adapters; start from a checkpoint without them")
    if check_warm_set and state.get("warm_set") != fingerprint(warm):
        raise ValueError(f"init_from={path} was warm-started on another set than this run's (another seed, "
                         "data_seed, synthetic_warm_size or warm-start family, or a checkpoint that does not record "
                         "its set): it may have seen this run's held-out chains; set data_seed to its run's seed")
    policy.load_state_dict(state["model"])


def tokenizer_of(model: str, tokenizer: str = "", gguf_file: str = ""):
    """The tokenizer of a run or an evaluation: the one named ("char", a Hugging Face name or dir), else the model's
    own (a GGUF file carries its own)."""
    return load_tokenizer(tokenizer) if tokenizer else load_tokenizer(model, gguf_file=gguf_file or None)


def load_model(name: str, dtype=torch.float32, tokenizer: str = "", gguf_file: str = ""):
    """(model, tokenizer, run config) from a train.py checkpoint (.pt) or a Hugging Face name/directory (with
    gguf_file: a GGUF file in it); the run config is the checkpoint's TrainConfig as a dict ({} for Hugging Face
    models): it supplies eval defaults. The model is on the CPU, in dtype."""
    if name.endswith(".pt"):
        state = read_checkpoint(name)
        run_config = saved_config(state["config"])
        return (model_from_checkpoint(state).to(dtype=dtype),
                tokenizer_of(run_config["model"], tokenizer or run_config["tokenizer"], run_config["gguf_file"]),
                run_config)
    return (Transformer.from_pretrained(name, dtype=dtype, gguf_file=gguf_file or None),
            tokenizer_of(name, tokenizer, gguf_file), {})
