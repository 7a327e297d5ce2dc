"""Rollout throughput: sample.generate against transformers' generate on the same random weights.

    python bench_sample.py --out bench_sample.json          # Qwen2.5-0.5B shapes, bf16, 256 x (128 + 512)

Both run the model with Qwen2.5-0.5B's shapes (speed does not depend on the weight values), sampling at T = 1
with stop tokens disabled, so every row decodes all its tokens. Reports new tokens/s end to end (prefill
included), the ratio, and the fraction of the memory-bandwidth bound: each decode step must read every weight
once plus the KV cache of the tokens so far, so the fastest possible run takes sum_steps bytes / bandwidth.
"""
import argparse
import json
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from model import ModelConfig, Transformer
from sample import generate


def build_models(device, dtype):
    """A random Qwen2ForCausalLM with ModelConfig's default (Qwen2.5-0.5B) shapes, and ours holding its weights."""
    c = ModelConfig()
    config = Qwen2Config(vocab_size=c.vocab_size, hidden_size=c.dim, num_hidden_layers=c.n_layers,
                         num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads,
                         intermediate_size=c.ffn_dim, max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps,
                         tie_word_embeddings=c.tie_embeddings, rope_parameters={"rope_type": "default",
                                                                                 "rope_theta": c.rope_theta})
    torch.manual_seed(0)
    with torch.device(device):
        hf = Qwen2ForCausalLM(config).to(dtype).eval()
    return hf, Transformer.from_hf_model(hf, dtype=dtype, device=device).eval()


def timed(fn, device):
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def bandwidth_bound_seconds(model, batch, prompt_len, new_tokens, bandwidth):
    """Weights + the KV cache of the real tokens so far, read once per decode step, at `bandwidth` B/s."""
    config, elem = model.config, model.lm_head.weight.element_size()
    weights = model.num_params() * elem
    kv_per_token = 2 * config.n_layers * config.n_kv_heads * config.head_dim * elem
    kv = sum(batch * (prompt_len + step) * kv_per_token for step in range(1, new_tokens))
    return ((new_tokens - 1) * weights + kv) / bandwidth


def profile_decode(model, prompts, new_tokens):
    """The top CUDA kernels of the eager decode loop (the graphs replay the same kernels)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        generate(model, prompts, new_tokens, seed=0, cuda_graphs=False)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=70))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--prompt_len", type=int, default=128)
    parser.add_argument("--new_tokens", type=int, default=512)
    parser.add_argument("--hf_new_tokens", type=int, default=128,
                        help="new tokens for transformers' generate (slow: 512 would take about a minute); 0 skips it")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bandwidth", type=float, default=3.35e12, help="HBM bytes/s (H100 SXM: 3.35e12)")
    parser.add_argument("--profile", action="store_true", help="also print the top kernels of a short eager run")
    parser.add_argument("--out", default="bench_sample.json", help="where to write the JSON result")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)

    hf, ours = build_models(device, dtype)
    prompts = torch.randint(0, ours.config.vocab_size, (args.batch, args.prompt_len), generator=torch.Generator().manual_seed(0))
    prompt_lists = prompts.tolist()
    generate(ours, prompt_lists, 2 * 128 + 1, seed=1)  # warm-up: kernels, cuBLAS handles, a few graph captures
    ours_s = timed(lambda: generate(ours, prompt_lists, args.new_tokens, seed=0), device)
    prefill_s = timed(lambda: generate(ours, prompt_lists, 1, seed=0), device)
    ideal_s = bandwidth_bound_seconds(ours, args.batch, args.prompt_len, args.new_tokens, args.bandwidth)
    result = {"batch": args.batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "dtype": args.dtype,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "ours_seconds": ours_s, "ours_prefill_seconds": prefill_s,
              "ours_tokens_per_s": args.batch * args.new_tokens / ours_s,
              "bandwidth": args.bandwidth, "bandwidth_bound_seconds": ideal_s, "bandwidth_fraction": ideal_s / ours_s}
    if args.hf_new_tokens:
        ids, mask = prompts.to(device), torch.ones_like(prompts, device=device)
        run_hf = lambda n: hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                       do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=0)
        with torch.inference_mode():
            run_hf(4)
            hf_s = timed(lambda: run_hf(args.hf_new_tokens), device)
        result.update(hf_new_tokens=args.hf_new_tokens, hf_seconds=hf_s,
                      hf_tokens_per_s=args.batch * args.hf_new_tokens / hf_s)
        result["speedup"] = result["ours_tokens_per_s"] / result["hf_tokens_per_s"]

    print(f"| sampler | new tokens/row | seconds | new tokens/s | vs HF | bandwidth-bound fraction |\n"
          f"|---|---|---|---|---|---|\n"
          f"| sample.generate | {args.new_tokens} | {ours_s:.2f} | {result['ours_tokens_per_s']:,.0f} | "
          f"{result.get('speedup', float('nan')):.1f}x | {result['bandwidth_fraction']:.2f} |")
    if args.hf_new_tokens:
        print(f"| transformers generate | {args.hf_new_tokens} | {hf_s:.2f} | {result['hf_tokens_per_s']:,.0f} | 1.0x | |")
        if args.hf_new_tokens < args.new_tokens:
            print(f"(transformers ran {args.hf_new_tokens} new tokens, not {args.new_tokens}, to keep it near a "
                  f"minute; its shorter cache favours it, so the ratio understates ours)")
    print(f"batch {args.batch}, prompts of {args.prompt_len}, {args.dtype} on {result['device']}; prefill alone "
          f"{prefill_s:.3f} s; bandwidth bound {ideal_s:.2f} s at {args.bandwidth:.3g} B/s")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    if args.profile:
        profile_decode(ours, prompt_lists, 64)


if __name__ == "__main__":
    main()
