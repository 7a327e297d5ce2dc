"""
What a run keeps on disk and reads back: its out_dir (refuse to clobber a run, clear it on --overwrite, cut the
logs back on --resume), ckpt.pt written atomically, reading a checkpoint, init_from, and loading a model with its
tokenizer (train.py and eval.py alike).

ckpt.pt holds everything --resume needs: model, optimizer, reference, step, question order, config; sft.pt the
weights right after the warm start. Both are dicts of tensors and plain values, read with weights_only=True.
"""
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import socket
import sys

import torch

from config import RESUMABLE, saved_config
from data import load_tokenizer
from distributed import gathered_to_rank0, rank
from model import ModelConfig, Transformer

# what a run writes in out_dir; --overwrite deletes these, and eval_NNNNN.jsonl, and nothing else
RUN_FILES = ("config.json", "log.jsonl", "eval.jsonl", "samples.jsonl", "sft_log.jsonl", "heldout.jsonl", "ckpt.pt",
             "sft.pt", "ckpt.pt.tmp", "sft.pt.tmp", "curves.png", "hf", "ckpt_eval", "sft_eval", "tb", "wandb")
LOCK_FILE = "train.lock"  # there while a run holds out_dir (RunLock)
BEFORE_THE_WARM_START_ENDS = ("config.json", "heldout.jsonl", "sft_log.jsonl")  # a new run replaces these unasked


def is_eval_file(name: str) -> bool:
    """eval_00025.jsonl: a held-out evaluation's completions (train.held_out_eval)."""
    return name.startswith("eval_") and name.endswith(".jsonl") and name[5:-6].isdecimal()


class RunLock:
    """out_dir/train.lock, held for the life of a run (an flock, which the kernel releases on any exit, SIGKILL too):
    a second launch into the same out_dir refuses at once, naming the process that holds it. The holder's pid and
    command are written in the file, which a clean exit removes; a run that finds the file left by a process that
    is gone says so and takes over. Under torchrun rank 0 holds it. A directory the lock created and nothing else
    used is removed again."""

    def __init__(self, out_dir: str):
        self.out_dir, self.path, self.file, self.created = out_dir, os.path.join(out_dir, LOCK_FILE), None, False

    def __enter__(self):
        if rank() != 0:
            return self
        self.created = not os.path.isdir(self.out_dir)
        os.makedirs(self.out_dir, exist_ok=True)
        while self.file is None:
            file = open(self.path, "a+")
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                file.seek(0)
                holder = file.read().strip() or "another process"
                file.close()
                raise RuntimeError(f"{self.out_dir} is in use by a running train.py ({holder}); wait for it to "
                                   "finish, stop it, or choose another --out_dir") from None
            same = os.path.exists(self.path) and os.stat(self.path).st_ino == os.fstat(file.fileno()).st_ino
            if same:  # else its holder removed it between our open and our lock: open the path anew
                self.file = file
            else:
                file.close()
        self.file.seek(0)
        left = self.file.read().strip()
        if left:
            print(f"{self.path}: the run that held it ({left}) is gone without releasing it; taking over",
                  file=sys.stderr)
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"pid {os.getpid()} on {socket.gethostname()}: {' '.join(sys.argv)}")
        self.file.flush()
        return self

    def __exit__(self, *exc):
        if self.file is None:
            return
        os.remove(self.path)  # while still held: a run waiting on the old file sees it is gone and opens anew
        self.file.close()
        if self.created and not os.listdir(self.out_dir):  # a run refused before it wrote anything
            os.rmdir(self.out_dir)


def check_out_dir_path(cfg):
    """Refuse an out_dir that is a file, a filesystem root, the repository or the model's directory: a run writes its
    lock there first, and deletes its files there on --overwrite."""
    out_dir = os.path.realpath(cfg.out_dir)
    forbidden = {os.path.realpath(os.path.dirname(os.path.abspath(__file__))): "the repository itself"}
    if os.path.isdir(cfg.model):
        forbidden[os.path.realpath(cfg.model)] = "the model's directory"
    if os.path.exists(cfg.out_dir) and not os.path.isdir(cfg.out_dir):
        raise ValueError(f"out_dir={cfg.out_dir!r} is a file, not a directory")
    if os.path.dirname(out_dir) == out_dir or out_dir in forbidden:
        raise ValueError(f"out_dir={cfg.out_dir!r} is {forbidden.get(out_dir, 'a filesystem root')}: a run writes "
                         "and deletes its files there; choose a directory of its own, e.g. out/NAME")


def check_out_dir(cfg) -> dict | None:
    """Check what out_dir holds before anything is written or deleted: no files of a run it cannot prove is a
    train.py run (by its config.json); no other run unless --resume or --overwrite. Returns ckpt.pt's state on
    resume, after checking that the command changes only RESUMABLE keys and that max_steps lies ahead; else None."""
    present = sorted(os.listdir(cfg.out_dir)) if os.path.isdir(cfg.out_dir) else []
    ours = [name for name in present if name in RUN_FILES or is_eval_file(name)]
    if ours and not is_run_config(os.path.join(cfg.out_dir, "config.json")):
        raise ValueError(f"{cfg.out_dir} holds {', '.join(ours)} but no train.py config.json: not a run directory "
                         "(a model's or a dataset's?), so no run writes or deletes files there; choose another "
                         "--out_dir")
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    if not cfg.resume:
        inside = os.path.relpath(os.path.realpath(cfg.init_from), os.path.realpath(cfg.out_dir)).split(os.sep)[0]
        if cfg.init_from and (inside in RUN_FILES or is_eval_file(inside)):
            raise ValueError(f"init_from={cfg.init_from!r} lies in out_dir={cfg.out_dir!r}, whose run files a new run "
                             "deletes: copy it elsewhere, or choose another --out_dir")
        kept = [name for name in ours if name not in BEFORE_THE_WARM_START_ENDS]
        if kept and not cfg.overwrite:
            names = ", ".join(kept[:4]) + (f" and {len(kept) - 4} more" if len(kept) > 4 else "")
            raise FileExistsError(f"{cfg.out_dir} already holds a run ({names}): add --resume to continue it, "
                                  "--overwrite to delete it and start again, or choose another --out_dir")
        return None
    if "ckpt.pt" not in present:
        raise FileNotFoundError(f"--resume: {ckpt_path} not found (a run that stopped during its warm start saved "
                                "none); start it again with --overwrite")
    state = read_checkpoint(ckpt_path)
    saved, now = saved_config(state["config"]), dataclasses.asdict(cfg)
    changed = [f"{k}={saved[k]!r} -> {now[k]!r}" for k in now if k in saved and saved[k] != now[k] and k not in RESUMABLE]
    if changed:
        raise ValueError(f"--resume keeps the settings {ckpt_path} was trained with, but this command changes "
                         f"{', '.join(changed)}; only {', '.join(RESUMABLE)} may change on resume")
    if cfg.max_steps < state["step"]:
        raise ValueError(f"--resume: {ckpt_path} is at step {state['step']}, beyond max_steps={cfg.max_steps}: "
                         f"nothing to do (raise --max_steps to train on)")
    return state


def is_run_config(path: str) -> bool:
    """True if path is a config.json that train.py wrote (a TrainConfig's keys), not a model's."""
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and {"out_dir", "group_size", "max_steps", "seed"} <= set(config)


def start_out_dir(cfg, state: dict | None):
    """After every check has passed: a new run deletes an old run's files from out_dir (--overwrite; only the
    names train.py writes), a resumed one cuts its logs back to the checkpoint's step."""
    if rank() != 0:  # one process writes
        return
    if state is not None:
        for name in ("log.jsonl", "eval.jsonl", "samples.jsonl"):  # step 0's checkpoint precedes its evaluation
            truncate_log(os.path.join(cfg.out_dir, name), state["step"] - (name == "eval.jsonl" and state["step"] == 0))
        return
    os.makedirs(cfg.out_dir, exist_ok=True)
    ours = [name for name in os.listdir(cfg.out_dir) if name in RUN_FILES or is_eval_file(name)]
    for name in sorted(ours, key=lambda name: name == "config.json"):  # config.json last: a half-cleared directory
        path = os.path.join(cfg.out_dir, name)                          # stays recognisably a run's
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)


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
             "config": dataclasses.asdict(cfg), "step": run.step, "warm_set": run.warm_set, "run_id": run.run_id}
    if full:
        optimizer = run.optimizer.state_dict()  # its per-weight dicts are the optimizer's own: gather copies
        optimizer["state"] = {i: gathered_to_rank0(dict(moments)) for i, moments in optimizer["state"].items()}
        state.update(optimizer=optimizer, stream=run.stream.state_dict(),
                     reference=run.reference.state_dict() if run.reference is not None else None)
    if rank() != 0:
        return
    if not all(torch.isfinite(t).all() for t in state["model"].values()):
        raise FloatingPointError(f"the weights are not finite after step {run.step}; {path} was not overwritten")
    tmp = path + ".tmp"
    if os.path.exists(tmp):  # left by a kill mid-write: ours, and it must not count against the space
        os.remove(tmp)
    tensors = [t for part in (state["model"], state.get("reference") or {}) for t in part.values()] + \
        [t for s in state.get("optimizer", {"state": {}})["state"].values() for t in s.values()]
    # torch.save's zip records add under 200 bytes a tensor (measured), pickled config and data order some KB
    need = sum(t.numel() * t.element_size() for t in tensors) + 4096 * len(tensors) + 2**20
    free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
    if need > free:
        raise OSError(f"disk full: {path} needs about {size(need)} but {size(free)} is free there; free some space "
                      "(the previous checkpoint, if any, is kept)")
    try:
        torch.save(state, tmp)
    except (OSError, RuntimeError) as error:  # torch reports a full disk as "RuntimeError: ... iostream error"
        written = os.path.getsize(tmp) if os.path.exists(tmp) else 0
        if os.path.exists(tmp):
            os.remove(tmp)
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
        raise OSError(f"{'disk full: ' if free < need - written else ''}writing {path} failed after {size(written)} "
                      f"of about {size(need)}, with {size(free)} free there ({type(error).__name__}: {error}); the "
                      "partial file is removed and the previous checkpoint, if any, is kept") from None
    os.replace(tmp, path)


def size(nbytes: int) -> str:
    """A byte count for a message: GB above 1 GB, else MB (10^9, 10^6 bytes)."""
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.2f} MB"


def read_checkpoint(path: str) -> dict:
    """A train.py checkpoint as a dict, or an error that names the file and what is wrong with it."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path} not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
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
