"""
The sampler's decode step on CUDA in a few fused Triton kernels: at GRPO's decoding shapes (a few
hundred rows, one token each) a step's time is its kernel launches, not its bytes. Each kernel here
replaces a few torch ops of model.py or sample.py, named in its docstring; that torch code stays the
reference, the CPU path and the fallback. tests/test_kernels.py runs each kernel on the CPU under
Triton's interpreter (TRITON_INTERPRET=1) against its reference, and a whole fused decode step
against the model's forward; and, since the interpreter checks none of the GPU's shape rules,
compiles each kernel to a cubin for sm_80 and sm_90 (Triton's pipeline and bundled ptxas, on the
CPU) at the shapes of every architecture the project loads. A head of any even head_dim takes
padded(head_dim) lanes. Integer arguments that change within a run (the cache's and a split's
length) are do_not_specialize: a cache of another length compiles nothing new.

    hidden = decode_step(model, ids, positions, slot, starts, cache, attend)  # one token per row

decode_step is model.Transformer.forward for one token per row, with
- the q/k/v and gate/up projections one matrix product each (Transformer.fuse_projections: the
  sampler's bf16 copy keeps each group's weights in one tensor, the layers' weights views of it);
- RoPE and the cache write in one kernel (rope_and_cache), with apply_rope's bf16 roundings;
- attention over each row's real key slots, start to slot, read in splits and combined
  (decode_attention: no additive mask, grouped heads read their kv head once);
- the residual add and the next RMSNorm in one kernel (add_rms_norm), SiLU·mul in one (silu_mul).
Per layer: 4 matrix products and 5 or 6 kernels, where the torch forward runs about 24 ops. The
sampling that follows is sample.py's fused Gumbel kernels. Qwen3's q/k norms stay torch ops.

The update's log-probs on CUDA in bf16 (update.completion_logprobs; update.chunk_logprobs the
reference, the CPU path and the fallback) are fused_logprobs: lm_head, log_softmax(. / T), the
target's gather and the entropy in one pass over the vocabulary, forward and backward.

The training forward (model.py, with grad, in half precision on CUDA: fused_training) runs RoPE,
SiLU·mul and Block's mid-block add + RMSNorm as autograd Functions (Rope, SiluMul, AddRMSNorm), one
kernel each way, rounding as the torch ops do; a probe on first use keeps the torch ops where they
fail.
"""
import sys

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

# keys per attention block; the key range is split until the (row, kv head, split) programs reach
# SPLIT_BELOW_PROGRAMS (about 8 a streaming multiprocessor of an H100 or H200: at GRPO's few hundred
# rows and 2 to 8 kv heads, 2 to 4 splits of a long range), no split shorter than SPLIT_KEYS keys
# (chosen, not yet timed on a GPU)
BLOCK_KEYS = 64
SPLIT_BELOW_PROGRAMS = 1024
SPLIT_KEYS = 256
# the most pieces a key range is cut in: the combine holds splits x group x head lanes in
# registers, and at 32 or 64 splits of a group of 8 (Qwen2.5, 64 or 128 lanes) ptxas spilled them
# (255 registers and 56 to 5,216 bytes of stack a thread, tests/test_kernels.py's compile check)
MOST_SPLITS = 16


def decode_step(model, ids, positions, slot, starts, cache, attend: int) -> torch.Tensor:
    """model's final normed hidden states [b, dim] for one new token per row: ids [b], RoPE
    positions [b], the cache slot they are written at (0-d), each row's first real key slot
    starts [b] (after its prompt's left padding); attention reads slots starts..slot of the first
    `attend` (a bound on slot + 1, fixed per CUDA graph). The model must be fused
    (Transformer.fuse_projections), without LoRA adapters."""
    config = model.config
    x = model.embed(ids)  # [b, dim]
    freqs = positions[:, None] * model.inv_freq  # [b, D/2] fp32, as the forward computes them
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x, normed = add_rms_norm(x, None, model.layers[0].attn_norm)
    norms = [block.mlp_norm for block in model.layers]
    following = [block.attn_norm for block in model.layers[1:]] + [model.norm]
    for layer, block in enumerate(model.layers):
        attn = block.attn
        qkv = F.linear(normed, attn.qkv_weight, attn.qkv_bias)  # [b, (H + 2 Hkv) D]
        if config.qk_norm:  # Qwen3: torch's norms on the query and key heads, before RoPE
            qkv = _qk_normed(attn, qkv, config)
        q = rope_and_cache(qkv, cos, sin, cache.k[layer], cache.v[layer], slot, config)
        y = decode_attention(q, cache.k[layer], cache.v[layer], starts, slot, attend)
        x, normed = add_rms_norm(x, F.linear(y, attn.o_proj.weight), norms[layer])
        hidden = silu_mul(F.linear(normed, block.mlp.gate_up_weight))  # [b, ffn_dim]
        x, normed = add_rms_norm(x, F.linear(hidden, block.mlp.down_proj.weight), following[layer])
    return normed


def _qk_normed(attn, qkv, config):
    """qkv [b, (H + 2 Hkv) D] with its query and key heads through q_norm and k_norm."""
    b, d = qkv.shape[0], config.head_dim
    q, k, v = qkv.split((config.n_heads * d, config.n_kv_heads * d, config.n_kv_heads * d), dim=-1)
    q = attn.q_norm(q.view(b, config.n_heads, d)).to(q.dtype).view(b, -1)
    k = attn.k_norm(k.view(b, config.n_kv_heads, d)).to(k.dtype).view(b, -1)
    return torch.cat((q, k, v), dim=-1)


def possible(model, device) -> bool:
    """Whether decode_step can decode for model on device: Triton importable, CUDA, a fused model
    (its sampler copy) without LoRA adapters. Any head_dim (even, as ModelConfig requires) compiles:
    the kernels pad it (padded)."""
    return (triton is not None and device.type == "cuda"
            and hasattr(model.layers[0].attn, "qkv_weight")
            and not any(hasattr(m, "lora_A") for m in model.modules()))


def padded(head_dim: int) -> int:
    """The lanes a kernel gives a head: head_dim rounded up to a power of two (tl.arange's rule),
    at least 16 (tl.dot's inner dimension on NVIDIA GPUs); the lanes past head_dim load zeros and
    store nothing."""
    return max(16, triton.next_power_of_2(head_dim))

# -----------------------------------------------------------------------------
# the residual add and the RMSNorm after it


def add_rms_norm(x, y, norm):
    """(x + y, RMSNorm(x + y)) for x, y [b, dim] (y None: x alone), norm a model.RMSNorm: the
    residual add of Block.forward and the norm that reads its result, rounded as torch rounds
    them in x's dtype (the sum; then r / rms(r) times the weight, in fp32, rounded once)."""
    rows, dim = x.shape
    residual, normed = torch.empty_like(x), torch.empty_like(x)
    _add_rms_norm_kernel[(rows,)](x, x if y is None else y, norm.weight, residual, normed, x, dim,
                                  norm.eps, HAS_Y=y is not None, SAVE=False,
                                  BLOCK=triton.next_power_of_2(dim))
    return residual, normed


if triton is not None:
    @triton.jit
    def _add_rms_norm_kernel(x, y, weight, residual, normed, rstd, dim, eps, HAS_Y: tl.constexpr,
                             SAVE: tl.constexpr, BLOCK: tl.constexpr):
        """Program `row`: residual = x + y rounded, normed = round(r / rms(r) * w) in fp32; SAVE:
        1 / rms(r) into rstd (AddRMSNorm's backward reads it)."""
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        inside = cols < dim
        r = tl.load(x + row * dim + cols, mask=inside, other=0.0)
        if HAS_Y:
            r = (r.to(tl.float32) + tl.load(y + row * dim + cols, mask=inside,
                                            other=0.0).to(tl.float32)).to(r.dtype)
        tl.store(residual + row * dim + cols, r, mask=inside)
        value = r.to(tl.float32)
        scale = tl.rsqrt(tl.sum(value * value, 0) / dim + eps)
        if SAVE:
            tl.store(rstd + row, scale)
        w = tl.load(weight + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(normed + row * dim + cols, (value * scale * w).to(r.dtype), mask=inside)

# -----------------------------------------------------------------------------
# SiLU·mul


def silu_mul(gate_up):
    """gate_up [b, 2 F] (MLP's gate and up projections, side by side) -> silu(gate) * up [b, F],
    rounded as MLP.forward rounds them in its dtype."""
    rows, width = gate_up.shape
    out = torch.empty(rows, width // 2, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(width // 2, block))](gate_up, out, width // 2,
                                                              BLOCK=block)
    return out


if triton is not None:
    @triton.jit
    def _silu_mul_kernel(gate_up, out, ffn, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < ffn
        g = tl.load(gate_up + row * 2 * ffn + cols, mask=inside, other=0.0)
        u = tl.load(gate_up + row * 2 * ffn + ffn + cols, mask=inside, other=0.0)
        gate = g.to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(g.dtype).to(tl.float32)
        tl.store(out + row * ffn + cols, (silu * u.to(tl.float32)).to(g.dtype), mask=inside)

# -----------------------------------------------------------------------------
# RoPE and the cache write


def rope_and_cache(qkv, cos, sin, k_cache, v_cache, slot, config):
    """qkv [b, (H + 2 Hkv) D] (one token per row), cos / sin [b, D] -> the rotated queries
    [b, H, D]; the rotated keys and the values are written into this layer's cache [b, Hkv, S, D]
    at `slot`. apply_rope's roundings: x cos and rotate(x) sin each rounded, then their sum.
    Replaces Attention.forward's view, cat, apply_rope, split and KVCache.update."""
    rows = qkv.shape[0]
    heads, kv_heads, d = config.n_heads, config.n_kv_heads, config.head_dim
    q = torch.empty(rows, heads, d, dtype=qkv.dtype, device=qkv.device)
    _rope_cache_kernel[(rows, heads + 2 * kv_heads)](
        qkv, cos, sin, q, k_cache, v_cache, slot, k_cache.shape[2], heads, kv_heads, D=d,
        PADDED=padded(d))
    return q


if triton is not None:
    @triton.jit(do_not_specialize=["max_len", "heads", "kv_heads"])
    def _rope_cache_kernel(qkv, cos, sin, q, k_cache, v_cache, slot, max_len, heads, kv_heads,
                           D: tl.constexpr, PADDED: tl.constexpr):
        """Program (row, head): a query head is rotated into q, a key head rotated into k_cache, a
        value head copied into v_cache, at the row's cache slot. Lanes D..PADDED (padded) idle."""
        row = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        width = (heads + 2 * kv_heads) * D
        cols = tl.arange(0, PADDED)
        inside = cols < D
        x = tl.load(qkv + row * width + head * D + cols, mask=inside)
        slot_index = tl.load(slot).to(tl.int64)
        if head >= heads + kv_heads:  # a value head: copied as it is
            kv = head - heads - kv_heads
            tl.store(v_cache + ((row * kv_heads + kv) * max_len + slot_index) * D + cols, x,
                     mask=inside)
        else:
            half = D // 2
            partner = tl.load(qkv + row * width + head * D + (cols + half) % D,
                              mask=inside).to(tl.float32)
            rotated = tl.where(cols < half, -partner, partner)  # cat(-x2, x1)
            c = tl.load(cos + row * D + cols, mask=inside).to(tl.float32)
            s = tl.load(sin + row * D + cols, mask=inside).to(tl.float32)
            first = (x.to(tl.float32) * c).to(x.dtype).to(tl.float32)
            second = (rotated * s).to(x.dtype).to(tl.float32)
            y = (first + second).to(x.dtype)
            if head < heads:
                tl.store(q + (row * heads + head) * D + cols, y, mask=inside)
            else:
                kv = head - heads
                tl.store(k_cache + ((row * kv_heads + kv) * max_len + slot_index) * D + cols, y,
                         mask=inside)

# -----------------------------------------------------------------------------
# attention over each row's real keys


def decode_attention(q, k_cache, v_cache, starts, slot, attend: int):
    """q [b, H, D] (one query per row and head), this layer's cache [b, Hkv, S, D] -> the
    attention output [b, H * D]: each query head attends to its kv head's slots starts[row] ..
    slot (the row's real prompt tokens and every generated one), softmax(q k / sqrt(D)) v in fp32.
    Replaces the decode step's scaled_dot_product_attention under the additive mask. The key range
    is cut into `splits` pieces, each a program, combined by a second kernel, when rows x kv heads
    alone would leave the GPU idle (flash-decoding); `attend` bounds the range."""
    rows, heads, d = q.shape
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    # a power of two (the combine reads them as one block); an empty split weighs 0
    splits = min(triton.next_power_of_2(triton.cdiv(SPLIT_BELOW_PROGRAMS, rows * kv_heads)),
                 triton.next_power_of_2(triton.cdiv(attend, SPLIT_KEYS)), MOST_SPLITS)
    per_split = triton.cdiv(triton.cdiv(attend, splits), BLOCK_KEYS) * BLOCK_KEYS
    out = torch.empty(rows, heads * d, dtype=q.dtype, device=q.device)
    partial = torch.empty(rows, kv_heads, splits, group, d + 2, dtype=torch.float32,
                          device=q.device) if splits > 1 else out
    _decode_attention_kernel[(rows, kv_heads, splits)](
        q, k_cache, v_cache, starts, slot, partial, out, k_cache.shape[2], per_split, d ** -0.5,
        heads, kv_heads, group, D=d, PADDED=padded(d),
        GROUP=max(16, triton.next_power_of_2(group)), BLOCK=BLOCK_KEYS, SPLITS=splits)
    if splits > 1:
        _combine_splits_kernel[(rows, kv_heads)](partial, out, heads, kv_heads, group, D=d,
                                                 PADDED=padded(d),
                                                 GROUP=triton.next_power_of_2(group),
                                                 SPLITS=splits)
    return out


if triton is not None:
    @triton.jit(do_not_specialize=["max_len", "per_split", "heads", "kv_heads", "group"])
    def _decode_attention_kernel(q, k_cache, v_cache, starts, slot, partial, out, max_len,
                                 per_split, scale, heads, kv_heads, group, D: tl.constexpr,
                                 PADDED: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr,
                                 SPLITS: tl.constexpr):
        """Program (row, kv head, split): the online softmax of the kv head's query group over the
        row's keys (starts[row] .. slot) in the split's per_split slots, a block of BLOCK keys at a
        time from the first block holding one of them to the last (no block wholly padding or
        unwritten is read); the products in the cache's dtype (bf16 operands, fp32 sums), the
        weights cast to it for the second, as flash attention does. With one split the output
        itself, else (acc, max, sum) for _combine_splits_kernel (an empty split: -inf, 0)."""
        row = tl.program_id(0).to(tl.int64)
        kv = tl.program_id(1)
        split = tl.program_id(2)
        first = tl.load(starts + row)
        last = tl.load(slot)  # inclusive: a query sees itself
        g = tl.arange(0, GROUP)
        cols = tl.arange(0, PADDED)
        in_group = g < group
        inside = in_group[:, None] & (cols < D)[None, :]
        query_rows = (row * heads + kv * group + g)[:, None] * D + cols[None, :]
        # [GROUP, PADDED], 0 past D, in the cache's dtype
        queries = tl.load(q + query_rows, mask=inside, other=0.0).to(k_cache.dtype.element_ty)
        base = (row * kv_heads + kv) * max_len * D
        best = tl.full((GROUP,), float("-inf"), tl.float32)
        total = tl.zeros((GROUP,), tl.float32)
        acc = tl.zeros((GROUP, PADDED), tl.float32)
        # the split's blocks that hold keys of the row: from first's block (splits start at a
        # multiple of BLOCK) to slot
        lo = tl.maximum(split * per_split, first // BLOCK * BLOCK)
        hi = tl.minimum((split + 1) * per_split, last + 1)
        for block in range(lo, hi, BLOCK):
            keys = block + tl.arange(0, BLOCK)
            valid = (keys >= first) & (keys <= last)
            offsets = base + keys[:, None].to(tl.int64) * D + cols[None, :]
            fetch = valid[:, None] & (cols < D)[None, :]
            k = tl.load(k_cache + offsets, mask=fetch, other=0.0)
            v = tl.load(v_cache + offsets, mask=fetch, other=0.0)
            scores = tl.dot(queries, tl.trans(k)) * scale  # [GROUP, BLOCK] fp32
            scores = tl.where(valid[None, :], scores, float("-inf"))
            newest = tl.maximum(best, tl.max(scores, 1))
            shift = tl.where(newest == float("-inf"), 0.0, newest)  # no key yet: weights 0
            weights = tl.exp(scores - shift[:, None])
            rescale = tl.exp(best - shift)
            total = total * rescale + tl.sum(weights, 1)
            acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v)  # [GROUP, D] fp32
            best = newest
        if SPLITS == 1:
            tl.store(out + query_rows, (acc / total[:, None]).to(out.dtype.element_ty),
                     mask=inside)
        else:
            at = (((row * kv_heads + kv) * SPLITS + split) * group + g) * (D + 2)
            tl.store(partial + at[:, None] + cols[None, :], acc, mask=inside)
            tl.store(partial + at + D, best, mask=in_group)
            tl.store(partial + at + D + 1, total, mask=in_group)

    @triton.jit(do_not_specialize=["heads", "kv_heads", "group"])
    def _combine_splits_kernel(partial, out, heads, kv_heads, group, D: tl.constexpr,
                               PADDED: tl.constexpr, GROUP: tl.constexpr, SPLITS: tl.constexpr):
        """Program (row, kv head): the splits' (acc, max, sum) -> softmax(.) v for its group."""
        row = tl.program_id(0).to(tl.int64)
        kv = tl.program_id(1)
        g = tl.arange(0, GROUP)
        cols = tl.arange(0, PADDED)
        in_group = g < group
        splits = tl.arange(0, SPLITS)
        at = (((row * kv_heads + kv) * SPLITS + splits[:, None]) * group + g[None, :]) * (D + 2)
        fill = in_group[None, :]
        best = tl.load(partial + at + D, mask=fill, other=float("-inf"))  # [SPLITS, GROUP]
        total = tl.load(partial + at + D + 1, mask=fill, other=0.0)
        most = tl.max(best, 0)  # [GROUP]
        # an empty split holds -inf and 0: weight 0
        factor = tl.where(best == float("-inf"), 0.0, tl.exp(best - most[None, :]))
        norm = tl.sum(total * factor, 0)
        acc = tl.load(partial + at[:, :, None] + cols[None, None, :],
                      mask=fill[:, :, None] & (cols < D)[None, None, :],
                      other=0.0)  # [SPLITS, GROUP, PADDED]
        y = tl.sum(acc * factor[:, :, None], 0) / norm[:, None]
        rows_out = (row * heads + kv * group + g)[:, None] * D + cols[None, :]
        tl.store(out + rows_out, y.to(out.dtype.element_ty),
                 mask=in_group[:, None] & (cols < D)[None, :])

# -----------------------------------------------------------------------------
# the update's log-probs: lm_head, log_softmax(. / T) and the target's gather in one pass over the
# vocabulary (update.completion_logprobs on CUDA in bf16; update.chunk_logprobs the reference)

# a tile: rows of hidden states, vocabulary columns, hidden lanes per tl.dot step
LOGPROB_ROWS, LOGPROB_COLUMNS, LOGPROB_LANES = 64, 128, 64
LOGPROB_WARPS = 8
# the fewest forward programs before the vocabulary is cut in splits (4 per H100 / H200 SM)
LOGPROB_PROGRAMS = 528
# where the fused log-probs run (tests add "cpu" for Triton's interpreter)
LOGPROB_DEVICES = ("cuda",)


def logprobs_dtype(lm_head, hidden):
    """The dtype the fused log-probs run lm_head on hidden in, or None where they do not run:
    Triton, a LOGPROB_DEVICES device, a plain bias-free nn.Linear without hooks (no LoRA, no FSDP's
    unsharding) and bf16 (autocast's, or the weight's and hidden's own): the project's half
    precision. Anything else (fp32, the CPU) keeps update.chunk_logprobs."""
    if triton is None or hidden.device.type not in LOGPROB_DEVICES:
        return None
    if (type(lm_head) is not torch.nn.Linear or lm_head.bias is not None or lm_head._forward_hooks
            or lm_head._forward_pre_hooks
            or type(lm_head.weight) not in (torch.nn.Parameter, torch.Tensor)):
        return None
    if torch.is_autocast_enabled(hidden.device.type):
        dtype = torch.get_autocast_dtype(hidden.device.type)
    else:
        dtype = hidden.dtype if hidden.dtype == lm_head.weight.dtype else None
    return dtype if dtype == torch.bfloat16 else None


def fused_logprobs(hidden, weight, targets, temperature: float, entropy: str | None = None):
    """hidden [M, D] and weight [V, D] in one half precision, targets [M] -> (each target's log-prob
    [M] fp32 under log_softmax(hidden weight^T / temperature), each row's entropy [M] fp32 or None),
    as update.chunk_logprobs computes them under autocast: each logit summed in fp32 and rounded
    to the weight's dtype (the bf16 matmul's output), then divided by temperature in fp32; entropy
    None, "sum" (no grad) or "tokens" (with grad). The logits never exist: each program keeps its
    rows' running max, exp-sum (and exp-weighted sum, for the entropy) over vocabulary tiles. The
    backward recomputes each tile's logits and writes the logits' gradient in the weight's dtype
    [M, V] (the bf16 gradient autocast's matmul gets), then two matrix products give hidden's and
    weight's gradients in that dtype."""
    return _FusedLogprobs.apply(hidden, weight, targets, float(temperature), entropy)


_BACKWARD_WARM = set()  # (dtype, entropy with grad) of the backward kernels compiled so far


class _FusedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, entropy):
        hidden, weight, targets = hidden.contiguous(), weight.contiguous(), targets.contiguous()
        logp, log_z, ent = _logprobs_forward(hidden, weight, targets, temperature,
                                             entropy is not None)
        ctx.temperature, ctx.entropy = temperature, entropy
        warm = (weight.dtype, entropy == "tokens")
        if (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]) and warm not in _BACKWARD_WARM:
            # the backward's kernel compiled here, where a failure can still fall back
            # (update._fall_back), not in loss.backward()
            _dlogits(hidden[:1], weight, targets[:1], log_z[:1], None if ent is None else ent[:1],
                     logp[:1], None if entropy != "tokens" else ent[:1], temperature)
            _BACKWARD_WARM.add(warm)
        ctx.save_for_backward(hidden, weight, targets, log_z,
                              ent if entropy == "tokens" else None)
        if entropy == "sum":
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, targets, log_z, ent = ctx.saved_tensors
        grad_ent = g_ent if ctx.entropy == "tokens" else None
        d = _dlogits(hidden, weight, targets, log_z, ent, g_logp, grad_ent, ctx.temperature)
        grad_hidden = d @ weight if ctx.needs_input_grad[0] else None
        grad_weight = d.t() @ hidden if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None, None, None


def _logprobs_forward(hidden, weight, targets, temperature, entropy: bool):
    """(log-probs, log-normalisers, entropies or None), each [M] fp32: a program per (row tile,
    vocabulary split) keeps its rows' (max, exp-sum, exp-weighted logit sum, target's logit) over
    its split, combined here."""
    rows, dim = hidden.shape
    vocab = weight.shape[0]
    row_tiles = triton.cdiv(rows, LOGPROB_ROWS)
    splits = min(triton.cdiv(vocab, LOGPROB_COLUMNS), max(1, triton.cdiv(LOGPROB_PROGRAMS,
                                                                           row_tiles)))
    per_split = triton.cdiv(triton.cdiv(vocab, splits), LOGPROB_COLUMNS) * LOGPROB_COLUMNS
    splits = triton.cdiv(vocab, per_split)
    partial = torch.empty(4, splits, rows, dtype=torch.float32, device=hidden.device)
    _logprobs_kernel[(row_tiles, splits)](
        hidden, weight, targets, partial, rows, vocab, dim, per_split, temperature,
        ENTROPY=entropy, ROWS=LOGPROB_ROWS, COLUMNS=LOGPROB_COLUMNS, LANES=LOGPROB_LANES,
        num_warps=LOGPROB_WARPS)
    best, total, weighted, chosen = partial
    most = best.max(0).values
    factor = torch.exp(best - most)
    total = (total * factor).sum(0)
    log_z = most + total.log()
    logp = chosen.sum(0) - log_z
    ent = log_z - (weighted * factor).sum(0) / total if entropy else None
    return logp, log_z, ent


def _dlogits(hidden, weight, targets, log_z, ent, g_logp, g_ent, temperature):
    """The gradient [M, V] in weight's dtype of the logits (the matmul's output) from the log-probs'
    g_logp [M] and the entropies' g_ent [M] (or None): (g_logp (onehot - p) - g_ent p (log p + H))
    / temperature, a program per (row tile, vocabulary tile), the tile's logits recomputed."""
    rows, dim = hidden.shape
    vocab = weight.shape[0]
    out = torch.empty(rows, vocab, dtype=weight.dtype, device=hidden.device)
    g_logp = g_logp.float().contiguous()
    _dlogits_kernel[(triton.cdiv(rows, LOGPROB_ROWS), triton.cdiv(vocab, LOGPROB_COLUMNS))](
        hidden, weight, targets, log_z, g_logp if ent is None else ent, g_logp,
        g_logp if g_ent is None else g_ent.float().contiguous(), out, rows, vocab, dim,
        temperature, ENTROPY=g_ent is not None, ROWS=LOGPROB_ROWS, COLUMNS=LOGPROB_COLUMNS,
        LANES=LOGPROB_LANES, num_warps=LOGPROB_WARPS)
    return out


if triton is not None:
    @triton.jit
    def _logits_tile(hidden, weight, row_at, in_rows, cols, vocab, dim, temperature,
                     ROWS: tl.constexpr, COLUMNS: tl.constexpr, LANES: tl.constexpr):
        """[ROWS, COLUMNS] fp32: hidden's rows times weight's columns, summed in fp32 over LANES
        lanes at a time, rounded to hidden's dtype (the matmul's output), / temperature; -inf past
        the vocabulary."""
        in_vocab = cols < vocab
        col_at = cols.to(tl.int64)
        acc = tl.zeros((ROWS, COLUMNS), tl.float32)
        for start in range(0, dim, LANES):
            lanes = start + tl.arange(0, LANES)
            in_dim = lanes < dim
            h = tl.load(hidden + row_at[:, None] * dim + lanes[None, :],
                        mask=in_rows[:, None] & in_dim[None, :], other=0.0)
            w = tl.load(weight + col_at[:, None] * dim + lanes[None, :],
                        mask=in_vocab[:, None] & in_dim[None, :], other=0.0)
            acc = tl.dot(h, tl.trans(w), acc)
        x = acc.to(hidden.dtype.element_ty).to(tl.float32) / temperature
        return tl.where(in_vocab[None, :], x, float("-inf"))

    @triton.jit(do_not_specialize=["rows", "vocab", "per_split"])
    def _logprobs_kernel(hidden, weight, targets, partial, rows, vocab, dim, per_split,
                         temperature, ENTROPY: tl.constexpr, ROWS: tl.constexpr,
                         COLUMNS: tl.constexpr, LANES: tl.constexpr):
        """Program (row tile, split): over the split's per_split columns, each row's running max,
        exp-sum, exp-weighted logit sum (ENTROPY) and target's logit (0 where the target lies in
        another split), into partial [4, splits, rows]."""
        split = tl.program_id(1)
        splits = tl.num_programs(1)
        r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        in_rows = r < rows
        row_at = r.to(tl.int64)
        target = tl.load(targets + r, mask=in_rows, other=-1)
        best = tl.full((ROWS,), float("-inf"), tl.float32)
        total = tl.zeros((ROWS,), tl.float32)
        weighted = tl.zeros((ROWS,), tl.float32)
        chosen = tl.zeros((ROWS,), tl.float32)
        for offset in range(0, per_split, COLUMNS):
            cols = split * per_split + offset + tl.arange(0, COLUMNS)
            x = _logits_tile(hidden, weight, row_at, in_rows, cols, vocab, dim, temperature,
                             ROWS, COLUMNS, LANES)
            newest = tl.maximum(best, tl.max(x, 1))
            shift = tl.where(newest == float("-inf"), 0.0, newest)  # a tile past the vocabulary
            e = tl.exp(x - shift[:, None])
            rescale = tl.exp(best - shift)
            total = total * rescale + tl.sum(e, 1)
            if ENTROPY:
                weighted = weighted * rescale + tl.sum(
                    e * tl.where((cols < vocab)[None, :], x, 0.0), 1)
            chosen += tl.sum(tl.where(cols[None, :] == target[:, None], x, 0.0), 1)
            best = newest
        at = split * rows + r
        tl.store(partial + at, best, mask=in_rows)
        tl.store(partial + splits * rows + at, total, mask=in_rows)
        tl.store(partial + 2 * splits * rows + at, weighted, mask=in_rows)
        tl.store(partial + 3 * splits * rows + at, chosen, mask=in_rows)

    @triton.jit(do_not_specialize=["rows", "vocab"])
    def _dlogits_kernel(hidden, weight, targets, log_z, ent, g_logp, g_ent, out, rows, vocab, dim,
                        temperature, ENTROPY: tl.constexpr, ROWS: tl.constexpr,
                        COLUMNS: tl.constexpr, LANES: tl.constexpr):
        """Program (row tile, vocabulary tile): the tile's logits recomputed, p = exp(x - log_z),
        the logits' gradient (g_logp (onehot - p) - g_ent p (x - log_z + H)) / temperature, stored
        in out's dtype."""
        r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
        in_rows = r < rows
        in_vocab = cols < vocab
        row_at = r.to(tl.int64)
        x = _logits_tile(hidden, weight, row_at, in_rows, cols, vocab, dim, temperature,
                         ROWS, COLUMNS, LANES)
        target = tl.load(targets + r, mask=in_rows, other=-1)
        lz = tl.load(log_z + r, mask=in_rows, other=0.0)
        g = tl.load(g_logp + r, mask=in_rows, other=0.0)
        p = tl.exp(x - lz[:, None])  # 0 past the vocabulary
        d = g[:, None] * (tl.where(cols[None, :] == target[:, None], 1.0, 0.0) - p)
        if ENTROPY:
            h = tl.load(ent + r, mask=in_rows, other=0.0)
            ge = tl.load(g_ent + r, mask=in_rows, other=0.0)
            d -= ge[:, None] * p * (tl.where(in_vocab[None, :], x, 0.0) - lz[:, None]
                                    + h[:, None])
        d = d / temperature
        tl.store(out + row_at[:, None] * vocab + cols[None, :], d.to(out.dtype.element_ty),
                 mask=in_rows[:, None] & in_vocab[None, :])

# -----------------------------------------------------------------------------
# the training forward's RoPE, SiLU·mul and mid-block add + RMSNorm, forward and backward: autograd
# Functions that model.py's forward calls on CUDA in half precision with grad on (fused_training),
# each rounding as the torch ops it replaces round, forward and backward, and saving less

TRAINING_DEVICES = ("cuda",)  # tests add "cpu" for Triton's interpreter
TRAINING_PROBED = {}  # (device, dtype) -> whether the Functions passed their probe in this process
ELEMENTWISE_BLOCK = 1024  # lanes a SiLU·mul or RoPE program takes
NORM_ROWS = 16  # rows an add + RMSNorm backward program takes (it sums their weight gradient)


def fused_training(x) -> bool:
    """Whether model.py runs Rope, SiluMul, AddRMSNorm on x (CUDA training; _probe)."""
    if (triton is None or x.device.type not in TRAINING_DEVICES or not torch.is_grad_enabled()
            or x.dtype not in (torch.bfloat16, torch.float16)):
        return False
    if (x.device, x.dtype) not in TRAINING_PROBED:
        TRAINING_PROBED[x.device, x.dtype] = _probe(x.device, x.dtype)
    return TRAINING_PROBED[x.device, x.dtype]


def _probe(device, dtype) -> bool:
    """Each Function against the torch ops it replaces, values and gradients within 2 roundings of
    dtype, on a small batch; False (said in one line) if one fails or differs. It runs on the first
    forward, so apart from it: no autocast, and its own saved-tensor hooks (a checkpointed block's
    forward counts the tensors it saves, which its recomputation, probing no more, must match)."""
    torch_rope = lambda x, c, s: x * c + torch.cat((-x[..., 4:], x[..., :4]), -1) * s  # noqa: E731
    cases = [(Rope.apply, torch_rope, [(2, 3, 5, 8), (2, 1, 5, 8), (2, 1, 5, 8)], [0]),
             (SiluMul.apply, lambda g, u: F.silu(g) * u, [(3, 40), (3, 40)], [0, 1]),
             (lambda x, y, w: AddRMSNorm.apply(x, y, w, 1e-6),
              lambda x, y, w: (x + y, F.rms_norm(x + y, (24,), w, 1e-6)), [(5, 24), (5, 24), (24,)],
              [0, 1, 2])]
    try:
        with (torch.autocast(device.type, enabled=False),
              torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)):
            for fused, reference, shapes, grads in cases:
                for function in (fused, reference):
                    inputs = [torch.randn(shape, device=device, generator=torch.Generator(device)
                                          .manual_seed(i)).to(dtype).requires_grad_(i in grads)
                              for i, shape in enumerate(shapes)]
                    outputs = function(*inputs)
                    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
                    sum(o.float().sum() for o in outputs).backward()
                    got = [o.float() for o in outputs] + [inputs[i].grad.float() for i in grads]
                    if function is fused:
                        ours = got
                for a, b in zip(ours, got):
                    if not torch.allclose(a, b, rtol=2 * torch.finfo(dtype).eps, atol=1e-3):
                        raise ValueError(f"a fused Function differs from torch by "
                                         f"{(a - b).abs().max().item():.3g}")
    except Exception as error:
        reason = (str(error).strip().splitlines() or [""])[0][:200]
        print(f"kernels.py: the fused training kernels failed their probe ({type(error).__name__}: "
              f"{reason}); going on with the torch ops (RoPE, SiLU·mul, add + RMSNorm), the same "
              "values, more memory and time", file=sys.stderr, flush=True)
        return False
    return True


class Rope(torch.autograd.Function):
    """model.apply_rope's x cos + rotate(x) sin, x [B, H, T, D] (any strides, the last 1), cos /
    sin [B, 1, T, D] (no grad), each product and the sum rounded to x's dtype; the backward's
    g cos + rotate^T(g sin) rounded as autograd rounds it. Saves only cos and sin."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rope(x, cos, sin, transposed=False)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _rope(grad, cos, sin, transposed=True), None, None


def _rope(x, cos, sin, transposed: bool):
    """The rotation of x (transposed: its transpose, the backward's) into a tensor like x."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    B, H, T, D = x.shape
    out = torch.empty_like(x)
    lanes = padded(D)
    heads = min(triton.next_power_of_2(H), max(1, ELEMENTWISE_BLOCK // lanes))  # a program's
    _rope_kernel[(B * T, triton.cdiv(H, heads))](
        x, cos, sin, out, T, H, *x.stride()[:3], *out.stride()[:3], cos.stride(0), cos.stride(2),
        D=D, PADDED=lanes, HEADS=heads, TRANSPOSED=transposed,
        num_warps=max(1, min(4, heads * lanes // 256)))  # 8 lanes a thread where it can
    return out


if triton is not None:
    @triton.jit(do_not_specialize=["T"])
    def _rope_kernel(x, cos, sin, out, T, H, sxb, sxh, sxt, sob, soh, sot, scb, sct,
                     D: tl.constexpr, PADDED: tl.constexpr, HEADS: tl.constexpr,
                     TRANSPOSED: tl.constexpr):
        """Program (b * T + t, block of HEADS heads): their D lanes each. Forward: x c +
        cat(-x2, x1) s; transposed (the backward, x the gradient): x c + cat(u2, -u1), u = x s;
        each product rounded, then the sum. (One head a program moved 2 bytes a lane.)"""
        bt = tl.program_id(0).to(tl.int64)
        b, t = bt // T, bt % T
        heads = (tl.program_id(1) * HEADS + tl.arange(0, HEADS)).to(tl.int64)[:, None]
        cols = tl.arange(0, PADDED)
        both = (cols < D)[None, :] & (heads < H)
        half = D // 2
        partner = (cols + half) % D
        at = x + b * sxb + heads * sxh + t * sxt
        value = tl.load(at + cols[None, :], mask=both, other=0.0)
        other = tl.load(at + partner[None, :], mask=both, other=0.0).to(tl.float32)
        trig = b * scb + t * sct + heads * 0  # cos and sin read as [HEADS, PADDED]: 16-byte loads
        c = tl.load(cos + trig + cols[None, :], mask=both, other=0.0).to(tl.float32)
        first_half = (cols < half)[None, :]
        if TRANSPOSED:  # u at the partner lane, then cat(u2, -u1)
            s = tl.load(sin + trig + partner[None, :], mask=both, other=0.0).to(tl.float32)
            second = (other * s).to(value.dtype).to(tl.float32)
            second = tl.where(first_half, second, -second)
        else:
            s = tl.load(sin + trig + cols[None, :], mask=both, other=0.0).to(tl.float32)
            second = (tl.where(first_half, -other, other) * s).to(value.dtype).to(tl.float32)
        first = (value.to(tl.float32) * c).to(value.dtype).to(tl.float32)
        tl.store(out + b * sob + heads * soh + t * sot + cols[None, :],
                 (first + second).to(value.dtype), mask=both)


class SiluMul(torch.autograd.Function):
    """MLP's silu(gate) * up, gate and up [..., F] in one dtype: silu in fp32 rounded, then the
    product rounded; the backward rounds as autograd does (up's gradient g silu(gate); gate's
    (g up) rounded, times silu's derivative in fp32, rounded). Saves gate and up, not silu(gate)."""

    @staticmethod
    def forward(ctx, gate, up):
        gate, up = gate.contiguous(), up.contiguous()
        ctx.save_for_backward(gate, up)
        out = torch.empty_like(gate)
        _silu_mul_train_kernel[_row_blocks(gate)](gate, up, out, out, out, gate.shape[-1],
                                                   BLOCK=ELEMENTWISE_BLOCK, BACKWARD=False)
        return out

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        grad_gate, grad_up = torch.empty_like(gate), torch.empty_like(up)
        _silu_mul_train_kernel[_row_blocks(gate)](gate, up, grad.contiguous(), grad_gate, grad_up,
                                                   gate.shape[-1], BLOCK=ELEMENTWISE_BLOCK,
                                                   BACKWARD=True)
        return grad_gate, grad_up


def _row_blocks(x):
    """(rows, blocks of a row): a program's lanes lie in one row of x's last dim."""
    return (x.numel() // max(1, x.shape[-1]), triton.cdiv(x.shape[-1], ELEMENTWISE_BLOCK))


if triton is not None:
    @triton.jit
    def _silu_mul_train_kernel(gate, up, grad, out_a, out_b, width, BLOCK: tl.constexpr,
                               BACKWARD: tl.constexpr):
        """Program (row, block): BLOCK elements of a row of width. Forward, out_a = silu(gate) *
        up; backward, out_a = gate's gradient and out_b = up's, from grad. width (the model's
        ffn_dim) is specialised: a multiple of 16, the loads and stores are 16 bytes a lane (with
        the element count unspecialised they were 2, 2.1-2.7x the bytes' time on an H100)."""
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < width
        at = tl.program_id(0).to(tl.int64) * width + cols
        g = tl.load(gate + at, mask=inside, other=0.0)
        u = tl.load(up + at, mask=inside, other=0.0)
        x = g.to(tl.float32)
        sigmoid = 1.0 / (1.0 + tl.exp(-x))
        silu = (x / (1.0 + tl.exp(-x))).to(g.dtype)
        if BACKWARD:
            dy = tl.load(grad + at, mask=inside, other=0.0)
            tl.store(out_b + at, (dy.to(tl.float32) * silu.to(tl.float32)).to(g.dtype),
                     mask=inside)
            d_silu = (dy.to(tl.float32) * u.to(tl.float32)).to(g.dtype).to(tl.float32)
            d_gate = d_silu * sigmoid * (1.0 + x * (1.0 - sigmoid))
            tl.store(out_a + at, d_gate.to(g.dtype), mask=inside)
        else:
            tl.store(out_a + at, (silu.to(tl.float32) * u.to(tl.float32)).to(g.dtype),
                     mask=inside)


class AddRMSNorm(torch.autograd.Function):
    """Block.forward's residual add and the RMSNorm after it, x and y [..., dim], weight [dim] in
    x's dtype: (h = x + y, h / rms(h) * weight), rounded as torch rounds them (add_rms_norm). The
    backward: h's gradient, its own plus the norm's (in fp32, rounded), rounded, for x and y; the
    weight's summed over rows in fp32. Saves h and 1 / rms(h) a row."""

    @staticmethod
    def forward(ctx, x, y, weight, eps):
        shape = x.shape
        x, y = x.reshape(-1, shape[-1]).contiguous(), y.reshape(-1, shape[-1]).contiguous()
        rows, dim = x.shape
        residual, normed = torch.empty_like(x), torch.empty_like(x)
        rstd = torch.empty(rows, device=x.device, dtype=torch.float32)
        _add_rms_norm_kernel[(rows,)](x, y, weight, residual, normed, rstd, dim, eps, HAS_Y=True,
                                      SAVE=True, BLOCK=triton.next_power_of_2(dim))
        ctx.save_for_backward(residual, weight, rstd)
        return residual.view(shape), normed.view(shape)

    @staticmethod
    def backward(ctx, grad_residual, grad_normed):
        residual, weight, rstd = ctx.saved_tensors
        rows, dim = residual.shape
        if grad_residual is None:
            grad_residual = torch.zeros_like(residual)
        grad = torch.empty_like(residual)
        programs = triton.cdiv(rows, NORM_ROWS)
        grad_weight = torch.empty(programs, dim, device=residual.device, dtype=torch.float32)
        _add_rms_norm_backward_kernel[(programs,)](
            residual, weight, rstd, grad_residual.reshape(rows, dim).contiguous(),
            grad_normed.reshape(rows, dim).contiguous(), grad, grad_weight, rows, dim,
            ROWS=NORM_ROWS, BLOCK=triton.next_power_of_2(dim),
            num_warps=max(4, min(16, triton.next_power_of_2(dim) // 512)))  # 4096 lanes: 8
        grad = grad.view(grad_normed.shape)
        return grad, grad, grad_weight.sum(0).to(weight.dtype), None


if triton is not None:
    @triton.jit(do_not_specialize=["rows"])
    def _add_rms_norm_backward_kernel(residual, weight, rstd, grad_residual, grad_normed, grad,
                                      grad_weight, rows, dim, ROWS: tl.constexpr,
                                      BLOCK: tl.constexpr):
        """Program: ROWS rows. Each row's h gradient, gh + round(r (w g) - h r^3 mean(w g h)),
        rounded; the program's share of the weight's gradient, sum of g h r, in fp32."""
        cols = tl.arange(0, BLOCK)
        inside = cols < dim
        w = tl.load(weight + cols, mask=inside, other=0.0).to(tl.float32)
        d_weight = tl.zeros((BLOCK,), tl.float32)
        for i in range(ROWS):
            row = tl.program_id(0).to(tl.int64) * ROWS + i
            here = inside & (row < rows)
            h = tl.load(residual + row * dim + cols, mask=here, other=0.0)
            value = h.to(tl.float32)
            r = tl.load(rstd + row, mask=row < rows, other=0.0)
            g = tl.load(grad_normed + row * dim + cols, mask=here, other=0.0).to(tl.float32)
            wg = w * g
            d_norm = r * wg - value * (r * r * r) * (tl.sum(wg * value, 0) / dim)
            d_norm = d_norm.to(h.dtype).to(tl.float32)
            gh = tl.load(grad_residual + row * dim + cols, mask=here, other=0.0).to(tl.float32)
            tl.store(grad + row * dim + cols, (gh + d_norm).to(h.dtype), mask=here)
            d_weight += g * value * r
        tl.store(grad_weight + tl.program_id(0).to(tl.int64) * dim + cols, d_weight, mask=inside)
