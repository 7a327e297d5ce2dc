"""
Run management, kept out of the training loop's way: what makes a run safe to start, stop and start
again. train.py and eval.py call it around the research code, never inside a step (what a run
records is records.py's).

- Refusals: a bad input found by the checks before any work (the config, out_dir, the data files,
  the model, the machine) raises an error whose message says what is wrong and what to do; the
  command line prints it in a few lines without a traceback (refusals, command_line). An error
  anywhere else keeps its traceback.
- Preflight: what a run needs of the machine, before any long wait: the model's files (cached, or
  the hub reachable: check_reachable), a GPU for a config sized for one, GPU memory, disk for the
  checkpoints (check_machine).
- out_dir: one run at a time (RunLock), no run's files clobbered and no foreign file touched
  (check_out_dir), an old run's files deleted on --overwrite and the logs cut back to the checkpoint
  on --resume (start_out_dir).
- Stopping: Ctrl-C and SIGTERM stop after the current step and save (StopRequest); an exception in a
  step first saves the last complete step when it can (saved_on_failure); either way the message
  names what was saved and the command that goes on (resume_command). The requeue contract: `python
  train.py CONFIG --resume` continues from whatever the run saved, in any phase, and starts it from
  the beginning when it saved nothing yet.
"""
import contextlib
import dataclasses
import fcntl
import json
import os
import shlex
import shutil
import signal
import socket
import sys
import threading

import torch
import torch.distributed as dist
from tqdm import tqdm

from checkpoint import read_checkpoint, save_checkpoint, size
from config import RESUMABLE
from data import write_jsonl
from distributed import barrier, from_every_rank, rank, world_size
from update import optimizer_updates
from model import KVCache, ModelConfig, Transformer
from rewards import parse_reward_name
from sample import cache_slots, prefill_nbytes

# -----------------------------------------------------------------------------
# refusals: a bad input before any work


@contextlib.contextmanager
def refusals():
    """Inside: a ValueError, an OSError (a missing or malformed file, a full disk, no network, ...)
    or a RuntimeError (out_dir in use) is a refusal: marked, then raised on as it is (its type is
    kept, so callers catch it as before)."""
    try:
        yield
    except (ValueError, OSError, RuntimeError) as error:
        error.refused = True
        raise


def refused(error: BaseException) -> bool:
    """Whether error is a refusal (raised inside refusals()): its message is the whole story."""
    return getattr(error, "refused", False)


def command_line(name: str, main):
    """main() for a command line: its result, or a refusal's message printed as `name: message` with
    exit status 1. Before main(), on a machine with a GPU, the CUDA allocator's expandable segments
    (allocator_settings)."""
    said = allocator_settings(os.environ, torch.cuda.is_available())
    if said and os.environ.get("RANK", "0") == "0":
        print(f"{name}: {said}")
    try:
        return main()
    except Exception as error:
        if not refused(error):
            raise
        sys.exit(f"{name}: {error}")

# the variables the CUDA caching allocator reads its settings from (torch 2.13:
# c10/cuda/CUDAAllocatorConfig.h reads PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF, the newer
# name; c10/core/AllocatorConfig.h both), once, when the allocator first needs them: before the
# first CUDA tensor, not at `import torch`
ALLOCATOR_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
EXPANDABLE = "expandable_segments:True"


def allocator_settings(environ, cuda: bool) -> str:
    """On a machine with a GPU (cuda) where the user set neither ALLOCATOR_VARIABLES, set
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in environ (read by every torch since 2.1) and
    return the sentence saying so; else change nothing and return "". Expandable segments grow a
    segment in place instead of caching blocks of every size a step asks for: the reserved memory
    stays near the allocated (an 80 GB card's margin, RESERVED_PER_ALLOCATED). Called before any
    CUDA allocation (command_line); nothing on a CPU run changes."""
    if not cuda or any(name in environ for name in ALLOCATOR_VARIABLES):
        return ""
    environ["PYTORCH_CUDA_ALLOC_CONF"] = EXPANDABLE
    return (f"PYTORCH_CUDA_ALLOC_CONF={EXPANDABLE} (the CUDA allocator's setting, unset: "
            "reserved memory kept near the allocated; set PYTORCH_CUDA_ALLOC_CONF or "
            "PYTORCH_ALLOC_CONF to choose)")


# -----------------------------------------------------------------------------
# preflight: what a run needs of the machine


# a model this big trains at minutes per step on a CPU: a config sized for a GPU
CPU_PARAMS = 100_000_000
HUB_TIMEOUT = 3.0  # seconds to wait for the hub's address before calling the network absent


def hub_names(cfg) -> list[tuple[str, str, str]]:
    """(what, name, file) for each Hugging Face hub name a run loads (not a local path): its model
    (file: a file that loading needs, to find in the cache), tokenizer, and reward models or
    judges."""
    names = []
    if cfg.model != "scratch":
        names.append(("model", cfg.model, cfg.gguf_file or "config.json"))
    if cfg.tokenizer and cfg.tokenizer != "char":
        names.append(("tokenizer", cfg.tokenizer, "tokenizer_config.json"))
    for key in cfg.reward_weights:
        kind, target, _ = parse_reward_name(key)
        if kind in ("model", "judge"):
            names.append((f"reward {key!r}", target, "config.json"))
    return [(what, name, file) for what, name, file in names if is_hub_name(name)]


def is_hub_name(name: str) -> bool:
    """A Hugging Face repo id ("Qwen/Qwen2.5-0.5B", "gpt2"), not a path: no such file or directory
    here, nothing path-like about it (model.py loads a missing local path as no such directory)."""
    return not (os.path.exists(os.path.expanduser(name)) or name.startswith((os.sep, ".", "~"))
                or name.count("/") > 1)


def cached(name: str, file: str) -> bool:
    """Whether the Hugging Face cache holds file of the hub repo name."""
    from huggingface_hub import try_to_load_from_cache  # installed with transformers
    return isinstance(try_to_load_from_cache(name, file), str)


def hub_reachable() -> bool:
    """Whether the hub answers (its address is resolved and connected to within HUB_TIMEOUT
    seconds); False at once with HF_HUB_OFFLINE=1."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").partition("://")[2].partition("/")[0]
    try:
        socket.create_connection((host.partition(":")[0], 443), timeout=HUB_TIMEOUT).close()
        return True
    except OSError:
        return False


def check_reachable(names: list[tuple[str, str, str]], program: str = "train.py"):
    """An OSError that says how to get the files, when a hub name is not in the cache and the hub
    cannot be reached: before transformers retries for a minute and ends in a traceback."""
    missing = [(what, name) for what, name, file in names if not cached(name, file)]
    if not missing or hub_reachable():
        return
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    no_network = ("HF_HUB_OFFLINE=1 forbids the network" if offline
                  else "the hub cannot be reached (no network)")
    what, name = missing[0]
    raise OSError(
        f"{what} {name!r} is not in the Hugging Face cache "
        f"({os.environ.get('HF_HOME', '~/.cache/huggingface')}) and "
        f"{no_network}. "
        f"Either\n  - download it where there is network, `huggingface-cli download {name}`, and "
        f"copy the cache here (then HF_HUB_OFFLINE=1 keeps {program} offline), or\n  - give a "
        "local directory holding its files: "
        f"--{'model' if what == 'model' else 'tokenizer'}=LOCAL_DIR"
        + (f"\n  (also missing: {', '.join(n for _, n in missing[1:])})" if len(missing) > 1
           else ""))


def model_config(cfg, vocab_size: int) -> ModelConfig | None:
    """The shape of the model a run trains, read before its weights: model_args (scratch), or the
    config.json of a local directory or of the cache; None for a GGUF file (its shape comes with the
    weights) or a missing directory."""
    if cfg.model == "scratch":
        return ModelConfig(**{"vocab_size": vocab_size, **cfg.model_args})
    if cfg.gguf_file:
        return None
    path = os.path.join(cfg.model, "config.json")
    if not os.path.isfile(path):
        if not is_hub_name(cfg.model):
            return None  # a missing directory: loading the model names it
        # a few KB: the cache, or the reachable hub (check_reachable)
        from huggingface_hub import hf_hub_download
        path = hf_hub_download(cfg.model, "config.json")
    with open(path) as f:
        return ModelConfig.from_hf(json.load(f))


# memory_bytes' parts by phase
PHASES = {"sampling": ("KV cache", "prefill"), "the update": ("gradients", "logits chunk"),
          "the critic's update": ("critic gradients",)}
# the other parts are held through the whole run
PHASED = {name for names in PHASES.values() for name in names}
KEPT_CACHE = "KV cache (kept for CUDA graphs)"


def memory_bytes(config: ModelConfig, cfg, prompt_len: int) -> dict[str, int]:
    """What a run holds in accelerator memory at least, by part, in bytes: only what it cannot do
    without, so that a refusal never stops a run that would fit. Held throughout: the fp32 master
    weights (4 B/param), the AdamW state (8 B per trained param), the sampler's and the reference's
    bf16 copies (2 B/param each, when there are), and with keep_graphs the sampler's KV cache (kept
    between rollouts with the CUDA graphs captured on it: sample._kept). While sampling (PHASES):
    the KV cache otherwise, and the prefill (sample.prefill_nbytes), of the larger of a training
    step's rows and an evaluation's batch, at the longest prompt prompt_len. While updating: the
    gradients (4 B per trained param) and one chunk of logits. PPO (method="ppo") holds its
    critic too, a policy-sized fp32 model with its AdamW state, and its gradients while the critic
    updates (after the policy's are freed). Activations come on top (grad_checkpointing and
    micro_batch_size bound them); memory_gb in log.jsonl measures it all."""
    with torch.device("meta"):  # counted, not allocated
        model = Transformer(config)
        params = model.num_params()
        if cfg.lora_rank:
            model.add_lora(cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets)
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    low = cfg.dtype != "float32"  # the sampler and the reference are bf16 copies on a GPU
    sampler_dtype = torch.bfloat16 if low else torch.float32
    rows = max(cfg.prompts_per_step * cfg.group_size // world_size(), cfg.eval_batch_size)
    critic = params + config.dim + 1 if cfg.method == "ppo" else 0  # the policy's shape, a head
    return {"fp32 weights": 4 * params, "AdamW state": 8 * trained,
            "sampler copy": 2 * params if low else 0,
            "reference copy": (2 * params if low and cfg.beta > 0 and cfg.lora_rank == 0
                               and cfg.method in ("grpo", "ppo") else 0),
            "critic weights": 4 * critic, "critic AdamW state": 8 * critic,
            KEPT_CACHE if cfg.cuda_graphs and cfg.keep_graphs else "KV cache": KVCache.nbytes(
                config, rows, cache_slots(prompt_len, cfg.max_new_tokens), sampler_dtype),
            "prefill": prefill_nbytes(config, rows, prompt_len, sampler_dtype),
            "gradients": 4 * trained, "logits chunk": 2 * 4 * cfg.logprob_chunk * config.vocab_size,
            "critic gradients": 4 * critic}


def activation_bytes(config: ModelConfig, cfg, seq_len: int, checkpointing: bool) -> int:
    """An estimate of what the update's backward holds for one micro-batch, micro_batch_size rows
    of seq_len tokens, in bf16 (2 B an element; unmeasured on a GPU, where log.jsonl's memory_gb
    is the measure): per token and layer, what model.Block's forward saves: the two norms' inputs
    and outputs (4 dim), RoPE's two products (2 q + 2 kv), attention's query, keys, values and
    output (2 q + 2 kv: flash attention takes grouped heads, model.rolls_rows), o_proj's input (q)
    and the MLP's four (4 ffn_dim). With checkpointing each layer keeps its input (dim), and one
    layer at a time the rest, in its recompute."""
    q, kv = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    per_layer = 4 * config.dim + 5 * q + 4 * kv + 4 * config.ffn_dim  # elements a token
    tokens = cfg.micro_batch_size * seq_len
    if checkpointing:
        return 2 * tokens * (config.n_layers * config.dim + per_layer)
    return 2 * tokens * config.n_layers * per_layer


# what the CUDA caching allocator reserves per byte allocated, at the update's peak:
# configs/gsm8k.py's shapes (Qwen2.5-1.5B, 16 rows of 297 + 512 tokens, no checkpointing) on an
# H200 at e40cbdf: 72.6 GB allocated at the peak, 79.8 GB reserved (79.8 / 72.6 = 1.099;
# /work/shared/gpu_runs/2026-11-27-h200-e40cbdf/summary.md, without expandable_segments). The
# allocator's slack, and what neither estimate counts, come on top of what the run holds
RESERVED_PER_ALLOCATED = 1.10


def update_peak(config: ModelConfig, cfg, prompt_len: int,
                checkpointing: bool) -> tuple[int, int, float]:
    """What the run holds (memory_need), the update's activations under `checkpointing`
    (activation_bytes) and their sum at the allocator's measured reserve (RESERVED_PER_ALLOCATED),
    in bytes: what grad_checkpointing_of and keep_graphs_of hold against the free memory."""
    held = memory_need(memory_bytes(config, cfg, prompt_len))
    activations = activation_bytes(config, cfg, prompt_len + cfg.max_new_tokens, checkpointing)
    return held, activations, RESERVED_PER_ALLOCATED * (held + activations)


def grad_checkpointing_of(cfg, device: torch.device, config: ModelConfig,
                          prompt_len: int) -> tuple[bool, str]:
    """cfg.grad_checkpointing, or where the config leaves it unset (None) the choice, with a
    sentence saying it: on a GPU, on only where what the run holds (memory_need) and the update's
    activations without it (activation_bytes), times the allocator's measured reserve
    (RESERVED_PER_ALLOCATED), pass the free memory; elsewhere off."""
    if cfg.grad_checkpointing is not None or device.type != "cuda":
        return bool(cfg.grad_checkpointing), ""
    free = torch.cuda.mem_get_info(device)[0]
    held, activations, reserved = update_peak(config, cfg, prompt_len, checkpointing=False)
    on = reserved > free
    return on, (f"grad_checkpointing {'on' if on else 'off'} (unset, so chosen): the update's "
                f"activations without it, about {size(activations)} (an estimate, "
                f"run_management.activation_bytes), and the {size(held)} the run holds, "
                f"{size(reserved)} reserved at {RESERVED_PER_ALLOCATED:.2f}x (the allocator's "
                f"measured slack), {'pass' if on else 'fit in'} the {size(free)} free on "
                f"{device}; set grad_checkpointing to choose (True: the lean setting)")


def keep_graphs_of(cfg, device: torch.device, config: ModelConfig, prompt_len: int,
                   checkpointing: bool) -> tuple[bool, str]:
    """cfg.keep_graphs, or where the config leaves it unset (None) the choice, with a sentence
    saying it: on a GPU with cuda_graphs, on only where what the run holds with the KV cache kept
    (memory_need) and the update's activations (activation_bytes, under the checkpointing chosen),
    times the allocator's measured reserve, fit in the free memory; elsewhere off."""
    if cfg.keep_graphs is not None or device.type != "cuda" or not cfg.cuda_graphs:
        return bool(cfg.keep_graphs and cfg.cuda_graphs), ""
    free = torch.cuda.mem_get_info(device)[0]
    held, activations, reserved = update_peak(config, dataclasses.replace(cfg, keep_graphs=True),
                                              prompt_len, checkpointing)
    on = reserved <= free
    return on, (f"keep_graphs {'on' if on else 'off'} (unset, so chosen): the sampler's CUDA "
                f"graphs and KV cache kept between rollouts, {size(held)} held at least with the "
                f"update's activations of about {size(activations)}, {size(reserved)} reserved at "
                f"{RESERVED_PER_ALLOCATED:.2f}x, {'fit in' if on else 'pass'} the {size(free)} "
                f"free on {device}; set keep_graphs to choose")


def memory_need(parts: dict[str, int]) -> int:
    """The peak of memory_bytes' parts: what is held, and the larger of the two phases (they never
    overlap)."""
    phases = [sum(parts.get(name, 0) for name in names) for names in PHASES.values()]
    return sum(value for name, value in parts.items() if name not in PHASED) + max(phases)


def memory_estimate(parts: dict[str, int]) -> str:
    """memory_need(parts) in words, with its parts: held, and each phase's."""
    def listed(names):
        return ", ".join(f"{name} {size(parts[name])}" for name in names if parts.get(name))
    phases = [f"{phase}: {listed(names)}" for phase, names in PHASES.items()
              if any(parts.get(name) for name in names)]
    return (f"{size(memory_need(parts))} at least (held: "
            f"{listed([n for n in parts if n not in PHASED])}; then the "
            f"{'larger' if len(phases) == 2 else 'largest'} of {', and '.join(phases)})")


def check_machine(cfg, device: torch.device, config: ModelConfig | None, prompt_len: int,
                  program: str = "train.py"):
    """A config sized for a GPU on a machine without one, a GPU without room for what a run cannot
    do without (memory_bytes), or a disk without room for the run's checkpoints: an error saying
    what it needs and what to change."""
    if config is None:
        return
    parts = memory_bytes(config, cfg, prompt_len)
    need = memory_need(parts)
    params = parts["fp32 weights"] // 4
    estimate = memory_estimate(parts)
    if device.type == "cpu" and cfg.device == "auto" and params >= CPU_PARAMS:
        raise RuntimeError(
            f"{cfg.model} ({params / 1e9:.2f}B parameters) is sized for a GPU: a step needs "
            f"{estimate}, activations aside, and no CUDA device is here (torch.cuda.is_available() "
            "is False). Run it on a GPU; or pass --device=cpu to force a CPU run (minutes to "
            f"hours per step at this size); or try the offline demo, `python {program} "
            "configs/demo.py`")
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        if need > free:
            raise RuntimeError(
                f"{device} has {size(free)} free of {size(total)}, and this config needs "
                f"{estimate}, activations aside. Lower what takes most: prompts_per_step or "
                "group_size (the rows sampled at once: KV cache and prefill), max_new_tokens (the "
                "KV cache), eval_batch_size, shorter prompts (the prefill), beta=0 (no reference "
                "copy), lora_rank=16 (adapters alone train: no full gradients or AdamW state), "
                "logprob_chunk, or a smaller model; a run that starts and then runs out of memory "
                "in a step also wants micro_batch_size lower and grad_checkpointing=True")
    checkpoint = 4 * params + parts["AdamW state"] + parts["reference copy"]
    # old + new ckpt.pt, sft.pt, hf/
    disk = 2 * checkpoint + (4 * params if cfg.warm_starts else 0) + 4 * params
    disk *= cfg.save_checkpoints
    target = (cfg.out_dir if os.path.isdir(cfg.out_dir)
              else os.path.dirname(os.path.abspath(cfg.out_dir)))
    free = shutil.disk_usage(target).free
    if disk > free:
        raise OSError(f"disk too small: {cfg.out_dir} needs about {size(disk)} for this run's "
                      f"checkpoints (ckpt.pt {size(checkpoint)}, written beside the previous one, "
                      f"sft.pt and the hf/ export), and {size(free)} is free there; free some "
                      "space or choose another --out_dir")

# -----------------------------------------------------------------------------
# out_dir: one run at a time, no run's files clobbered


# what a run writes in out_dir; --overwrite deletes these, and eval_NNNNN.jsonl, and nothing else
RUN_FILES = ("config.json", "log.jsonl", "eval.jsonl", "samples.jsonl", "sft_log.jsonl",
             "heldout.jsonl", "ckpt.pt",
             "sft.pt", "ckpt.pt.tmp", "sft.pt.tmp", "curves.png", "hf", "hf.tmp", "ckpt_eval",
             "sft_eval", "tb", "wandb")
LOCK_FILE = "train.lock"  # there while a run holds out_dir (RunLock)
# a new run replaces these unasked
BEFORE_THE_WARM_START_ENDS = ("config.json", "heldout.jsonl", "sft_log.jsonl")


def is_eval_file(name: str) -> bool:
    """eval_00025.jsonl: a held-out evaluation's completions (train.held_out_eval)."""
    return name.startswith("eval_") and name.endswith(".jsonl") and name[5:-6].isdecimal()


class RunLock:
    """out_dir/train.lock, held for the life of a run (an flock, which the kernel releases on any
    exit, SIGKILL too): a second launch into the same out_dir refuses at once, naming the process
    that holds it. The holder's pid and command are written in the file, which a clean exit removes;
    a run that finds the file left by a process that is gone says so and takes over. Under torchrun
    rank 0 holds it. A directory the lock created and nothing else used is removed again. First
    out_dir itself is checked (check_out_dir_path; model: the run's model)."""

    def __init__(self, out_dir: str, model: str = ""):
        self.out_dir = out_dir
        self.path = os.path.join(out_dir, LOCK_FILE)
        self.file = None
        self.created = False
        self.model = model

    def __enter__(self):
        with refusals():
            check_out_dir_path(self.out_dir, self.model)
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
                with refusals():
                    raise RuntimeError(f"{self.out_dir} is in use by a running train.py "
                                       f"({holder}); wait for it to finish, stop it, or choose "
                                       "another --out_dir") from None
            same = (os.path.exists(self.path)
                    and os.stat(self.path).st_ino == os.fstat(file.fileno()).st_ino)
            if same:  # else its holder removed it between our open and our lock: open the path anew
                self.file = file
            else:
                file.close()
        self.file.seek(0)
        left = self.file.read().strip()
        if left:
            print(f"{self.path}: the run that held it ({left}) is gone without releasing it; "
                  "taking over",
                  file=sys.stderr)
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"pid {os.getpid()} on {socket.gethostname()}: {' '.join(sys.argv)}")
        self.file.flush()
        return self

    def __exit__(self, *exc):
        if self.file is None:
            return
        # while still held: a run waiting on the old file sees it is gone and opens anew
        os.remove(self.path)
        self.file.close()
        if self.created and not os.listdir(self.out_dir):  # a run refused before it wrote anything
            os.rmdir(self.out_dir)


def check_out_dir_path(out_dir: str, model: str = ""):
    """Refuse an out_dir that is a file, a filesystem root, the repository or the model's directory:
    a run writes its lock there first, and deletes its files there on --overwrite."""
    real = os.path.realpath(out_dir)
    forbidden = {os.path.realpath(os.path.dirname(os.path.abspath(__file__))): "the repository "
                                                                               "itself"}
    if os.path.isdir(model):
        forbidden[os.path.realpath(model)] = "the model's directory"
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"out_dir={out_dir!r} is a file, not a directory")
    if os.path.dirname(real) == real or real in forbidden:
        raise ValueError(f"out_dir={out_dir!r} is {forbidden.get(real, 'a filesystem root')}: a "
                         "run writes and deletes its files there; choose a directory of its own, "
                         "e.g. out/NAME")


def check_out_dir(cfg) -> dict | None:
    """Check what out_dir holds before anything is written or deleted: no files of a run it cannot
    prove is a train.py run (by its config.json); no other run unless --resume or --overwrite. With
    --resume, returns ckpt.pt's state (either phase: the warm start's or RL's), after checking that
    the command changes only RESUMABLE keys and that max_steps lies ahead; or, when the run saved
    nothing yet (no ckpt.pt, at most the files a run writes before its first save, of this very
    config), None: the run starts from the beginning. Else None."""
    present = sorted(os.listdir(cfg.out_dir)) if os.path.isdir(cfg.out_dir) else []
    ours = [name for name in present if name in RUN_FILES or is_eval_file(name)]
    if ours and not is_run_config(os.path.join(cfg.out_dir, "config.json")):
        raise ValueError(f"{cfg.out_dir} holds {', '.join(ours)} but no train.py config.json: not "
                         "a run directory (a model's or a dataset's?), so no run writes or "
                         "deletes files there; choose another --out_dir")
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    if cfg.resume and "ckpt.pt" in present:
        state = read_checkpoint(ckpt_path)
        check_same_run(cfg, state["config"], ckpt_path)
        if cfg.max_steps < state["step"]:
            raise ValueError(f"--resume: {ckpt_path} is at step {state['step']}, beyond "
                             f"max_steps={cfg.max_steps}: nothing to do (raise --max_steps to "
                             "train on)")
        return state
    kept = [name for name in ours if name not in BEFORE_THE_WARM_START_ENDS]
    names = ", ".join(kept[:4]) + (f" and {len(kept) - 4} more" if len(kept) > 4 else "")
    if cfg.resume and kept:
        raise FileNotFoundError(f"--resume: {ckpt_path} not found, yet {cfg.out_dir} holds a run's "
                                f"files ({names}); restore its ckpt.pt, or --overwrite to delete "
                                "them and start again")
    if cfg.resume and ours:  # the start of a run that saved nothing: this one's, or refused
        with open(os.path.join(cfg.out_dir, "config.json")) as f:
            check_same_run(cfg, json.load(f), os.path.join(cfg.out_dir, "config.json"))
    inside = os.path.relpath(os.path.realpath(cfg.init_from),
                             os.path.realpath(cfg.out_dir)).split(os.sep)[0]
    if cfg.init_from and (inside in RUN_FILES or is_eval_file(inside)):
        raise ValueError(f"init_from={cfg.init_from!r} lies in out_dir={cfg.out_dir!r}, whose run "
                         "files a new run deletes: copy it elsewhere, or choose another --out_dir")
    if kept and not cfg.overwrite:
        raise FileExistsError(f"{cfg.out_dir} already holds a run ({names}): add --resume to "
                              "continue it, --overwrite to delete it and start again, or choose "
                              "another --out_dir")
    return None


def check_same_run(cfg, saved: dict, path: str):
    """A ValueError unless this command's config equals the saved one (path's) in every key but
    RESUMABLE's, both as JSON has them (a config.json's tuples are lists), and the saved one has no
    key this code does not know (a key added since takes its default)."""
    now, saved = (json.loads(json.dumps(config)) for config in (dataclasses.asdict(cfg), saved))
    unknown = sorted(set(saved) - set(now))
    if unknown:
        raise ValueError(f"{path} was written by other code: its config has key(s) {unknown} that "
                         "this train.py does not know; resume it with the code that wrote it, or "
                         "start again")
    changed = [f"{k}={saved[k]!r} -> {now[k]!r}" for k in now
               if k in saved and saved[k] != now[k] and k not in RESUMABLE]
    if changed:
        raise ValueError(f"--resume keeps the settings {path} was written with, but this command "
                         f"changes {', '.join(changed)}; only {', '.join(RESUMABLE)} may change on "
                         "resume")


def is_run_config(path: str) -> bool:
    """True if path is a config.json that train.py wrote (a TrainConfig's keys), not a model's."""
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return (isinstance(config, dict)
            and {"out_dir", "group_size", "max_steps", "seed"} <= set(config))


def start_out_dir(cfg, state: dict | None, heldout: list[dict]):
    """After every check has passed: a new run deletes an old run's files from out_dir (--overwrite;
    only the names train.py writes), a resumed one cuts its logs back to the checkpoint's step (the
    warm start's log, in the middle of the warm start); then config.json (the resolved config) and
    heldout.jsonl (the held-out rows, what `python eval.py --data` re-scores) are written."""
    barrier()  # every rank has checked out_dir before one changes it
    if rank() != 0:  # one process writes
        return
    # the warm start's log back to its saved step
    if state is not None and state.get("phase") == "warm_start":
        truncate_log(os.path.join(cfg.out_dir, "sft_log.jsonl"), state["warm_step"])
    elif state is not None:
        # step 0's checkpoint precedes its evaluation
        for name in ("log.jsonl", "eval.jsonl", "samples.jsonl"):
            truncate_log(os.path.join(cfg.out_dir, name),
                         state["step"] - (name == "eval.jsonl" and state["step"] == 0))
    else:
        os.makedirs(cfg.out_dir, exist_ok=True)
        ours = [name for name in os.listdir(cfg.out_dir) if name in RUN_FILES or is_eval_file(name)]
        # config.json last: a half-cleared
        for name in sorted(ours, key=lambda name: name == "config.json"):
            # directory stays recognisably a run's
            path = os.path.join(cfg.out_dir, name)
            (shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path)
             else os.remove(path))
    write_jsonl(heldout, os.path.join(cfg.out_dir, "heldout.jsonl"))
    with open(os.path.join(cfg.out_dir, "config.json"), "w") as f:
        json.dump(dataclasses.asdict(cfg), f, indent=2)


def truncate_log(path: str, step: int):
    """Drop a log's lines after `step` (they are about to be redone), and a torn last line (a kill
    mid-write)."""
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
            raise ValueError(f"{path}:{number} is not valid JSON; fix or delete that line to "
                             "resume") from None
        if record["step"] <= step:
            kept.append(line)
    with open(path, "w") as f:
        f.writelines(kept)

# -----------------------------------------------------------------------------
# stopping: signals stop after a step; failures save the last good one


class StopRequest:
    """Ctrl-C (SIGINT) or SIGTERM (what Slurm, Kubernetes and most schedulers send before SIGKILL)
    asks the loop to stop after the current step and save; `requested` is then the signal's name. A
    second Ctrl-C stops at once, a second SIGTERM terminates."""
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self):
        self.requested = False
        self.previous = {}
        # signals can only be caught there
        if threading.current_thread() is threading.main_thread():
            self.previous = {signum: signal.signal(signum, self._handler)
                             for signum in self.SIGNALS}
        return self

    def _handler(self, signum, frame):
        self.requested = signal.Signals(signum).name
        signal.signal(signum, self.previous[signum])
        tqdm.write(f"{self.requested}: stopping after the current step"
                   + (" (Ctrl-C again to stop at once)" if signum == signal.SIGINT else ""))

    def agreed(self):
        """The signal any rank got (a collective: torchrun forwards a signal to every rank, maybe
        not within the same step, and any rank's request stops all), or False; kept in `requested`,
        so every rank reports it."""
        self.requested = next(filter(None, from_every_rank(self.requested)), False)
        return self.requested

    def __exit__(self, *exc):
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)


def resume_command() -> str:
    """The command that continues this run: this process's own, with --resume (and without
    --overwrite); under torchrun, train.py's part of it after torchrun's own options."""
    args = [arg for arg in sys.argv[1:]
            if arg.partition("=")[0] not in ("--resume", "--overwrite")] + ["--resume"]
    command = shlex.join(
        ["python", os.path.basename(sys.argv[0]) if sys.argv[0].endswith(".py") else "train.py",
         *args])
    return (f"torchrun [its options] {command.removeprefix('python ')}" if world_size() > 1
            else command)


def report_stop(signal_name: str, where: str, cfg):
    """Say that a signal stopped the run after `where` (a step), what holds it and how to go on
    (rank 0)."""
    if rank() != 0:
        return
    if not cfg.save_checkpoints:
        tqdm.write(f"{signal_name}: stopped after {where}; nothing was saved "
                   "(save_checkpoints=False)")
        return
    tqdm.write(f"{signal_name}: stopped after {where}; {os.path.join(cfg.out_dir, 'ckpt.pt')} "
               f"holds it. Continue with: {resume_command()}")


@contextlib.contextmanager
def saved_on_failure(run, cfg, step: int, path: str):
    """Around step `step`: if it raises, checkpoint the last complete step (run.step) to path when
    the weights are still its (no optimizer update of the failed step had begun), with the question
    order put back to where that step left it, so that --resume redoes the failed step; the error
    then says what was saved."""
    stream_state = run.stream.state_dict()
    updates = optimizer_updates(run.optimizer)
    try:
        yield
    except Exception as error:
        if not cfg.save_checkpoints:
            saved = "nothing is saved (save_checkpoints=False)"
        elif optimizer_updates(run.optimizer) != updates:
            saved = f"the step had updated the weights, so {path} keeps the last checkpoint written"
        elif dist.is_initialized() and cfg.sharding == "fsdp":
            # gathering the shards would wait for the other ranks
            saved = (f"under FSDP2 nothing is saved after a failure; {path} keeps the last "
                     "checkpoint written")
        else:
            run.stream.load_state_dict(stream_state)
            save_checkpoint(run, cfg, path)
            saved = (f"stopped before the update, so {path} keeps the last good weights, "
                     f"those of step {run.step}")
        if cfg.save_checkpoints:
            saved += f". Continue with: {resume_command()}"
        # the measured need: memory_gb, each step's peak in log.jsonl
        if isinstance(error, torch.OutOfMemoryError):
            saved += (". Out of memory in a step: lower micro_batch_size or set "
                      "grad_checkpointing=True (activations), "
                      "lower logprob_chunk (logits), prompts_per_step, group_size or "
                      "max_new_tokens (the KV cache)")
        if isinstance(error, FloatingPointError):  # its message names the step and what to change
            raise FloatingPointError(f"step {step}: {error}; {saved}") from None
        if rank() == 0:
            tqdm.write(f"step {step} failed ({type(error).__name__}: {error}); {saved}")
        raise
