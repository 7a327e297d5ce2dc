"""A decoder-only transformer of the Qwen2 / Qwen3 / Llama family, written out by hand.

Covers Qwen2 / Qwen2.5 (q/k/v bias, GQA, RoPE, RMSNorm, SwiGLU, tied or untied head), Qwen3's dense
models (no bias; an RMSNorm over each head's query and key before RoPE; a head_dim of its own, not
hidden_size / heads) and Llama-shaped models (no bias; SmolLM2, Llama-3.x with "llama3" RoPE
scaling). Loads Hugging Face checkpoints (a local directory with config.json + safetensors, sharded
or not, a hub name, or a GGUF file).

Calling the model on ids [B, T] returns logits [B, T, vocab]. Incremental decoding: pass a KVCache
and `cache_index` (the cache slot of ids[:, 0]); the new keys/values are written at
slots cache_index .. cache_index+T-1 and each query attends to cache slots <= its own slot.
Ragged batches are left-padded: `attention_mask` [B, S] marks real key slots (S = T without a
cache, S = cache length with one; each row's real tokens contiguous) and positions default to the
count of real tokens before each one; the forward turns it once into the additive mask SDPA computes
with, which a caller may also pass ready ([B, 1, T, S], as the sampler's decode steps do). Without a
cache on CUDA in half precision it rolls each row past its padding instead and attends causally,
without a mask (rolls_rows). A multi-token call's grouped kv heads are broadcast by SDPA itself
where it can (flash attention on CUDA: no mask, half precision; and the CPU), else repeated to every
head (attention_kv): the math backend would hold fp32 scores, 37 GB at configs/math.py's longest
prefill.

LoRA: add_lora() freezes the weights and adds trainable low-rank adapters; adapters_disabled() gives
back the exact base model (the GRPO reference); save_pretrained() exports a Hugging Face checkpoint,
adapters folded in.

The contract: what the rest of the repo calls on a model, so that swapping in another one is this
checklist (an nn.Module; tests/test_model.py runs the sampler and the update's log-probs on a model
that offers only the first four items).
- model(ids, positions=, attention_mask=, cache=, cache_index=, return_hidden=True) -> the final
  normed hidden states [B, T, dim], as forward() above: the sampler's prefill and decode steps
  (sample.generate) and the update's log-probs (update.completion_logprobs) call it so; a decode
  step passes cache_index as a 0-d tensor (CUDA graphs replay it) and its additive mask ready;
  model(ids) -> logits [B, T, vocab].
- model.lm_head: hidden -> logits, applied a chunk at a time (grpo.py) or to the last position
  (sample.py); its weight's device and dtype are the model's.
- model.config: n_layers, n_heads, n_kv_heads, head_dim, dim, ffn_dim, vocab_size for the KV cache
  (KVCache: keys and values [n_layers, B, n_kv_heads, max_len, head_dim], written through
  cache.update(layer, k, v, slots)) and the memory estimates; check_context(prompts,
  max_new_tokens) refuses a prompt that would run past the model's positions.
- model.layers: the blocks, which FSDP shards one by one (distributed.spread).
- frozen_copy(dtype): the sampler's and the reference's copy; adapters_disabled(): the reference
  under LoRA; lora_merged(): the sampler's forward under LoRA; add_lora(rank, alpha, dropout).
- grad_checkpointing (a bool attribute), num_params(), from_pretrained, save_pretrained and
  state_dict / load_state_dict for checkpoints (checkpoint.py).
"""
import copy
import dataclasses
import json
import math
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import kernels

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")
HF_NAMES = {"embed_tokens": "embed", "self_attn": "attn", "input_layernorm": "attn_norm",
            # Hugging Face parameter-name parts -> this file's
            "post_attention_layernorm": "mlp_norm"}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
HALF = (torch.bfloat16, torch.float16)  # the dtypes flash attention takes


@dataclass
class ModelConfig:
    vocab_size: int = 151936
    dim: int = 896
    n_layers: int = 24
    n_heads: int = 14
    n_kv_heads: int = 2
    head_dim: int = 64
    ffn_dim: int = 4864
    max_seq_len: int = 32768
    rope_theta: float = 1000000.0
    # only {"rope_type": "llama3", ...} (Llama-3.1/3.2) is supported
    rope_scaling: dict | None = None
    norm_eps: float = 1e-6
    qkv_bias: bool = True  # Qwen2 has q/k/v biases, Qwen3 and Llama do not
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head's query and key, before RoPE
    tie_embeddings: bool = True

    def __post_init__(self):
        sizes = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
                 "max_seq_len")
        wrong = [f"{name}={getattr(self, name)!r}" for name in sizes
                 if type(getattr(self, name)) is not int or getattr(self, name) < 1]
        if wrong:
            raise ValueError(f"model sizes must be whole numbers >= 1, got {', '.join(wrong)}")
        if self.head_dim % 2 or not (self.rope_theta > 0 and self.norm_eps > 0):
            raise ValueError("need an even head_dim (RoPE rotates pairs), rope_theta > 0 and "
                             f"norm_eps > 0, got {self.head_dim}, {self.rope_theta}, "
                             f"{self.norm_eps}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of "
                             f"n_kv_heads={self.n_kv_heads}")
        if self.rope_scaling is not None and self.rope_scaling.get("rope_type") != "llama3":
            raise ValueError(f"unsupported rope_scaling {self.rope_scaling}: only rope_type "
                             "'llama3' is implemented")

    def check_context(self, prompts: list[list[int]], max_new_tokens: int):
        """A ValueError unless each prompt plus max_new_tokens fits the model's positions; it names
        the longest."""
        longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
        if len(prompts[longest]) + max_new_tokens > self.max_seq_len:
            raise ValueError(f"prompt #{longest} is {len(prompts[longest])} tokens; with "
                             f"max_new_tokens={max_new_tokens} that is "
                             f"{len(prompts[longest]) + max_new_tokens}, longer than the model's "
                             f"context of {self.max_seq_len} tokens: lower max_new_tokens or use "
                             "shorter prompts")

    @classmethod
    def from_hf(cls, hf: dict) -> "ModelConfig":
        """Translate a Hugging Face config.json dict; refuse anything that is not
        Qwen2/Llama-shaped."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                "model.py supports Qwen2/Qwen2.5 (model_type 'qwen2'), Qwen3's dense models "
                "(model_type 'qwen3') and Llama-family checkpoints (model_type 'llama': Llama, "
                f"SmolLM2); got model_type {model_type!r} (architectures "
                f"{hf.get('architectures')})")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r}: model.py implements "
                             "SwiGLU (silu)")
        sliding = (hf.get("use_sliding_window")
                   or any(kind != "full_attention" for kind in hf.get("layer_types") or []))
        if sliding or hf.get("attention_bias") or hf.get("mlp_bias"):
            raise ValueError("sliding-window attention, attention_bias (Llama, Qwen3) and "
                             "mlp_bias are not implemented")
        # transformers 5 / 4 layouts
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        n_heads = hf["num_attention_heads"]
        return cls(
            vocab_size=hf["vocab_size"], dim=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
            n_heads=n_heads, n_kv_heads=hf.get("num_key_value_heads") or n_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
                   ffn_dim=hf["intermediate_size"],
            max_seq_len=hf.get("max_position_embeddings", 32768), rope_theta=float(theta),
            rope_scaling=None if rope_type == "default" else {**rope, "rope_type": rope_type},
            norm_eps=hf.get("rms_norm_eps", 1e-6), qkv_bias=model_type == "qwen2",
                   qk_norm=model_type == "qwen3",
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)))

    def to_hf(self, dtype: torch.dtype) -> dict:
        """The config.json dict from which transformers builds this model (the inverse of from_hf).

        The rope keys use the transformers-4 layout (rope_theta, rope_scaling), which transformers 5
        and vLLM read too.
        """
        model_type = "qwen3" if self.qk_norm else "qwen2" if self.qkv_bias else "llama"
        architecture = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM",
                        "llama": "LlamaForCausalLM"}
        return {
            "architectures": [architecture[model_type]], "model_type": model_type,
                "vocab_size": self.vocab_size,
            "hidden_size": self.dim, "intermediate_size": self.ffn_dim,
                "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads, "num_key_value_heads": self.n_kv_heads,
                "head_dim": self.head_dim,
            "hidden_act": "silu", "max_position_embeddings": self.max_seq_len,
                "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling, "rms_norm_eps": self.norm_eps,
            "tie_word_embeddings": self.tie_embeddings,
                "torch_dtype": str(dtype).removeprefix("torch.")}


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim/2] in fp32, with Llama-3's long-context rescaling when
    configured."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    if config.rope_scaling is None:
        return inv_freq
    # llama3: divide low frequencies by `factor`, interpolate the band between
    s = config.rope_scaling
    low_wavelen = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wavelen = s["original_max_position_embeddings"] / s["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s["factor"], inv_freq)
    smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / (
        s["high_freq_factor"] - s["low_freq_factor"])
    smoothed = (1 - smooth) * scaled / s["factor"] + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; cos/sin [B, 1, T, D]: each head's two halves rotated (HF's layout)."""
    if kernels.fused_training(x):  # one kernel each way
        return kernels.Rope.apply(x, cos, sin)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def additive_mask(real: torch.Tensor, slots: torch.Tensor, dtype) -> torch.Tensor:
    """real [B, S], slots [T] -> [B, 1, T, S]: 0 where a query sees a key (real, causal; itself)."""
    key_slots = torch.arange(real.shape[1], device=real.device)
    causal = key_slots[None, :] <= slots[:, None]  # [T, S]
    seen = (causal & real.bool()[:, None]) | (key_slots[None, :] == slots[:, None])  # [B, T, S]
    return torch.where(seen, 0.0, float("-inf")).to(dtype)[:, None]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # the weight in x's dtype: under autocast, as its bf16 copy
        return F.rms_norm(x, self.weight.shape, self.weight.to(x.dtype), self.eps)


class KVCache:
    """Preallocated keys/values [n_layers, B, n_kv_heads, max_len, head_dim]; slots are written in
    place."""

    def __init__(self, config: ModelConfig, batch_size: int, max_len: int, device=None,
                 dtype=torch.float32):
        shape = (config.n_layers, batch_size, config.n_kv_heads, max_len, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len

    @staticmethod
    def nbytes(config: ModelConfig, batch_size: int, max_len: int, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        per_slot = config.n_layers * config.n_kv_heads * config.head_dim * elem
        return 2 * batch_size * max_len * per_slot  # keys and values

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor):
        """Write k/v [B, Hkv, T, D] at slots [T] -> this layer's whole cache (k, v)."""
        self.k[layer].index_copy_(2, slots, k)
        self.v[layer].index_copy_(2, slots, v)
        return self.k[layer], self.v[layer]


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.dim, config.n_heads * config.head_dim, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.dim, config.n_kv_heads * config.head_dim,
                                bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.dim, config.n_kv_heads * config.head_dim,
                                bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)
        if config.qk_norm:  # Qwen3
            self.q_norm = RMSNorm(config.head_dim, config.norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.norm_eps)

    def forward(self, x, cos, sin, mask, cache, slots):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):  # Qwen3: each head's q and k normed, in their dtype
            q, k = self.q_norm(q).to(q.dtype), self.k_norm(k).to(k.dtype)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        # q and k rotated at once: [B, H + Hkv, T, D]
        qk = apply_rope(torch.cat((q, k), dim=2).transpose(1, 2), cos, sin)
        q, k = qk.split((self.n_heads, self.n_kv_heads), dim=1)
        if cache is not None:
            k, v = cache.update(self.layer, k, v, slots)
        group = self.n_heads // self.n_kv_heads
        if T == 1 and group > 1:
            # a decode step: each kv head's queries folded in, no kv copy
            q = q.view(B, self.n_kv_heads, group, self.head_dim)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            y = y.reshape(B, self.n_heads, 1, self.head_dim)
        else:
            k, v, gqa = attention_kv(k, v, group, mask is not None, x.device.type)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                               enable_gqa=gqa)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


def attention_kv(k, v, group: int, masked: bool, device_type: str):
    """SDPA's k, v for T > 1, and whether it broadcasts kv heads itself (CUDA's flash attention)."""
    if group > 1 and device_type == "cuda" and (masked or k.dtype not in HALF):
        return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), False
    return k, v, group > 1


def rolls_rows(x: torch.Tensor) -> bool:
    """Whether a padded forward rolls its rows for unmasked flash attention (CUDA, half)."""
    return x.is_cuda and x.dtype in HALF


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.up_proj = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.down_proj = nn.Linear(config.ffn_dim, config.dim, bias=False)

    def forward(self, x):
        gate, up = self.gate_proj(x), self.up_proj(x)
        fused = kernels.fused_training(gate)  # one kernel each way
        return self.down_proj(kernels.SiluMul.apply(gate, up) if fused else F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(config.dim, config.norm_eps)
        self.attn = Attention(config, layer)
        self.mlp_norm = RMSNorm(config.dim, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, mask, cache=None, slots=None):
        y = self.attn(self.attn_norm(x), cos, sin, mask, cache, slots)
        if kernels.fused_training(x):  # add and norm: one kernel
            norm = self.mlp_norm
            x, normed = kernels.AddRMSNorm.apply(x, y, norm.weight.to(x.dtype), norm.eps)
            return x + self.mlp(normed)
        x = x + y
        return x + self.mlp(self.mlp_norm(x))


class LoRALinear(nn.Module):
    """nn.Linear plus a trainable low-rank update (LoRA): y = x W^T + b + (alpha / rank) *
    dropout(x) A^T B^T.

    Holds the very weight/bias Parameters of the Linear it replaces, under the same state_dict
    names, with lora_A [rank, in] and lora_B [out, rank] beside them. B starts at 0, so the output
    starts as the base's.
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float):
        super().__init__()
        self.weight, self.bias = base.weight, base.bias
        like = dict(device=base.weight.device, dtype=base.weight.dtype)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **like))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **like))
        # nn.Linear's own init, as the LoRA authors do
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scale = alpha / rank
        self.dropout = nn.Dropout(dropout)
        self.enabled = True  # False: exactly the base layer (the reference model)
        # W + delta, set by Transformer.merge_lora
        self.register_buffer("merged_weight", None, persistent=False)

    def delta(self) -> torch.Tensor:
        """The update to the weight, (alpha / rank) * B A [out, in]."""
        return self.scale * (self.lora_B @ self.lora_A)

    def forward(self, x):
        if not self.enabled:
            return F.linear(x, self.weight, self.bias)
        if self.merged_weight is not None:
            if torch.is_grad_enabled() and self.lora_A.requires_grad:
                raise RuntimeError("LoRA weights are merged (a snapshot for sampling): "
                                   "unmerge_lora() before training")
            return F.linear(x, self.merged_weight, self.bias)
        # the base product first: the backward sums the gradients in the order they were made
        base = F.linear(x, self.weight, self.bias)
        low_rank = F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B)
        return base + self.scale * low_rank


class Critic(nn.Module):
    """PPO's value model (method="ppo"): a transformer of the policy's shape whose final normed
    hidden state at each position a scalar head reads, the value of the prefix so far. Made from
    the policy (its weights: the warm start's, where there is one) with the head at zero, so that
    every value starts at 0; trained by its own optimizer (update.critic_update)."""

    def __init__(self, policy: "Transformer"):
        super().__init__()
        self.body = copy.deepcopy(policy)
        weight = policy.lm_head.weight
        self.value_head = nn.Linear(policy.config.dim, 1, device=weight.device, dtype=weight.dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)


def _fused(*parameters: nn.Parameter) -> torch.Tensor:
    """The parameters' values in one tensor, stacked along their first dimension; each parameter
    becomes a view of its rows."""
    whole = torch.cat([p.data for p in parameters])
    start = 0
    for p in parameters:
        p.data = whole[start:start + p.shape[0]]
        start += p.shape[0]
    return whole


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)
        # recompute each block in backward: trades ~30% time for activations
        self.grad_checkpointing = False
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def _apply(self, fn, recurse=True):
        # .to(bf16) would round the RoPE frequencies too: keep them fp32 wherever the model moves
        super()._apply(fn, recurse)
        self.inv_freq = rope_inv_freq(self.config).to(self.inv_freq.device)
        return self

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # parameters() counts a tied matrix once

    def add_lora(self, rank: int, alpha: float, dropout: float = 0.0,
                 targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj",
                                             "o_proj")) -> "Transformer":
        """Freeze every weight and wrap each `targets` projection of every block in a LoRALinear:
        the adapters (lora_A, lora_B; scale alpha / rank) are then the only trainable parameters.
        Returns self.

        Base weights keep their state_dict names, so a pretrained state_dict still loads after this
        (strict=False leaves the adapters as they are), and a checkpoint of this model loads
        strictly into one built by the same add_lora call.
        """
        if not targets or not set(targets) <= set(LORA_TARGETS):
            raise ValueError(f"LoRA targets must be a non-empty subset of {LORA_TARGETS}; got "
                             f"{targets}")
        if rank < 1 or alpha <= 0 or not 0 <= dropout < 1:
            raise ValueError(f"need LoRA rank >= 1, alpha > 0, 0 <= dropout < 1; got {rank}, "
                             f"{alpha}, {dropout}")
        if any(isinstance(m, LoRALinear) for m in self.modules()):
            raise ValueError("this model already has LoRA adapters")
        self.requires_grad_(False)
        for block in self.layers:
            for parent in (block.attn, block.mlp):
                for name in targets:
                    if hasattr(parent, name):
                        setattr(parent, name,
                                LoRALinear(getattr(parent, name), rank, alpha, dropout))
        return self

    def _lora_layers(self) -> list[LoRALinear]:
        layers = [m for m in self.modules() if isinstance(m, LoRALinear)]
        if not layers:
            raise ValueError("this model has no LoRA adapters: call add_lora first")
        return layers

    def frozen_copy(self, dtype) -> "Transformer":
        """A copy in dtype that never trains: the sampler's bf16 copy on GPU, the KL's reference
        model."""
        return copy.deepcopy(self).to(dtype=dtype).eval().requires_grad_(False)

    @torch.no_grad()
    def fuse_projections(self) -> "Transformer":
        """Keep each block's q/k/v projections (weights and biases), and its gate/up ones, in one
        tensor each (attn.qkv_weight, attn.qkv_bias, mlp.gate_up_weight), the layers' own weights
        views of it: the forward and the state_dict are unchanged, copy_weights writes through the
        views, and kernels.decode_step runs one matrix product per group. For the sampler's copy,
        on its device and in its dtype (moving the model afterwards would part the views from the
        fused tensors). Returns self."""
        for block in self.layers:
            attn, mlp = block.attn, block.mlp
            attn.qkv_weight = _fused(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)
            attn.qkv_bias = (_fused(attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias)
                             if attn.q_proj.bias is not None else None)
            mlp.gate_up_weight = _fused(mlp.gate_proj.weight, mlp.up_proj.weight)
        return self

    @contextmanager
    def adapters_disabled(self):
        """Inside `with model.adapters_disabled():` the forward is exactly the base model's, bit for
        bit (merged or not): the GRPO reference policy with no second copy of the weights."""
        layers = self._lora_layers()
        previous = [layer.enabled for layer in layers]
        for layer in layers:
            layer.enabled = False
        try:
            yield self
        finally:
            for layer, enabled in zip(layers, previous):
                layer.enabled = enabled

    @torch.no_grad()
    def merge_lora(self):
        """Keep W + alpha / rank * B A beside each adapted weight and run the forward on it: the
        same function at the plain model's cost, for sampling. Costs one extra copy of the adapted
        weights; the base weights are not touched (an in-place W += BA, W -= BA would move them by a
        rounding each cycle), so state_dict() and adapters_disabled() stay exact. The merged weights
        are a snapshot: unmerge_lora() before training again."""
        for layer in self._lora_layers():
            layer.merged_weight = layer.weight + layer.delta()

    def unmerge_lora(self):
        """Drop the merged weights: the forward adds the adapters again, so it follows their
        training."""
        for layer in self._lora_layers():
            layer.merged_weight = None

    @contextmanager
    def lora_merged(self):
        """`with model.lora_merged():` runs the forward on merged weights (merge_lora, then
        unmerge_lora): sampling at the plain model's cost, measured 1.15-1.34x faster than live
        adapters on CPU. A model without adapters is used as it is."""
        merge = any(isinstance(m, LoRALinear) for m in self.modules())
        if merge:
            self.merge_lora()
        try:
            yield self
        finally:
            if merge:
                self.unmerge_lora()

    @torch.no_grad()
    def merged_state_dict(self) -> dict:
        """This model's weights as a plain (LoRA-free) Transformer's state_dict, each adapter folded
        into its weight; the live model is not changed (folded weights are new tensors, the others
        are shared)."""
        state = {name: t for name, t in self.state_dict().items()
                 if not name.rsplit(".", 1)[-1].startswith("lora_")}
        for name, module in self.named_modules():
            if isinstance(module, LoRALinear):
                state[name + ".weight"] = module.weight + module.delta()
        return state

    def save_pretrained(self, out_dir: str, tokenizer=None):
        """Write a Hugging Face checkpoint that transformers' AutoModelForCausalLM (and
        from_pretrained here) loads: config.json (model_type qwen3 with q/k norms, qwen2 with q/k/v
        biases, else llama) and model.safetensors in the weights' dtype, LoRA adapters folded in
        (the live model is not changed); a tied head is stored once, as the embedding. config.json
        takes bos/eos/pad_token_id from `tokenizer` (null without one, not Llama's defaults), and
        the tokenizer's files are written beside the weights with its own save_pretrained (for
        template.CharTokenizer a marker file, which template.load_tokenizer reads back).
        """
        from safetensors.torch import save_file  # installed with transformers
        os.makedirs(out_dir, exist_ok=True)
        state = _to_hf_names(self.merged_state_dict(), self.config)
        weights = os.path.join(out_dir, "model.safetensors")
        save_file({name: t.contiguous().cpu() for name, t in state.items()}, weights,
                  metadata={"format": "pt"})
        if hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(out_dir)
        hf_config = self.config.to_hf(self.embed.weight.dtype)
        special_ids = ("bos_token_id", "eos_token_id", "pad_token_id")
        hf_config.update({key: getattr(tokenizer, key, None) for key in special_ids})
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(hf_config, f, indent=2)
        # safetensors writes 0600; the export's other files follow the umask
        shutil.copymode(f.name, weights)

    def forward(self, ids, positions=None, attention_mask=None, cache=None, cache_index=0,
                return_hidden=False):
        """ids [B, T] -> logits [B, T, vocab] (or hidden [B, T, dim]). attention_mask: [B, S] real
        key slots (S = T or cache.max_len), or additive_mask's. cache: written at cache_index."""
        B, T = ids.shape
        device = ids.device
        slots = torch.arange(T, device=device) + cache_index  # [T]
        if cache is not None and attention_mask is None:  # every slot up to the last
            attention_mask = torch.arange(cache.max_len, device=device) <= slots[-1]
        real = attention_mask if attention_mask is not None and attention_mask.dim() < 4 else None
        if positions is None:  # the real tokens from 0; with a cache the slots
            positions = slots.expand(B, T)
            if cache is None and real is not None:
                positions = (real.long().cumsum(-1) - 1).clamp(min=0)
        x = self.embed(ids)
        # the residual stream in the autocast dtype, as the sampler's
        if torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))
        mask = attention_mask  # None (causal), ready, or the real slots
        rows = None  # [B, T]: where a rolled row's token came from
        if real is not None and cache is None and rolls_rows(x):  # real tokens from slot 0: causal
            rows = (slots + real.long().argmax(-1, keepdim=True)) % T
            x = x.gather(1, rows[..., None].expand_as(x))
            positions = positions.gather(1, rows)
            mask = None
        elif real is not None:
            mask = additive_mask(real, slots, x.dtype)
        freqs = positions[..., None] * self.inv_freq  # [B, T, D/2] fp32, as checkpoints
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        checkpointed = self.grad_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.layers:
            x = (checkpoint(block, x, cos, sin, mask, use_reentrant=False) if checkpointed
                 else block(x, cos, sin, mask, cache, slots))
        x = self.norm(x)
        if rows is not None:  # rolled back
            x = torch.zeros_like(x).scatter(1, rows[..., None].expand_as(x), x)
        return x if return_hidden else self.lm_head(x)

    @classmethod
    def from_pretrained(cls, name_or_path: str, dtype=torch.float32, device=None,
                        gguf_file=None) -> "Transformer":
        """Load a Hugging Face Qwen2/Llama checkpoint: a local dir, a hub name, or `gguf_file` in
        that dir/repo."""
        if gguf_file is not None:
            # transformers dequantizes GGUF with the `gguf` package
            from transformers import AutoModelForCausalLM
            hf_model = AutoModelForCausalLM.from_pretrained(name_or_path, gguf_file=gguf_file,
                                                            dtype=torch.float32)
            return cls.from_hf_model(hf_model, dtype=dtype, device=device)
        if os.path.isdir(name_or_path):
            path = name_or_path
        elif name_or_path.startswith((os.sep, ".", "~")) or name_or_path.count("/") != 1:
            raise FileNotFoundError(f"model {name_or_path!r}: no such directory (and not a hub "
                                    "name like 'Qwen/Qwen2.5-0.5B')")
        else:
            path = _download(name_or_path)
        config_file = os.path.join(path, "config.json")
        if not os.path.isfile(config_file):
            raise FileNotFoundError(f"{config_file} not found: not a Hugging Face model directory")
        with open(config_file) as f:
            # validate the architecture before reading gigabytes
            config = ModelConfig.from_hf(json.load(f))
        return cls._from_state(config, _read_safetensors(path), dtype, device)

    @classmethod
    def from_hf_model(cls, hf_model, dtype=torch.float32, device=None) -> "Transformer":
        """Copy the weights of an in-memory transformers Qwen2ForCausalLM / LlamaForCausalLM."""
        return cls._from_state(ModelConfig.from_hf(hf_model.config.to_dict()),
                               hf_model.state_dict(), dtype, device)

    @classmethod
    def _from_state(cls, config: ModelConfig, hf_state: dict, dtype, device) -> "Transformer":
        with torch.device("meta"):  # no random init of weights that are about to be overwritten
            model = cls(config)
        return model.assign_state(_from_hf_names(hf_state, config)).to(device=device, dtype=dtype)

    def assign_state(self, state: dict) -> "Transformer":
        """A model built on the meta device takes state's tensors as its own (strict: every one
        named, no copy), its head tied again where the config ties it, and its RoPE frequencies made
        anew; returns self."""
        self.load_state_dict(state, strict=True, assign=True)
        if self.config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        # buffers are not in the checkpoint: leave the meta device
        self.inv_freq = rope_inv_freq(self.config)
        return self


def resolve_device(device: str = "auto", dtype: str = "auto") -> tuple[torch.device, torch.dtype]:
    """("auto" | "cuda" | "cpu", "auto" | "bfloat16" | "float32") -> (device, compute dtype); auto
    picks cuda when available, and bf16 on cuda, fp32 on cpu (bf16 matmuls are slow on most
    CPUs)."""
    if device not in ("auto", "cuda", "cpu") or dtype not in ("auto", "bfloat16", "float32"):
        raise ValueError("device must be auto|cuda|cpu and dtype auto|bfloat16|float32, got "
                         f"{device!r}, {dtype!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA device")
    resolved = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                            "cpu" if device == "auto" else device)
    if dtype == "auto":
        return resolved, torch.bfloat16 if resolved.type == "cuda" else torch.float32
    return resolved, getattr(torch, dtype)


def check_settings(cfg):
    """A ValueError naming the key unless the model a train.py config names can be built: model_args
    (ModelConfig's fields and sizes; vocab_size defaults to the tokenizer's) only for
    model="scratch", which needs a tokenizer; the LoRA settings; device and dtype."""
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    if set(cfg.model_args) - known:
        raise ValueError(f"model_args has unknown key(s) {sorted(set(cfg.model_args) - known)}; "
                         f"ModelConfig has {sorted(known)}")
    if cfg.model == "scratch":
        if not cfg.tokenizer:
            raise ValueError("model='scratch' needs a tokenizer, e.g. tokenizer='char'")
        ModelConfig(**{"vocab_size": 1, **cfg.model_args})  # its sizes
    elif cfg.model_args:
        raise ValueError("model_args only apply to model='scratch'")
    if cfg.lora_rank < 0:
        raise ValueError(f"lora_rank must be >= 0 (0 = no LoRA), got {cfg.lora_rank}")
    if cfg.lora_rank > 0 and not (cfg.lora_targets and set(cfg.lora_targets) <= set(LORA_TARGETS)):
        raise ValueError(f"lora_targets must be a non-empty subset of {LORA_TARGETS}, got "
                         f"{cfg.lora_targets}")
    if not (cfg.lora_alpha > 0 and 0 <= cfg.lora_dropout < 1):
        raise ValueError(f"need lora_alpha > 0 and 0 <= lora_dropout < 1, got {cfg.lora_alpha} and "
                         f"{cfg.lora_dropout}")
    resolve_device(cfg.device, cfg.dtype)


def set_attention_backends(device: torch.device):
    """SDPA's backends for every program on this device (train.py, eval.py, tools/bench.py), so that
    their scores agree: on CUDA, cuDNN attention off (flash and memory-efficient attention remain;
    attention_kv reaches the latter under a mask). With torch >= 2.11 cuDNN is the default for
    masked bf16 attention, and its backward has returned NaN in grad_q for GQA when a mask is
    passed, T % 128 == 64 and some attention row is extremely negative (pytorch issue 196678); the
    sampler's prefill passes a mask, and so does an update's forward that rolls_rows leaves masked,
    with T varying per micro-batch."""
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def _download(name: str) -> str:
    from huggingface_hub import snapshot_download  # installed with transformers
    return snapshot_download(name, allow_patterns=["*.json", "*.safetensors"])


def _read_safetensors(path: str) -> dict:
    from safetensors.torch import load_file  # installed with transformers
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.isfile(os.path.join(path, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path}")
    state = {}
    for file in files:
        state.update(load_file(os.path.join(path, file)))
    return state


def _from_hf_names(state: dict, config: ModelConfig) -> dict:
    """Rename Hugging Face parameter names to this file's (model.layers.3.self_attn.q_proj ->
    layers.3.attn.q_proj)."""
    out = {}
    for name, tensor in state.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue  # recomputed from the config
        parts = name.removeprefix("model.").split(".")
        out[".".join(HF_NAMES.get(part, part) for part in parts)] = tensor
    if config.tie_embeddings:
        out.pop("lm_head.weight", None)
        out["lm_head.weight"] = out["embed.weight"]
    return out


def _to_hf_names(state: dict, config: ModelConfig) -> dict:
    """The inverse of _from_hf_names; a tied head is left out, as transformers re-ties it to the
    embedding."""
    ours_to_hf = {ours: hf for hf, ours in HF_NAMES.items()}
    out = {}
    for name, tensor in state.items():
        if name == "lm_head.weight":
            if not config.tie_embeddings:
                out[name] = tensor
            continue
        out["model." + ".".join(ours_to_hf.get(part, part) for part in name.split("."))] = tensor
    return out

