"""
Where GRPO's time and memory go: the sampler and the whole step, against transformers and TRL in the same run.

    python bench.py                      # Qwen2.5-0.5B shapes, random weights, bf16 on the GPU
    python bench.py --shape 1.5b         # configs/gsm8k.py's Qwen2.5-1.5B shapes
    python bench.py --tiny               # a tiny random Qwen2 on the CPU in well under a minute (CI runs it)

1. Sampler: new tokens/s of sample.generate and of transformers' generate on the same weights (T = 1, stop tokens
   off, every row decodes all its tokens), and the fraction of the memory-bandwidth bound: each decode step must
   read every weight once plus the KV cache so far (GPU only; --bandwidth, or known for H100/H200).
2. GRPO step: train.py's own grpo_step on fixed-length prompts; seconds per phase (sample, reward, reference and
   old log-probs, update) and peak memory (CUDA allocator peak; on the CPU the process's peak RSS).
3. TRL: GRPOTrainer on the same model shape and workload, when trl is importable (see ../shared/peer/ for carrying
   its wheels to a GPU machine), and the ratios. Speed does not depend on weight values, so random weights are a
   fair stand-in for the real checkpoints.
"""
import argparse
import json
import math
import resource
import statistics
import tempfile
import time

import torch

from model import Transformer, resolve_device
from sample import generate
from config import TrainConfig
from data import QuestionStream
from train import Run, grpo_step

SHAPES = {  # Qwen2.5 shapes (config.json of each checkpoint); "tiny" is for the CPU
    "tiny": dict(vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=128),
    "0.5b": dict(vocab_size=151936, dim=896, n_layers=24, n_heads=14, n_kv_heads=2, head_dim=64, ffn_dim=4864),
    "1.5b": dict(vocab_size=151936, dim=1536, n_layers=28, n_heads=12, n_kv_heads=2, head_dim=128, ffn_dim=8960),
}
BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12}  # HBM bytes/s of the SXM parts
WORKLOADS = {  # sampler: rows x (prompt + new); step: prompts x G x new, prompt length, beta (the peer script's)
    "full": dict(rows=256, prompt_len=128, new_tokens=512, hf_new_tokens=128, prompts=32, group=8, step_new=256,
                 step_prompt_len=114, steps=4),
    "tiny": dict(rows=16, prompt_len=16, new_tokens=32, hf_new_tokens=32, prompts=4, group=4, step_new=16,
                 step_prompt_len=12, steps=3),
}


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


def hf_twin(shape: dict, device, dtype):
    """A random transformers Qwen2ForCausalLM of `shape` and our Transformer holding the same weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    config = Qwen2Config(vocab_size=shape["vocab_size"], hidden_size=shape["dim"], num_hidden_layers=shape["n_layers"],
                         num_attention_heads=shape["n_heads"], num_key_value_heads=shape["n_kv_heads"],
                         head_dim=shape["head_dim"], intermediate_size=shape["ffn_dim"], max_position_embeddings=32768,
                         tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    torch.manual_seed(0)
    with torch.device(device):
        hf = Qwen2ForCausalLM(config).to(dtype).eval()
    return hf, Transformer.from_hf_model(hf, dtype=dtype, device=device).eval()


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


def bandwidth_bound_seconds(model, rows, prompt_len, new_tokens, bandwidth) -> float:
    """Every weight plus the KV cache of the tokens so far, read once per decode step, at `bandwidth` B/s."""
    config, elem = model.config, model.lm_head.weight.element_size()
    kv_per_token = 2 * config.n_layers * config.n_kv_heads * config.head_dim * elem
    kv = sum(rows * (prompt_len + step) * kv_per_token for step in range(1, new_tokens))
    return ((new_tokens - 1) * model.num_params() * elem + kv) / bandwidth


def bench_sampler(hf, ours, work: dict, device, bandwidth) -> dict:
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, ours.config.vocab_size - 1, (work["rows"], work["prompt_len"]), generator=generator)
    as_lists, n = prompts.tolist(), work["new_tokens"]
    generate(ours, as_lists, min(n, 2 * 128 + 1), seed=1)  # warm-up: kernels, cuBLAS handles, graph captures
    ours_s = timed(lambda: generate(ours, as_lists, n, seed=0), device)
    ids, hf_n = prompts.to(device), work["hf_new_tokens"]
    with torch.inference_mode():
        run_hf = lambda k: hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=k,  # noqa: E731
                                       min_new_tokens=k, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                       pad_token_id=0)
        run_hf(4)
        hf_s = timed(lambda: run_hf(hf_n), device)
    result = {"ours_tokens_per_s": work["rows"] * n / ours_s, "hf_tokens_per_s": work["rows"] * hf_n / hf_s,
              "ours_seconds": ours_s, "hf_seconds": hf_s, "hf_new_tokens": hf_n}
    result["speedup_vs_hf"] = result["ours_tokens_per_s"] / result["hf_tokens_per_s"]
    if bandwidth:
        result["bandwidth_fraction"] = bandwidth_bound_seconds(ours, work["rows"], work["prompt_len"], n,
                                                               bandwidth) / ours_s
    return result


def micro_batch(work: dict) -> int:
    """Completions per forward/backward, the same for both sides: the peer anchor's 64, dividing the batch."""
    return math.gcd(work["prompts"] * work["group"], 64)


def bench_step(ours, work: dict, device, dtype, beta: float) -> dict:
    """train.grpo_step on `ours` (copied to fp32 master weights, as train.py keeps them), median over steps 2..."""
    tokenizer = IdTokenizer(ours.config.vocab_size)
    generator = torch.Generator().manual_seed(1)
    prompts = torch.randint(1, tokenizer.eos_token_id, (work["prompts"], work["step_prompt_len"]),
                            generator=generator).tolist()
    cfg = TrainConfig(model="bench", template="plain", group_size=work["group"], prompts_per_step=work["prompts"],
                      max_new_tokens=work["step_new"], beta=beta, micro_batch_size=micro_batch(work), lr=1e-6, warmup_steps=1,
                      device=device.type, dtype=str(dtype).removeprefix("torch."))
    policy = Transformer(ours.config).to(device)
    policy.load_state_dict(ours.state_dict())
    sampler = policy if dtype == torch.float32 else ours  # train.py's rule: fp32 samples itself, else a bf16 copy
    reference = None
    if beta > 0:
        reference = Transformer(ours.config).to(device, dtype).eval().requires_grad_(False)
        reference.load_state_dict(policy.state_dict())
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    run = Run(policy=policy, sampler=sampler, reference=reference, optimizer=policy.configure_optimizer(cfg.lr),
              stream=QuestionStream(len(prompts), 0), tokenizer=tokenizer,
              problems=[{"question": "", "solution": "", "gold": "7"}] * len(prompts), prompts=prompts, heldout=[],
              autocast=autocast)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    records = []
    for step in range(1, work["steps"] + 1):
        start = time.perf_counter()
        record, _ = grpo_step(run, cfg, step)
        records.append({**record, "time_step": time.perf_counter() - start})
    timed_records = records[1:] or records  # step 1 warms up kernels and the allocator
    phases = ("time_step", "time_sample", "time_reward", "time_reference", "time_update")
    return {**{p: statistics.median(r[p] for r in timed_records) for p in phases},
            "peak_memory_gib": peak_memory_gib(device), "steps_timed": len(timed_records),
            "response_length": statistics.fmean(r["response_length"] for r in records)}


def bench_trl(shape: dict, work: dict, device, dtype, beta: float) -> dict | None:
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
    micro = micro_batch(work)
    with tempfile.TemporaryDirectory() as directory:
        # TRL trains the weights in the checkpoint's dtype: bf16 on the GPU, as Qwen ships (ours keeps fp32 masters)
        hf, _ = hf_twin(shape, "cpu", dtype)
        hf.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        args = GRPOConfig(output_dir=directory + "/out", per_device_train_batch_size=micro,
                          gradient_accumulation_steps=rows // micro, num_generations=work["group"],
                          max_completion_length=work["step_new"], temperature=1.0, beta=beta, learning_rate=1e-6,
                          max_steps=work["steps"], use_cpu=device.type == "cpu", bf16=dtype == torch.bfloat16,
                          gradient_checkpointing=False, report_to=[], save_strategy="no", disable_tqdm=True)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        trainer = GRPOTrainer(model=directory, reward_funcs=reward, args=args, processing_class=tokenizer,
                              train_dataset=Dataset.from_dict({"prompt": prompts}), callbacks=[StepTimer()])
        trainer.train()
    return {"time_step": statistics.median(times[1:] or times), "peak_memory_gib": peak_memory_gib(device),
            "completions_per_step": [len(g) for g in generations],
            "response_length": statistics.fmean(n for g in generations for n in g)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
    parser.add_argument("--tiny", action="store_true", help="tiny shape and workload, on the CPU: a smoke test")
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--bandwidth", type=float, default=0.0, help="memory bytes/s (default: known for H100/H200)")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: sampler,step,trl")
    parser.add_argument("--out", default="", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    shape = SHAPES["tiny" if args.tiny else args.shape]
    work = WORKLOADS["tiny" if args.tiny else "full"]
    device, dtype = resolve_device("cpu" if args.tiny else "auto")
    skip = set(filter(None, args.skip.split(",")))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    bandwidth = args.bandwidth or next((b for key, b in BANDWIDTH.items() if key in name), 0.0)
    result = {"shape": "tiny" if args.tiny else args.shape, "device": name, "dtype": str(dtype), "torch": torch.__version__,
              "workload": work, "beta": args.beta}
    hf, ours = hf_twin(shape, device, dtype)
    if "sampler" not in skip:
        result["sampler"] = bench_sampler(hf, ours, work, device, bandwidth)
    del hf
    if "step" not in skip:
        result["step"] = bench_step(ours, work, device, dtype, args.beta)
    del ours  # TRL's peak memory must not count our weights
    if "trl" not in skip:
        result["trl"] = bench_trl(shape, work, device, dtype, args.beta)
    print(report(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return result


def report(result: dict) -> str:
    w = result["workload"]
    lines = [f"{result['shape']} shapes, {result['dtype']} on {result['device']}, torch {result['torch']}"]
    if "sampler" in result:
        s = result["sampler"]
        fraction = f"{s['bandwidth_fraction']:.2f}" if "bandwidth_fraction" in s else "n/a"
        lines += [f"\nsampler: {w['rows']} prompts x ({w['prompt_len']} + {w['new_tokens']}) tokens, T=1, no stops",
                  "| | new tokens/s | seconds | vs transformers | bandwidth-bound fraction |", "|---|---|---|---|---|",
                  f"| sample.generate | {s['ours_tokens_per_s']:,.0f} | {s['ours_seconds']:.2f} | "
                  f"{s['speedup_vs_hf']:.1f}x | {fraction} |",
                  f"| transformers generate ({s['hf_new_tokens']} new) | {s['hf_tokens_per_s']:,.0f} | "
                  f"{s['hf_seconds']:.2f} | 1.0x | |"]
    if "step" in result:
        s, trl = result["step"], result.get("trl")
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
    return "\n".join(lines)


if __name__ == "__main__":
    main()
