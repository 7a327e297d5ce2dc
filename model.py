"""A decoder-only transformer of the Qwen2 / Llama family, written out by hand.

Covers Qwen2 / Qwen2.5 (q/k/v bias, GQA, RoPE, RMSNorm, SwiGLU, tied or untied head) and Llama-shaped
models (no bias; SmolLM2, Llama-3.x with "llama3" RoPE scaling). Loads Hugging Face checkpoints
(a local directory with config.json + safetensors, sharded or not, a hub name, or a GGUF file).

Calling the model on ids [B, T] returns logits [B, T, vocab]. Incremental decoding: pass a KVCache
and `cache_index` (the cache slot of ids[:, 0]); the new keys/values are written at
slots cache_index .. cache_index+T-1 and each query attends to cache slots <= its own slot.
Ragged batches are left-padded: `attention_mask` [B, S] marks real key slots (S = T without a
cache, S = cache length with one) and positions default to the count of real tokens before each one.
"""
import json
import math
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")


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
    rope_scaling: dict | None = None  # only {"rope_type": "llama3", ...} (Llama-3.1/3.2) is supported
    norm_eps: float = 1e-6
    qkv_bias: bool = True  # Qwen2 has q/k/v biases, Llama does not
    tie_embeddings: bool = True

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
        if self.rope_scaling is not None and self.rope_scaling.get("rope_type") != "llama3":
            raise ValueError(f"unsupported rope_scaling {self.rope_scaling}: only rope_type 'llama3' is implemented")

    @classmethod
    def from_hf(cls, hf: dict) -> "ModelConfig":
        """Translate a Hugging Face config.json dict; refuse anything that is not Qwen2/Llama-shaped."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model.py supports Qwen2/Qwen2.5 (model_type 'qwen2') and Llama-family checkpoints "
                f"(model_type 'llama': Llama, SmolLM2); got model_type {model_type!r} "
                f"(architectures {hf.get('architectures')})")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r}: model.py implements SwiGLU (silu)")
        if hf.get("use_sliding_window") or hf.get("attention_bias") or hf.get("mlp_bias"):
            raise ValueError("sliding-window attention, Llama attention_bias and mlp_bias are not implemented")
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})  # transformers 5 / 4 layouts
        theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        n_heads = hf["num_attention_heads"]
        return cls(
            vocab_size=hf["vocab_size"], dim=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
            n_heads=n_heads, n_kv_heads=hf.get("num_key_value_heads") or n_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads, ffn_dim=hf["intermediate_size"],
            max_seq_len=hf.get("max_position_embeddings", 32768), rope_theta=float(theta),
            rope_scaling=None if rope_type == "default" else {**rope, "rope_type": rope_type},
            norm_eps=hf.get("rms_norm_eps", 1e-6), qkv_bias=model_type == "qwen2",
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)))


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim/2] in fp32, with Llama-3's long-context rescaling when configured."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    if config.rope_scaling is None:
        return inv_freq
    s = config.rope_scaling  # llama3: divide low frequencies by `factor`, interpolate the band between
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
    """x [B, H, T, D]; cos/sin [B, 1, T, D]. Rotates the two halves of each head (the HF/Qwen layout)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # normalise in fp32, scale in the input dtype: the order the checkpoints were trained with
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class KVCache:
    """Preallocated keys/values [n_layers, B, n_kv_heads, max_len, head_dim]; slots are written in place."""

    def __init__(self, config: ModelConfig, batch_size: int, max_len: int, device=None, dtype=torch.float32):
        shape = (config.n_layers, batch_size, config.n_kv_heads, max_len, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len

    @staticmethod
    def nbytes(config: ModelConfig, batch_size: int, max_len: int, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * config.n_layers * batch_size * config.n_kv_heads * max_len * config.head_dim * elem

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor):
        """Write k/v [B, Hkv, T, D] at cache slots [T]; return this layer's whole cache (k, v)."""
        self.k[layer].index_copy_(2, slots, k)
        self.v[layer].index_copy_(2, slots, v)
        return self.k[layer], self.v[layer]


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer, self.n_heads, self.n_kv_heads, self.head_dim = layer, config.n_heads, config.n_kv_heads, config.head_dim
        self.q_proj = nn.Linear(config.dim, config.n_heads * config.head_dim, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)

    def forward(self, x, cos, sin, mask, cache, slots):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(self.layer, k, v, slots)
        group = self.n_heads // self.n_kv_heads
        if T == 1 and group > 1:
            # one decode step: fold each kv head's query group into the query axis, so no kv copy is made
            q = q.view(B, self.n_kv_heads, group, self.head_dim)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            y = y.reshape(B, self.n_heads, 1, self.head_dim)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                               enable_gqa=group > 1)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.up_proj = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.down_proj = nn.Linear(config.ffn_dim, config.dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(config.dim, config.norm_eps)
        self.attn = Attention(config, layer)
        self.mlp_norm = RMSNorm(config.dim, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, mask, cache=None, slots=None):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask, cache, slots)
        return x + self.mlp(self.mlp_norm(x))


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
        self.grad_checkpointing = False  # recompute each block in backward: trades ~30% time for activations
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

    def configure_optimizer(self, lr: float, weight_decay: float = 0.0, betas=(0.9, 0.99)) -> torch.optim.AdamW:
        """AdamW over the trainable parameters; weight decay on matrices only (not norms, biases). Keep the
        parameters fp32: plain bf16 AdamW rounds an update of lr 1e-6 away."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=self.lm_head.weight.is_cuda)

    def forward(self, ids, positions=None, attention_mask=None, cache=None, cache_index=0, return_hidden=False):
        """ids [B, T] -> logits [B, T, vocab] (or the final normed hidden states [B, T, dim]).

        positions [B, T]: RoPE positions; default: real tokens counted from 0 (left padding skipped).
        attention_mask [B, S] (bool/0-1): real key slots; S = T, or cache.max_len with a cache.
        cache, cache_index (int or 0-d LongTensor): write k/v at slots cache_index.., attend to slots <= own.
        """
        B, T = ids.shape
        device = ids.device
        slots = torch.as_tensor(cache_index, device=device) + torch.arange(T, device=device)
        if attention_mask is not None:
            attention_mask = attention_mask.bool()
        if positions is None:
            if attention_mask is not None and cache is None:
                positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
            else:
                positions = slots.expand(B, T)
        if cache is not None:
            key_slots = torch.arange(cache.max_len, device=device)
            if attention_mask is None:
                attention_mask = key_slots < slots[-1] + 1
        else:
            key_slots = slots
        mask = None
        if attention_mask is not None:
            # causal AND real key; a query may always see itself so padded rows never softmax over nothing
            causal = key_slots[None, :] <= slots[:, None]
            mask = (causal & attention_mask.view(-1, 1, key_slots.numel())) | (key_slots[None, :] == slots[:, None])
            mask = mask.view(-1, 1, T, key_slots.numel())
        freqs = positions[..., None].float() * self.inv_freq  # [B, T, D/2] in fp32, as the checkpoints do
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        x = self.embed(ids)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for block in self.layers:
            if self.grad_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, cos, sin, mask, use_reentrant=False)
            else:
                x = block(x, cos, sin, mask, cache, slots)
        x = self.norm(x)
        return x if return_hidden else self.lm_head(x)

    @classmethod
    def from_pretrained(cls, name_or_path: str, dtype=torch.float32, device=None, gguf_file=None) -> "Transformer":
        """Load a Hugging Face Qwen2/Llama checkpoint: a local dir, a hub name, or `gguf_file` in that dir/repo."""
        if gguf_file is not None:
            from transformers import AutoModelForCausalLM  # transformers dequantizes GGUF with the `gguf` package
            hf_model = AutoModelForCausalLM.from_pretrained(name_or_path, gguf_file=gguf_file, dtype=torch.float32)
            return cls.from_hf_model(hf_model, dtype=dtype, device=device)
        if os.path.isdir(name_or_path):
            path = name_or_path
        elif name_or_path.startswith((os.sep, ".", "~")) or name_or_path.count("/") != 1:
            raise FileNotFoundError(f"model {name_or_path!r}: no such directory (and not a hub name like "
                                    "'Qwen/Qwen2.5-0.5B')")
        else:
            path = _download(name_or_path)
        config_file = os.path.join(path, "config.json")
        if not os.path.isfile(config_file):
            raise FileNotFoundError(f"{config_file} not found: not a Hugging Face model directory")
        with open(config_file) as f:
            config = ModelConfig.from_hf(json.load(f))  # validate the architecture before reading gigabytes
        return cls._from_state(config, _read_safetensors(path), dtype, device)

    @classmethod
    def from_hf_model(cls, hf_model, dtype=torch.float32, device=None) -> "Transformer":
        """Copy the weights of an in-memory transformers Qwen2ForCausalLM / LlamaForCausalLM."""
        return cls._from_state(ModelConfig.from_hf(hf_model.config.to_dict()), hf_model.state_dict(), dtype, device)

    @classmethod
    def _from_state(cls, config: ModelConfig, hf_state: dict, dtype, device) -> "Transformer":
        with torch.device("meta"):  # no random init of weights that are about to be overwritten
            model = cls(config)
        model.load_state_dict(_from_hf_names(hf_state, config), strict=True, assign=True)
        if config.tie_embeddings:
            model.lm_head.weight = model.embed.weight
        model.inv_freq = rope_inv_freq(config)  # buffers are not in the checkpoint: leave the meta device
        return model.to(device=device, dtype=dtype)


def resolve_device(device: str = "auto", dtype: str = "auto") -> tuple[torch.device, torch.dtype]:
    """("auto" | "cuda" | "cpu", "auto" | "bfloat16" | "float32") -> (device, compute dtype); auto picks cuda when
    available, and bf16 on cuda, fp32 on cpu (bf16 matmuls are slow on most CPUs)."""
    if device not in ("auto", "cuda", "cpu") or dtype not in ("auto", "bfloat16", "float32"):
        raise ValueError(f"device must be auto|cuda|cpu and dtype auto|bfloat16|float32, got {device!r}, {dtype!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA device")
    resolved = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                            "cpu" if device == "auto" else device)
    if dtype == "auto":
        return resolved, torch.bfloat16 if resolved.type == "cuda" else torch.float32
    return resolved, getattr(torch, dtype)


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
    """Rename Hugging Face parameter names to this file's (model.layers.3.self_attn.q_proj -> layers.3.attn.q_proj)."""
    renames = (("embed_tokens", "embed"), ("self_attn", "attn"),
               ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "mlp_norm"))
    out = {}
    for name, tensor in state.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue  # recomputed from the config
        name = name.removeprefix("model.")
        for old, new in renames:
            name = name.replace(old, new)
        out[name] = tensor
    if config.tie_embeddings:
        out.pop("lm_head.weight", None)
        out["lm_head.weight"] = out["embed.weight"]
    return out

