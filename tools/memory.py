"""
The GPU memory a config needs, as train.py's preflight estimates it (run_management.memory_bytes: what the run holds,
then the larger of sampling and the update, at the longest prompt; activations aside), without a GPU or the weights;
for GRPO and, beside it, for PPO on the same config (method="ppo": its critic's weights, AdamW state and gradients).

    python tools/memory.py configs/gsm8k.py --model=Qwen/Qwen3-1.7B-Base    # the model's config.json and tokenizer
    python tools/memory.py configs/math.py --prompt_len=1740                  # at a given longest prompt, in tokens
    python tools/memory.py configs/gsm8k.py --hf_config=DIR/config.json --tokenizer=DIR    # offline, from files

The model's shape comes from --hf_config, else from its config.json (a local directory, the Hugging Face cache or
the hub: a few KB). The longest prompt is --prompt_len, else measured: every training and held-out prompt of the
config's data, in its template and tokenizer. The sampler is costed in bf16 (dtype "auto" on a GPU).
"""
import argparse
import copy
import dataclasses
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the library's modules, from tools/
from checkpoint import tokenizer_of  # noqa: E402
from config import load_config  # noqa: E402
from data import load_problems  # noqa: E402
from model import ModelConfig  # noqa: E402
from run_management import memory_bytes, memory_estimate, model_config  # noqa: E402
from template import encode_prompt, template_of  # noqa: E402


def longest_prompt(cfg) -> int:
    """The longest prompt, in tokens, of every training, warm-start and held-out row the config names."""
    tokenizer, template = tokenizer_of(cfg.model, cfg.tokenizer, cfg.gguf_file), template_of(cfg.template)
    return max(len(encode_prompt(tokenizer, row["question"], template)) for rows in load_problems(cfg) for row in rows)


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf_config", default="", help="a model's config.json (default: the config's model's)")
    parser.add_argument("--prompt_len", type=int, default=0, help="the longest prompt, tokens (default: measured)")
    args, train_args = parser.parse_known_args(argv)
    cfg = load_config(train_args)
    cfg = dataclasses.replace(cfg, dtype="bfloat16" if cfg.dtype == "auto" else cfg.dtype, out_dir="out/memory")
    if args.hf_config:
        with open(args.hf_config) as f:
            config = ModelConfig.from_hf(json.load(f))
    else:
        config = model_config(cfg, len(tokenizer_of(cfg.model, cfg.tokenizer, cfg.gguf_file)))
    prompt_len = args.prompt_len or longest_prompt(cfg)
    shape = f" (its shape: {args.hf_config})" if args.hf_config else ""
    lines = [f"{cfg.model}{shape} at prompts of up to {prompt_len} tokens:"]
    for method in ("grpo", "ppo"):
        variant = copy.copy(cfg)  # the same settings, another method (its own checks aside)
        variant.method = method
        lines.append(f"  {method}: {memory_estimate(memory_bytes(config, variant, prompt_len))}")
    print("\n".join(lines))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
