"""Issue 56: the decode step's Triton kernels (kernels.py) and the sampling one (sample._gumbel_kernel), each run on the
CPU by Triton's interpreter against the torch code it replaces; a whole fused decode step against the model's forward;
the kernels a fused step launches; a kernel that fails falling back to the torch forward.

The interpreter departs from compiled Triton in two ways, which run_interpreted puts right first, following the
compiled rules (the interpreter is triton/runtime/interpreter.py, triton 3.6):
- InterpreterBuilder.cast_impl turns fp32 into bf16 by dropping the low 16 bits (_convert_float with no rounding
  mode); a compiled kernel's fp32 -> bf16 cast (arith.truncf, PTX cvt.rn.bf16.f32) rounds to nearest even, as torch
  does. Patched: round to nearest even (NaN stays NaN).
- a scalar is a one-element array there, and its __index__ (_patch_lang_tensor) calls int() on it, which numpy 2.4
  refuses for an array of one dimension: a loop whose bound is a kernel argument fails. Patched: the array's element.
- InterpreterBuilder.create_dot multiplies bf16 operands as the uint16 arrays that hold their bits (numpy has no
  bf16): a tl.dot of bf16 tiles gives numbers of 1e10. Compiled, a bf16 MMA multiplies the values exactly and sums
  in fp32. Patched: bf16 operands widened to their fp32 values (exact) before the product.
"""
import importlib.util
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import kernels
import sample
from model import KVCache, ModelConfig, Transformer, apply_rope
from test_sample import PROMPTS, full_forward_logprobs, tiny_model

NEEDS_TRITON = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="needs triton (pip install triton, in requirements-test.txt) to run the "
                                         "CUDA kernels on the CPU in Triton's interpreter")


def patch_interpreter():
    """The two corrections of the module docstring, applied to this process's interpreter."""
    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interpreter
    real_cast, real_patch = interpreter.InterpreterBuilder.cast_impl, interpreter._patch_lang_tensor

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            value = np.ascontiguousarray(src.data, dtype=np.float32)
            bits = value.view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            rounded[np.isnan(value)] = 0x7FC0
            return interpreter.TensorHandle(rounded, dst_type.scalar)
        return real_cast(self, src, dst_type)

    def patch_tensor(tensor, scope):
        real_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def widened(x):
            if x.dtype.scalar != tl.bfloat16:
                return x
            bits = np.ascontiguousarray(x.data, dtype=np.uint16).astype(np.uint32) << 16
            return interpreter.TensorHandle(bits.view(np.float32), tl.float32)
        return real_dot(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)
    real_dot = interpreter.InterpreterBuilder.create_dot
    interpreter.InterpreterBuilder.create_dot = create_dot
    interpreter.InterpreterBuilder.cast_impl = cast_impl
    interpreter._patch_lang_tensor = patch_tensor


def run_interpreted(check: str):
    """Run test_kernels.<check>() in a fresh process under TRITON_INTERPRET=1 (set before triton is imported)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join([os.path.dirname(tests), tests] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    code = f"import test_kernels; test_kernels.patch_interpreter(); test_kernels.{check}()"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path})
    assert run.returncode == 0, run.stderr[-4000:]


@NEEDS_TRITON
@pytest.mark.parametrize("check", ["check_add_rms_norm", "check_silu_mul", "check_rope_and_cache",
                                   "check_decode_attention", "check_gumbel_sampling", "check_fused_record",
                                   "check_decode_step", "check_training_functions",
                                   "check_fused_generate", "check_fused_logprobs"])
def test_each_kernel_computes_what_its_torch_code_computes(check):
    run_interpreted(check)

# -----------------------------------------------------------------------------
# the checks, each run by run_interpreted


def check_add_rms_norm():
    """Bit for bit: the residual add and the RMSNorm of torch's bf16 (a width of 96: masked lanes)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=8, dim=96, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=48,
                                    ffn_dim=8, max_seq_len=8)).bfloat16()
    norm = model.layers[0].attn_norm
    norm.weight.data = (1 + 0.3 * torch.randn(96)).bfloat16()
    x, y = torch.randn(7, 96).bfloat16(), 3 * torch.randn(7, 96).bfloat16()
    residual, normed = kernels.add_rms_norm(x, y, norm)
    assert torch.equal(residual, x + y) and torch.equal(normed, norm(x + y))
    residual, normed = kernels.add_rms_norm(x, None, norm)
    assert torch.equal(residual, x) and torch.equal(normed, norm(x))


def check_silu_mul():
    torch.manual_seed(0)
    gate_up = 4 * torch.randn(5, 2 * 1100).bfloat16()  # two blocks of 1024, the second partial
    assert torch.equal(kernels.silu_mul(gate_up), F.silu(gate_up[:, :1100]) * gate_up[:, 1100:])


def check_rope_and_cache():
    """Bit for bit with apply_rope and KVCache.update: the rotated queries, the rotated keys and the values at the
    slot; the cache's other slots untouched. A head of 16, and heads of 8 and 48 padded to 16 and 64 lanes."""
    for d in (16, 8, 48):
        check_rope_and_cache_at(d)


def check_rope_and_cache_at(d):
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=8, dim=32, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=d, ffn_dim=8,
                         max_seq_len=64)
    b, heads, kv = 5, 6, 2
    qkv = 2 * torch.randn(b, (heads + 2 * kv) * d).bfloat16()
    positions = torch.tensor([3, 7, 11, 2, 40])
    freqs = positions[:, None].float() * Transformer(config).inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().bfloat16(), emb.sin().bfloat16()
    cache = KVCache(config, b, 48, dtype=torch.bfloat16)
    cache.k.normal_()
    cache.v.normal_()
    before, before_v = cache.k.clone(), cache.v.clone()
    q = kernels.rope_and_cache(qkv, cos, sin, cache.k[1], cache.v[1], torch.tensor(9), config)
    q_ref, k_ref, v_ref = qkv.view(b, 1, heads + 2 * kv, d).split((heads, kv, kv), dim=2)
    rotated = apply_rope(torch.cat((q_ref, k_ref), dim=2).transpose(1, 2), cos[:, None, None], sin[:, None, None])
    assert torch.equal(q, rotated[:, :heads, 0])
    assert torch.equal(cache.k[1, :, :, 9], rotated[:, heads:, 0]) and torch.equal(cache.v[1, :, :, 9], v_ref[:, 0])
    untouched = torch.ones(48, dtype=torch.bool)
    untouched[9] = False
    assert torch.equal(cache.k[:, :, :, untouched], before[:, :, :, untouched]) and torch.equal(cache.k[0], before[0])
    assert torch.equal(cache.v[:, :, :, untouched], before_v[:, :, :, untouched]) and torch.equal(cache.v[0], before_v[0])


def check_decode_attention():
    """Against scaled_dot_product_attention in fp32 under the additive mask of the rows' real slots (start .. slot):
    within bf16's rounding of the output, with the key range in one piece and cut in splits (combined), for grouped
    heads (3 queries a kv head) and plain ones; a head of 8, padded to 16 lanes."""
    torch.manual_seed(0)
    b, slots = 5, 256
    starts, slot = torch.tensor([0, 3, 80, 1, 140]), torch.tensor(150)
    mask = torch.full((b, 1, 1, slots), float("-inf"))
    for row in range(b):
        mask[row, 0, 0, starts[row]:slot + 1] = 0
    for heads, kv, d in ((6, 2, 16), (4, 4, 16), (6, 2, 8)):
        q = torch.randn(b, heads, d).bfloat16()
        k, v = (torch.randn(b, kv, slots, d).bfloat16() for _ in range(2))
        exact = F.scaled_dot_product_attention(q.view(b, kv, heads // kv, d).float(), k.float(), v.float(),
                                               attn_mask=mask).reshape(b, heads * d)
        for programs, attend in ((1, 152), (10_000, 152), (10_000, 256)):
            # 1: one piece; 10,000 with splits of at least a block: 4 splits of 64 slots, of the 152 (the last empty)
            # or the 256
            kernels.SPLIT_BELOW_PROGRAMS, kernels.SPLIT_KEYS = programs, kernels.BLOCK_KEYS
            out = kernels.decode_attention(q, k, v, starts, slot, attend)
            assert (out.float() - exact).abs().max() <= 2 ** -8 * exact.abs().max(), (heads, d, programs, attend)


def check_gumbel_sampling():
    """sample._gumbel_kernel against torch on the kernel's own Philox uniforms (drawn by tl.rand4x at the same
    counters): the noisy argmax's id, and log_softmax(logits / T) there; a vocabulary that is no multiple of 4 nor of
    the block; a NaN row gets an id inside the vocabulary and a NaN log-prob, as the torch path's."""
    import triton
    import triton.language as tl

    @triton.jit
    def uniforms(seed, out, quads, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        quad = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        u0, u1, u2, u3 = tl.rand4x(tl.load(seed), (row * quads + quad).to(tl.int32))
        inside = quad < quads
        base = out + row * quads * 4 + quad * 4
        tl.store(base, u0, mask=inside)
        tl.store(base + 1, u1, mask=inside)
        tl.store(base + 2, u2, mask=inside)
        tl.store(base + 3, u3, mask=inside)

    torch.manual_seed(0)
    rows, vocab, temperature = 4, 1001, 0.8
    logits = (3 * torch.randn(rows, vocab)).bfloat16()
    logits[3] = float("nan")
    quads = -(-vocab // 4)
    seed = torch.randint(2**31 - 1, (1,), generator=torch.Generator().manual_seed(7))  # as _fused_gumbel_sample draws
    u = torch.empty(rows, quads * 4)
    uniforms[(rows, triton.cdiv(quads, 64))](seed, u, quads, BLOCK=64)
    x = logits.float() * (1 / temperature)
    noisy = x - (-u[:, :vocab].log()).log()
    for split in (256, sample.GUMBEL_SPLIT):  # 4 splits (the last 233 columns), or the whole row in one
        ids, logprobs = sample._fused_gumbel_sample(logits, temperature, torch.Generator().manual_seed(7), block=256,
                                                    split=split)
        assert torch.equal(ids[:3], noisy[:3].argmax(-1)), split
        torch.testing.assert_close(logprobs[:3], x[:3].log_softmax(-1).gather(-1, ids[:3, None])[:, 0], atol=1e-5,
                                   rtol=0)
        assert 0 <= ids[3] < vocab and logprobs[3].isnan()


def check_fused_record():
    """Issue 63 item 3: _Decoder.record's bookkeeping folded into the fused sampling's combine, against record's torch
    code given the ids the kernels drew: each id and log-prob at the row's slot (rows compacted: the decoder's rows
    4, 1, 3 of 5), the recent ids shifted, a stop sequence ending there (one of one id, one of three right-aligned
    with -1 padding, and none with no stop table), the row's last id; nothing else written."""
    torch.manual_seed(0)
    vocab = 300
    for stop in (torch.tensor([[-1, -1, 5], [3, 9, 7]]), torch.full((0, 1), -1)):
        decoder = SimpleNamespace(
            rows=torch.tensor([4, 1, 3]), slot=torch.tensor(6), tokens=torch.zeros(5, 12, dtype=torch.long),
            logprobs=torch.zeros(5, 12), stops=torch.zeros(5, 12, dtype=torch.bool), stop=stop,
            recent=torch.tensor([[1, 3, 9], [4, 4, 4], [-1, 3, 9]])[:, -stop.shape[1]:].clone(),
            last=torch.zeros(3, dtype=torch.long), generator=torch.Generator().manual_seed(1))
        logits = torch.randn(3, vocab).bfloat16()
        logits[:, 7] = 30  # id 7 all but certain: the last of the longer stop
        before = {name: getattr(decoder, name).clone() for name in ("tokens", "logprobs", "stops", "recent")}
        sample._fused_gumbel_sample(logits, 1.0, decoder.generator, split=128, decoder=decoder)
        ids = decoder.last
        assert ids.tolist() == [7, 7, 7]
        expected_logp = logits.float().log_softmax(-1).gather(-1, ids[:, None])[:, 0]
        recent = torch.cat([before["recent"][:, 1:], ids[:, None]], dim=1)
        ends = ((recent[:, None] == stop) | (stop < 0)).all(-1).any(-1)
        assert torch.equal(decoder.recent, recent)
        for name, value in (("tokens", ids), ("logprobs", expected_logp), ("stops", ends)):
            want = before[name].clone()
            want[decoder.rows, 6] = value.to(want.dtype)
            torch.testing.assert_close(getattr(decoder, name), want, atol=1e-5, rtol=0)
        assert ends.tolist() == ([True, False, True] if len(stop) else [False] * 3)


def check_training_functions():
    """Issue 63 item 4: kernels.Rope, SiluMul and AddRMSNorm against the torch ops they replace under torch's autograd,
    in bf16: the values and every gradient (the weight's included), on shapes with masked lanes (a head of 12 padded
    to 16, heads in blocks of 8 with the last part-filled, a width of 40, 3 rows of ragged blocks). Rope and SiluMul
    round as torch does, forward and backward: bit for bit; AddRMSNorm's forward bit for bit, its gradients (sums in
    other orders) within one bf16 rounding. Rope takes a transposed view (q and k as Attention.forward hands them
    over) and keeps its strides. And fused_training's probe passes here (first inside a checkpointed block) and
    refuses a Function that is wrong."""
    torch.manual_seed(0)
    bf16 = torch.bfloat16

    def both(fused, reference, *shapes, grad_of=None, transposed=False):
        results = []
        for function in (fused, reference):
            inputs = [torch.randn(*shape, generator=torch.Generator().manual_seed(i)).to(bf16) for i, shape in
                      enumerate(shapes)]
            if transposed:  # [B, T, H, D] memory seen as [B, H, T, D]
                inputs[0] = inputs[0].transpose(1, 2)
            for i in grad_of:
                inputs[i].requires_grad_(True)
            outputs = function(*inputs)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            weights = [torch.randn(o.shape, generator=torch.Generator().manual_seed(9 + j)).to(bf16)
                       for j, o in enumerate(outputs)]
            sum((o.float() * w.float()).sum() for o, w in zip(outputs, weights)).backward()
            results.append([o.detach() for o in outputs] + [inputs[i].grad for i in grad_of])
        return results

    def torch_rope(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin
    ours, theirs = both(kernels.Rope.apply, torch_rope, (2, 5, 3, 12), (2, 1, 5, 12), (2, 1, 5, 12), grad_of=[0],
                        transposed=True)
    assert ours[0].stride() == theirs[0].stride()
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    ours, theirs = both(kernels.Rope.apply, torch_rope, (1, 3, 20, 128), (1, 1, 3, 128), (1, 1, 3, 128), grad_of=[0],
                        transposed=True)  # 20 heads of 128 lanes: three programs of 8 heads, the last with 4
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    ours, theirs = both(kernels.SiluMul.apply, lambda g, u: F.silu(g) * u, (3, 7, 40), (3, 7, 40), grad_of=[0, 1])
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    ours, theirs = both(lambda x, y, w: kernels.AddRMSNorm.apply(x, y, w, 1e-6),
                        lambda x, y, w: (x + y, F.rms_norm(x + y, (40,), w, 1e-6)),
                        (3, 7, 40), (3, 7, 40), (40,), grad_of=[0, 1, 2])
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.float(), b.float(), rtol=2 ** -7, atol=1e-6)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])  # the forward: bit for bit

    kernels.TRAINING_DEVICES = ("cuda", "cpu")
    assert kernels.fused_training(torch.zeros(2, dtype=bf16))
    assert not kernels.fused_training(torch.zeros(2))  # fp32 keeps the torch ops
    with torch.no_grad():
        assert not kernels.fused_training(torch.zeros(2, dtype=bf16))
    kernels.TRAINING_PROBED.clear()  # the first use inside a checkpointed block under autocast (a lean run's first
    model = tiny_model().bfloat16().train()  # forward) probes apart: its recomputation saves the tensors its forward saved
    model.grad_checkpointing = True
    with torch.autocast("cpu", dtype=bf16):
        model(torch.tensor([PROMPTS[0]])).float().sum().backward()
    assert kernels.TRAINING_PROBED[torch.device("cpu"), bf16] and model.lm_head.weight.grad is not None
    real = kernels.SiluMul.forward
    kernels.SiluMul.forward = staticmethod(lambda ctx, gate, up: real(ctx, gate, up) * 1.5)
    assert not kernels._probe(torch.device("cpu"), bf16)
    kernels.SiluMul.forward = real


def fused_tiny_model(**overrides):
    """tiny_model in bf16 with fused projections: the sampler's copy (q/k/v biases, grouped heads)."""
    return tiny_model(**overrides).bfloat16().fuse_projections()


def check_decode_step():
    """One fused decode step against the model's own decode step (its forward with a cache and the additive mask), on
    a cache a prefill filled, for Qwen2's shape (q/k/v biases) and Qwen3's (q/k norms), and with heads of 8 (padded
    to 16 lanes): the keys and values written, and the final hidden states, within bf16's rounding (attention and the
    matrix products sum in other orders)."""
    for overrides in ({}, {"qkv_bias": False, "qk_norm": True}, {"head_dim": 8}):
        model = fused_tiny_model(**overrides)
        ids = torch.tensor([[0, 0, 5, 17, 3], [8, 1, 90, 33, 2]])
        real = ids != 0
        real[1, :] = True
        caches = [KVCache(model.config, 2, 16, dtype=torch.bfloat16) for _ in range(2)]
        with torch.no_grad():
            for cache in caches:
                model(ids, attention_mask=torch.cat((real, torch.zeros(2, 11, dtype=torch.bool)), -1), cache=cache,
                      return_hidden=True)
            last, positions, slot = torch.tensor([7, 9]), real.sum(-1), torch.tensor(5)
            mask = torch.full((2, 1, 1, 16), float("-inf"), dtype=torch.bfloat16)
            mask[..., :5].masked_fill_(real[:, None, None], 0.0)
            mask[..., 5] = 0.0
            eager = model(last[:, None], positions=positions[:, None], attention_mask=mask, cache=caches[0],
                          cache_index=slot, return_hidden=True)[:, 0]
            fused = kernels.decode_step(model, last, positions, slot, 5 - real.sum(-1), caches[1], 16)
        for ours, theirs in ((fused, eager), (caches[1].k[:, :, :, 5], caches[0].k[:, :, :, 5]),
                             (caches[1].v[:, :, :, 5], caches[0].v[:, :, :, 5])):
            assert (ours.float() - theirs.float()).abs().max() <= 0.05 * theirs.float().abs().max(), overrides


def check_fused_generate():
    """generate with the fused decode kernels (the CPU made a fast-path device, kernels.possible told yes): its
    log-probs equal a full no-cache forward of the tokens it drew, within bf16's rounding, with early stops and the
    batch compacted; a fused step launches 4 matrix products and 5 kernels a layer (2 layers); and a kernel that
    fails falls back to the torch forward, saying so once, with that forward's tokens."""
    sample.FAST_PATH_DEVICES = ("cuda", "cpu")
    kernels.possible = lambda model, device: True
    model = fused_tiny_model()
    sample.CHECK_EVERY = 4
    out = sample.generate(model, PROMPTS, 24, temperature=1.0, seed=3, stop_ids=[5], cuda_graphs=False,
                          fused_sampling=False)
    assert out.fast_paths == {"fused_decode": True} and not sample.FALLEN_BACK
    lengths = out.lengths.tolist()
    completions = [out.tokens[i, :n].tolist() for i, n in enumerate(lengths)]
    for row, expected in enumerate(full_forward_logprobs(model, PROMPTS, completions, 1.0)):
        assert (out.logprobs[row, :lengths[row]] - expected).abs().max() < 0.1, row

    # the fused sampling too, its combine doing record's bookkeeping: the same log-probs, each row ending at its
    # first stop (one id, or two)
    out = sample.generate(model, PROMPTS, 24, temperature=1.0, seed=3, stop_ids=[5], stop_sequences=[[9, 4]],
                          cuda_graphs=False)
    assert out.fast_paths == {"fused_sampling": True, "fused_decode": True} and not sample.FALLEN_BACK
    assert out.stopped.any() and not out.stopped.all()
    lengths = out.lengths.tolist()
    completions = [out.tokens[i, :n].tolist() for i, n in enumerate(lengths)]
    for row, expected in enumerate(full_forward_logprobs(model, PROMPTS, completions, 1.0)):
        assert (out.logprobs[row, :lengths[row]] - expected).abs().max() < 0.1, row
    for tokens, stopped in zip(completions, out.stopped.tolist()):
        ends = [n for n in range(1, len(tokens) + 1) if tokens[n - 1] == 5 or tokens[max(0, n - 2):n] == [9, 4]]
        assert ends[:1] == ([len(tokens)] if stopped else []) and (stopped or len(tokens) == 24), tokens

    launches = []
    for name in ("_add_rms_norm_kernel", "_silu_mul_kernel", "_rope_cache_kernel", "_decode_attention_kernel",
                 "_combine_splits_kernel"):
        kernel = getattr(kernels, name)
        setattr(kernels, name, Counted(kernel, name, launches))
    real_linear = F.linear
    kernels.F = type("F", (), {"linear": staticmethod(lambda *a: launches.append("linear") or real_linear(*a))})
    cache = KVCache(model.config, 3, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        kernels.decode_step(model, torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6]), torch.tensor(6),
                            torch.tensor([0, 1, 2]), cache, 16)
    per_layer = sorted(launches[1:])  # the first norm comes before the layers
    assert launches[0] == "_add_rms_norm_kernel" and len(per_layer) == 2 * 9, launches
    assert per_layer.count("linear") == 2 * 4 and per_layer.count("_decode_attention_kernel") == 2

    def failing(*args, **kwargs):
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")
    kernels.decode_step = failing
    plain = sample.generate(model, PROMPTS, 12, temperature=1.0, seed=5, cuda_graphs=False, fused_sampling=False,
                            fused_decode=False)
    for _ in range(2):
        out = sample.generate(model, PROMPTS, 12, temperature=1.0, seed=5, cuda_graphs=False, fused_sampling=False)
        assert torch.equal(out.tokens, plain.tokens) and torch.equal(out.logprobs, plain.logprobs)
        assert out.fast_paths == {"fused_decode": False}
    assert sample.FALLEN_BACK[sample.FUSED_DECODE].startswith("sample.py: the fused decode kernels failed to compile")


class RoundedHead(torch.nn.Module):
    """lm_head as autocast runs it in bf16, in fp32 arithmetic: each logit summed in fp32, rounded to bf16 (and the
    logits' gradient rounded to bf16 on its way back)."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, hidden):
        return F.linear(hidden, self.weight).bfloat16()


def check_fused_logprobs():
    """Issue 63 item 4: kernels.fused_logprobs against update.chunk_logprobs and torch's autograd, on 5 rows of 32
    lanes and a vocabulary of 100 (tiles of 32 columns: the last one 4 wide; of 16 lanes: two steps), in one
    vocabulary split and in 4, and in the default tiles (one ragged tile of 128); temperatures 1 and 0.7; without
    the entropy, with it ("sum": no grad) and with its grad ("tokens"). Against the reference in fp32 the log-probs
    and entropies lie within 2^-8 of the largest |logit / T| (each logit rounded to bf16 moves by at most 2^-9 of
    itself, and a log-prob or an entropy by twice that), the gradients within the same fraction of their largest;
    against the reference with autocast's roundings (RoundedHead: what it computes on CUDA today) the values agree
    to 2e-6 and the bf16 gradients within bf16's rounding (2^-8 of the largest). The gradients come back bf16."""
    import update
    torch.manual_seed(0)
    rows, dim, vocab = 5, 32, 100
    weight, hidden = (0.5 * torch.randn(vocab, dim)).bfloat16(), torch.randn(rows, dim).bfloat16()
    targets = torch.randint(vocab, (rows,))
    defaults = kernels.LOGPROB_ROWS, kernels.LOGPROB_COLUMNS, kernels.LOGPROB_LANES, kernels.LOGPROB_PROGRAMS
    for tiles in ((16, 32, 16, 1), (16, 32, 16, 10_000), defaults):
        kernels.LOGPROB_ROWS, kernels.LOGPROB_COLUMNS, kernels.LOGPROB_LANES, kernels.LOGPROB_PROGRAMS = tiles
        for temperature in (1.0, 0.7):
            largest = (hidden.float() @ weight.float().T / temperature).abs().max().item()
            for entropy in (None, "sum", "tokens"):
                g_logp, g_ent = torch.randn(rows), torch.randn(rows)
                results = []
                for head in ("fused", "fp32", "rounded"):
                    h = (hidden.clone() if head == "fused" else hidden.float()).requires_grad_()
                    w = (weight.clone() if head == "fused" else weight.float()).requires_grad_()
                    if head == "fused":
                        logp, ent = kernels.fused_logprobs(h, w, targets, temperature, entropy)
                    else:
                        lm_head = torch.nn.Linear(dim, vocab, bias=False) if head == "fp32" else RoundedHead(None)
                        lm_head.weight = w if head == "rounded" else torch.nn.Parameter(w)
                        logp, ent = update.chunk_logprobs(lm_head, h, targets, temperature, entropy)
                        w = lm_head.weight
                    loss = (logp * g_logp).sum() + ((ent * g_ent).sum() if entropy == "tokens" else 0)
                    loss.backward()
                    results.append((logp, ent, h.grad, w.grad))
                (logp, ent, grad_h, grad_w), fp32, rounded = results
                assert grad_h.dtype == grad_w.dtype == torch.bfloat16 and logp.dtype == torch.float32
                assert (ent is None) == (entropy is None) and (ent is None or ent.requires_grad == (entropy == "tokens"))
                for ours, theirs, bound in ((logp, fp32[0], 2 ** -8 * largest), (logp, rounded[0], 2e-6),
                                            (ent, fp32[1], 2 ** -8 * largest), (ent, rounded[1], 2e-6)):
                    if ours is not None:
                        assert (ours - theirs).abs().max() <= bound, (tiles, temperature, entropy)
                for ours, theirs, fraction in ((grad_h, fp32[2], 2 ** -8 * largest), (grad_w, fp32[3], 2 ** -8 * largest),
                                               (grad_h, rounded[2], 2 ** -8), (grad_w, rounded[3], 2 ** -8)):
                    assert (ours.float() - theirs).abs().max() <= fraction * theirs.abs().max(), (tiles, temperature,
                                                                                                  entropy)
    check_fused_completion_logprobs()  # in the same process: one interpreter start less


def check_fused_completion_logprobs():
    """update.completion_logprobs through the fused kernel (the CPU made a fused device, under autocast's bf16): the
    log-probs, entropies and the policy's gradients of a micro-batch of the tiny model equal the torch path's under
    the same autocast within bf16's rounding, the lm_head's gradient fp32 (the master weights'); the chunks run no
    checkpoint (nothing to recompute: the kernel saves the hidden states and one number a row). A kernel that fails
    falls back to the torch path, saying so once, with its values bit for bit."""
    import update
    from test_sample import tiny_model
    kernels.LOGPROB_DEVICES = ("cuda", "cpu")
    model = tiny_model()
    batch = update.make_micro_batches(PROMPTS, [[5, 9, 2], [7], [3, 3, 8, 1, 4], [60, 2]], 4, 0, "cpu")[0]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16)
    results, calls = [], []
    real_fused, real_checkpoint = kernels.fused_logprobs, update.checkpoint
    kernels.fused_logprobs = lambda *args: calls.append("fused") or real_fused(*args)
    update.checkpoint = lambda *args, **kwargs: calls.append("checkpoint") or real_checkpoint(*args, **kwargs)
    for fused in (True, False):
        kernels.LOGPROB_DEVICES = ("cuda", "cpu") if fused else ("cuda",)
        model.zero_grad()
        with autocast:
            logp, ent = update.completion_logprobs(model, batch, 0.7, 4, "tokens")
        assert calls == ["fused" if fused else "checkpoint"] * 3, calls  # 11 tokens, chunks of 4
        calls.clear()
        assert logp.dtype == ent.dtype == torch.float32
        ((logp * batch.mask).sum() + (ent * batch.mask).sum()).backward()
        results.append((logp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (logp, ent, grads), (logp_t, ent_t, grads_t) = results
    assert (logp - logp_t).abs().max() < 2e-5 and (ent - ent_t).abs().max() < 2e-5
    assert grads["lm_head.weight"].dtype == torch.float32
    for name, grad in grads.items():
        assert (grad - grads_t[name]).abs().max() <= 2 ** -7 * grads_t[name].abs().max(), name

    kernels.LOGPROB_DEVICES = ("cuda", "cpu")
    update.checkpoint = real_checkpoint

    def failing(*args, **kwargs):
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")
    kernels.fused_logprobs = failing
    with torch.no_grad(), autocast:
        for _ in range(2):
            logp, _ = update.completion_logprobs(model, batch, 0.7, 4)
            assert torch.equal(logp, results[1][0])
    assert len(update.FALLEN_BACK) == 1 and update.FALLEN_BACK[0].startswith(
        "update.py: the fused log-prob kernel failed (RuntimeError: Failed to find C compiler")


class Counted:
    """A Triton kernel whose launches append its name to a list."""

    def __init__(self, kernel, name, launches):
        self.kernel, self.name, self.launches = kernel, name, launches

    def __getitem__(self, grid):
        self.launches.append(self.name)
        return self.kernel[grid]

# -----------------------------------------------------------------------------
# Issue 63: every Triton kernel compiled to a cubin for the GPUs it runs on, on the CPU. The interpreter above checks
# what a kernel computes, not whether it compiles: on an H200 the attention kernel failed to compile for a model of
# head_dim 8 (tl.dot's inner dimension is at least 16 on NVIDIA GPUs; tl.arange takes powers of two), which the
# interpreter had run. Here Triton's own pipeline (triton.compile: TTIR, TTGIR, LLVM IR, PTX, then a cubin by the
# ptxas bundled in triton/backends/nvidia/bin) compiles each kernel as a launch would: the arguments of the kernels'
# own wrappers at each architecture's shapes, specialised by Triton's own binder for an sm_80 (A100) or sm_90
# (H100, H200) target, each distinct specialisation once.

# config.json's hidden_size, num_attention_heads, num_key_value_heads, head_dim (hidden / heads where absent),
# intermediate_size and vocab_size of every architecture the project loads, then the project's own models
ARCHITECTURES = {
    "Qwen2.5-0.5B": (896, 14, 2, 64, 4864, 151936),
    "Qwen2.5-1.5B": (1536, 12, 2, 128, 8960, 151936),
    "Qwen2.5-7B": (3584, 28, 4, 128, 18944, 152064),
    "Qwen3-0.6B": (1024, 16, 8, 128, 3072, 151936),
    "Qwen3-1.7B": (2048, 16, 8, 128, 6144, 151936),
    "Qwen3-4B": (2560, 32, 8, 128, 9728, 151936),
    "Llama-3.2-1B": (2048, 32, 8, 64, 8192, 128256),
    "Llama-3.2-3B": (3072, 24, 8, 128, 8192, 128256),
    "SmolLM2-135M": (576, 9, 3, 64, 1536, 49152),
    "SmolLM2-360M": (960, 15, 5, 64, 2560, 49152),
    "SmolLM2-1.7B": (2048, 32, 32, 64, 8192, 49152),
    "test_sample.tiny_model": (64, 4, 2, 16, 112, 97),
    "test_guards.tiny (char)": (16, 2, 1, 8, 32, 98),  # the one that failed on the H200
    "configs/demo.py (char)": (64, 4, 2, 16, 176, 98),
    "head_dim 4 (test_model)": (16, 4, 2, 4, 32, 50),
    "head_dim 48 (check_add_rms_norm)": (96, 2, 1, 48, 8, 8),
    "test_gpu's graphs model": (128, 4, 2, 32, 256, 512),
    "bench.py --tiny": (64, 4, 2, 16, 128, 512),
}
TARGETS = {"sm_80": 80, "sm_90": 90}
LONGEST_ATTENDED = 4096  # cache slots: every split count up to this many slots' is compiled
# the most shared memory a block may use (bytes), by target: an A100's 163 KB and an H100's 227 KB
SHARED_MEMORY = {80: 166912, 90: 232448}


class Launches:
    """Stands for a Triton kernel: each launch is recorded (the kernel, its arguments), nothing runs."""

    def __init__(self, kernel, calls):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.kernel, args, kwargs))


def recorded_launches(architecture) -> list:
    """(kernel, args, kwargs) of every launch that a decode step and the fused sampling make at an architecture's
    shapes (ARCHITECTURES), for each split count the attention can take up to LONGEST_ATTENDED slots, with CPU
    tensors standing for CUDA ones (a launch reads their dtype, shape and address alone)."""
    from model import RMSNorm
    dim, heads, kv_heads, head_dim, ffn_dim, vocab = architecture
    config = ModelConfig(vocab_size=vocab, dim=dim, n_layers=1, n_heads=heads, n_kv_heads=kv_heads,
                         head_dim=head_dim, ffn_dim=ffn_dim, max_seq_len=LONGEST_ATTENDED)
    calls, bf16 = [], torch.bfloat16
    names = ("_add_rms_norm_kernel", "_silu_mul_kernel", "_rope_cache_kernel", "_decode_attention_kernel",
             "_combine_splits_kernel")
    real = {name: getattr(kernels, name) for name in names}
    sampling = ("_gumbel_kernel", "_gumbel_combine_kernel")
    real_sampling = {name: getattr(sample, name) for name in sampling}
    try:
        for name in names:
            setattr(kernels, name, Launches(real[name], calls))
        for name in sampling:
            setattr(sample, name, Launches(real_sampling[name], calls))
        x, norm = torch.zeros(2, dim, dtype=bf16), RMSNorm(dim, 1e-6).bfloat16()
        kernels.add_rms_norm(x, None, norm)
        kernels.add_rms_norm(x, x, norm)
        kernels.silu_mul(torch.zeros(2, 2 * ffn_dim, dtype=bf16))
        cache = torch.zeros(1, dtype=bf16).expand(256, kv_heads, LONGEST_ATTENDED, head_dim)  # no memory
        slot = torch.tensor(5)
        for rows in (256, 128, 64, 32, 16, 8, 4, 2, 1):  # every split count from 1 up
            qkv = torch.zeros(rows, (heads + 2 * kv_heads) * head_dim, dtype=bf16)
            cos = torch.zeros(rows, head_dim, dtype=bf16)
            q = kernels.rope_and_cache(qkv, cos, cos, cache[:rows], cache[:rows], slot, config)
            kernels.decode_attention(q, cache[:rows], cache[:rows], torch.zeros(rows, dtype=torch.long), slot,
                                     LONGEST_ATTENDED)
        logits, generator = torch.zeros(256, vocab, dtype=bf16), torch.Generator().manual_seed(0)
        sample._fused_gumbel_sample(logits, 1.0, generator)
        for stop in (torch.zeros(2, 5, dtype=torch.long), torch.zeros(0, 1, dtype=torch.long)):  # the bookkeeping
            decoder = SimpleNamespace(rows=torch.zeros(256, dtype=torch.long), slot=slot,
                                      tokens=torch.zeros(256, 1000, dtype=torch.long), logprobs=torch.zeros(256, 1000),
                                      stops=torch.zeros(256, 1000, dtype=torch.bool),
                                      recent=torch.zeros(1, stop.shape[1], dtype=torch.long).expand(256, -1),
                                      last=torch.zeros(256, dtype=torch.long), stop=stop)
            sample._fused_gumbel_sample(logits, 1.0, generator, decoder=decoder)
    finally:
        for name in names:
            setattr(kernels, name, real[name])
        for name in sampling:
            setattr(sample, name, real_sampling[name])
    return calls


def recorded_training_launches(architecture) -> list:
    """(kernel, args, kwargs) of the launches of the training Functions (kernels.Rope, SiluMul, AddRMSNorm), forward
    and backward, at an architecture's shapes, for sequences of 512 and 500 tokens (strides divisible by 16 or not),
    on CPU tensors standing for CUDA ones; nothing runs."""
    dim, heads, kv_heads, head_dim, ffn_dim, _ = architecture
    calls, bf16 = [], torch.bfloat16
    names = ("_rope_kernel", "_silu_mul_train_kernel", "_add_rms_norm_kernel", "_add_rms_norm_backward_kernel")
    real = {name: getattr(kernels, name) for name in names}
    ctx = SimpleNamespace(save_for_backward=lambda *tensors: setattr(ctx, "saved_tensors", tensors))
    try:
        for name in names:
            setattr(kernels, name, Launches(real[name], calls))
        for tokens in (512, 500):
            qk = torch.empty(1, tokens, heads + kv_heads, head_dim, dtype=bf16).transpose(1, 2)  # as Attention's
            cos = torch.empty(1, 1, tokens, head_dim, dtype=bf16)
            kernels.Rope.backward(ctx, kernels.Rope.forward(ctx, qk, cos, cos))
            gate = torch.empty(tokens, ffn_dim, dtype=bf16)
            kernels.SiluMul.backward(ctx, kernels.SiluMul.forward(ctx, gate, gate))
            x, weight = torch.empty(tokens, dim, dtype=bf16), torch.empty(dim, dtype=bf16)
            kernels.AddRMSNorm.backward(ctx, *kernels.AddRMSNorm.forward(ctx, x, x, weight, 1e-6))
    finally:
        for name in names:
            setattr(kernels, name, real[name])
    return calls


def specialisation(kernel, args, kwargs, arch):
    """What Triton compiles for this launch on an sm_<arch> GPU: (its cache key, the compile's ASTSource, options),
    from Triton's own binder (triton/runtime/jit.py: JITFunction.run), no GPU needed."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature
    backend = make_backend(GPUTarget("cuda", arch, 32))
    kwargs = {**kwargs, "debug": False}
    bound, specialization, options = create_function_from_signature(kernel.signature, kernel.params, backend)(
        *args, **kwargs)
    key = (kernel.fn.__name__, arch, str(specialization), str(options))
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return key, ASTSource(kernel, signature, constexprs, attrs), options


COMPILED = {}  # specialisation key -> (the compiled kernel, seconds), for this process


def compiled_or_failure(kernel, args, kwargs, arch, label: str):
    """(the launch compiled for sm_<arch>, []), or (None, [what failed]): the compile's error, or no cubin, or more
    shared memory than the target has."""
    try:
        compiled = compile_for(kernel, args, kwargs, arch)
    except Exception as error:
        return None, [f"{label}: {kernel.fn.__name__} {kwargs}: {type(error).__name__}: {str(error)[-300:]}"]
    if not compiled.asm.get("cubin") or compiled.metadata.shared > SHARED_MEMORY[arch]:
        return None, [f"{label}: {kernel.fn.__name__} {kwargs}: {compiled.metadata.shared} B shared"]
    return compiled, []


def compile_for(kernel, args, kwargs, arch):
    """The launch compiled for sm_<arch> to a cubin, once per distinct specialisation in this process."""
    import time

    import triton
    from triton.backends.compiler import GPUTarget
    key, source, options = specialisation(kernel, args, kwargs, arch)
    if key not in COMPILED:
        start = time.perf_counter()
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options.__dict__)
        COMPILED[key] = compiled, time.perf_counter() - start
    return COMPILED[key][0]


@pytest.fixture(scope="module")
def triton_cache(tmp_path_factory):
    """A fresh Triton cache for the compiles: each is made here, not read from an earlier run's."""
    pytest.importorskip("triton", reason="needs triton (pip install triton, in requirements-test.txt)")
    from triton import knobs
    with knobs.cache.scope():
        knobs.cache.dir = str(tmp_path_factory.mktemp("triton_cache"))
        yield


@NEEDS_TRITON
def test_head_dim_8_did_not_compile_for_an_h200_before_the_padding(triton_cache):
    """Issue 63's failure, as the H200 met it: the attention kernel given head_dim 8 lanes (D itself, as before the
    padding) stops at tl.dot, for sm_90 as for sm_80; padded to 16 lanes it compiles."""
    from triton.compiler.errors import CompilationError
    calls = [call for call in recorded_launches(ARCHITECTURES["test_guards.tiny (char)"])
             if call[0] is kernels._decode_attention_kernel]
    kernel, args, kwargs = calls[0]
    assert kwargs["D"] == 8 and kwargs["PADDED"] == 16
    for arch in TARGETS.values():
        with pytest.raises(CompilationError, match="K >= 16"):
            compile_for(kernel, args, {**kwargs, "PADDED": 8}, arch)
        assert compile_for(kernel, args, kwargs, arch).asm["cubin"]


@NEEDS_TRITON
@pytest.mark.parametrize("target", TARGETS)
def test_every_kernel_compiles_to_a_cubin_at_every_architecture(triton_cache, target):
    """Each kernel of kernels.py and sample.py, launched as the fused decode step, the fused sampling and the training
    Functions launch it at each architecture's shapes (every split count of the attention), compiles to a cubin for
    the target, within its shared memory."""
    arch = TARGETS[target]
    failures, kernels_seen = [], set()
    for name, architecture in ARCHITECTURES.items():
        for kernel, args, kwargs in recorded_launches(architecture) + recorded_training_launches(architecture):
            kernels_seen.add(kernel.fn.__name__)
            failures += compiled_or_failure(kernel, args, kwargs, arch, name)[1]
    assert kernels_seen == {"_add_rms_norm_kernel", "_silu_mul_kernel", "_rope_cache_kernel",
                            "_decode_attention_kernel", "_combine_splits_kernel", "_gumbel_kernel",
                            "_gumbel_combine_kernel", "_rope_kernel", "_silu_mul_train_kernel",
                            "_add_rms_norm_backward_kernel"}
    assert not failures, "\n".join(failures)


@NEEDS_TRITON
def test_the_training_elementwise_kernels_move_16_bytes_a_lane(triton_cache):
    """RoPE, SiLU·mul and add + RMSNorm of the training forward and backward, compiled for sm_90 at every loaded
    model's widths (multiples of 64): each bf16 load and store in the PTX 16 bytes a lane (ld/st.global.v4.b32), none
    of 2. On an H100 the SiLU·mul kernel, its element count unspecialised, moved 2 bytes a lane and took 2.1-2.7x its
    bytes' time, and RoPE, one head a program, 2 bytes and about 8x (docs/gpu_runs/2026-11-28-h100, the profile): the
    width is now specialised, as add + RMSNorm's always was, and a RoPE program takes up to 1,024 lanes of heads."""
    import re
    names = {"_rope_kernel", "_silu_mul_train_kernel", "_add_rms_norm_kernel", "_add_rms_norm_backward_kernel"}
    seen = set()
    for name, architecture in ARCHITECTURES.items():
        if architecture[0] < 512:  # the loaded models (576 and up); a test model's row has fewer lanes than threads
            continue
        for kernel, args, kwargs in recorded_training_launches(architecture):
            if kernel.fn.__name__ in names:
                seen.add(kernel.fn.__name__)
                ptx = compile_for(kernel, args, kwargs, 90).asm["ptx"]
                moves = re.findall(r"(?:ld|st)\.global\.[\w.]+", ptx)
                assert not [m for m in moves if m.endswith(".b16")], (name, kernel.fn.__name__, kwargs, moves)
                assert any(".v4." in m for m in moves), (name, kernel.fn.__name__, kwargs, moves)
    assert seen == names


@NEEDS_TRITON
def test_a_decode_step_compiles_once_whatever_the_cache_length():
    """Issue 63: Triton specialises an integer argument on its divisibility by 16 (and on being 1), so a cache of 200
    slots (sample.cache_slots rounds to 8) and one of 208 compiled two variants of the RoPE and attention kernels,
    the second inside a run or a timing. The cache length and the split length are do_not_specialize: one variant,
    where the same kernels without that mark would make two."""
    import triton

    def keys(kernel_of, slots, attend):
        calls = []
        config = ModelConfig(vocab_size=8, dim=64, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=8,
                             max_seq_len=512)
        names = ("_rope_cache_kernel", "_decode_attention_kernel")
        real = {name: getattr(kernels, name) for name in names}
        try:
            for name in names:
                setattr(kernels, name, Launches(kernel_of(real[name]), calls))
            cache = torch.zeros(1, dtype=torch.bfloat16).expand(256, 2, slots, 16)
            qkv, cos = torch.zeros(256, 8 * 16, dtype=torch.bfloat16), torch.zeros(256, 16, dtype=torch.bfloat16)
            q = kernels.rope_and_cache(qkv, cos, cos, cache, cache, torch.tensor(5), config)
            kernels.decode_attention(q, cache, cache, torch.zeros(256, dtype=torch.long), torch.tensor(5), attend)
        finally:
            for name in names:
                setattr(kernels, name, real[name])
        # 512 (row, kv head) programs, a range of at most SPLIT_KEYS slots: one piece
        assert [kwargs.get("SPLITS", 1) for _, _, kwargs in calls] == [1, 1]
        return [specialisation(kernel, args, kwargs, 90)[0] for kernel, args, kwargs in calls]

    marked = lambda kernel: kernel  # noqa: E731
    assert keys(marked, 200, 128) == keys(marked, 208, 200) == keys(marked, 1000, 256)
    unmarked = lambda kernel: triton.jit(kernel.fn)  # noqa: E731
    assert all(a != b for a, b in zip(keys(unmarked, 200, 128), keys(unmarked, 208, 200)))


# the update's fused log-probs (kernels.fused_logprobs) at the vocabularies and hidden sizes of the loaded models:
# Qwen2.5 / Qwen3's 151,936, Llama 3's 128,256, SmolLM2's 49,152; Qwen2.5-0.5B's 896, 1.5B's 1536, Qwen3-1.7B and
# Llama-3.2-1B's 2048, Qwen2.5-7B's 3584
LOGPROB_VOCABS = (151936, 128256, 49152)
LOGPROB_DIMS = (896, 1536, 2048, 3584)


def recorded_logprob_launches(vocab, dim, rows=64) -> list:
    """(kernel, args, kwargs) of the launches of a fused log-prob forward and backward at one shape, with and
    without the entropy (its grad), on CPU tensors standing for CUDA ones; nothing runs."""
    calls, bf16 = [], torch.bfloat16
    names = ("_logprobs_kernel", "_dlogits_kernel")
    real = {name: getattr(kernels, name) for name in names}
    try:
        for name in names:
            setattr(kernels, name, Launches(real[name], calls))
        hidden, weight = torch.zeros(1, dtype=bf16).expand(rows, dim), torch.zeros(1, dtype=bf16).expand(vocab, dim)
        targets, per_row = torch.zeros(rows, dtype=torch.long), torch.zeros(rows)
        for entropy in (False, True):
            kernels._logprobs_forward(hidden, weight, targets, 0.7, entropy)
            kernels._dlogits(hidden, weight, targets, per_row, per_row, per_row, per_row if entropy else None, 0.7)
    finally:
        for name in names:
            setattr(kernels, name, real[name])
    return calls


@NEEDS_TRITON
@pytest.mark.parametrize("target", TARGETS)
def test_the_fused_logprobs_compile_to_a_cubin_at_every_vocabulary_and_width(triton_cache, target):
    """The fused log-probs' forward and backward kernels, launched at 3 vocabularies x 4 hidden sizes, with and
    without the entropy, compile to a cubin for the target within its shared memory; the lengths are unspecialised
    (rows, vocab, the split's length) and every width a multiple of 16, so the 48 launches are 4 specialisations."""
    arch = TARGETS[target]
    failures, keys = [], set()
    for vocab in LOGPROB_VOCABS:
        for dim in LOGPROB_DIMS:
            for kernel, args, kwargs in recorded_logprob_launches(vocab, dim):
                keys.add(specialisation(kernel, args, kwargs, arch)[0])
                compiled, failed = compiled_or_failure(kernel, args, kwargs, arch, f"{vocab} x {dim}")
                failures += failed
                report = ptxas_report(compiled, arch) if compiled is not None else ""
                if compiled is not None and "0 bytes spill stores" not in report:
                    failures.append(f"{vocab} x {dim}: {kernel.fn.__name__} {kwargs}: spills: {report}")
    assert not failures, "\n".join(failures)
    assert len(keys) == 4, keys


def ptxas_report(compiled, arch) -> str:
    """What Triton's bundled ptxas says of a compiled kernel's PTX (-v: registers, stack, spills): at 4 warps the
    backward's 64 x 128 tile spilled (255 registers, 100 to 540 bytes a thread), at 8 none (158 to 243)."""
    import subprocess
    import tempfile

    import triton
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(compiled.asm["ptx"])
        ptx.flush()
        run = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{arch}{'a' if arch == 90 else ''}", ptx.name, "-o",
                              os.devnull], capture_output=True, text=True)
    return " ".join(line.split("info    : ")[-1].strip() for line in run.stderr.splitlines()
                    if "spill" in line or "registers" in line)
