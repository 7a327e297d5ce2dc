"""Batched sampling with a preallocated KV cache: the rollout engine of GRPO and of evaluation.

generate() left-pads ragged prompts, prefills them in one forward pass, then decodes one token for every row
per step. On CUDA a whole decode step (model, sampling, bookkeeping) is one CUDA graph replay with no host
sync; the host looks at the batch only every CHECK_EVERY steps, to end when every row has stopped and to drop
finished rows from the batch and the cache once half of them have. Attention reads only the first L cache
slots, L rounded up to a multiple of BUCKET (one graph per bucket), so early steps don't read the whole cache.

Log-probs are those of log_softmax(logits / T) in fp32, before top-p/top-k truncation: with top_p < 1 or
top_k > 0 tokens are drawn from the truncated distribution, so the samples are off-policy with respect to
these log-probs (and to the policy the trainer scores).
"""
import copy
from dataclasses import dataclass

import torch

from model import KVCache

try:  # CUDA only: fuses the sampling epilogue into one read of the logits
    import triton
    import triton.language as tl
except ImportError:
    triton = None

BUCKET = 128  # attended cache length is rounded up to a multiple of this: one CUDA graph per bucket
CHECK_EVERY = 16  # decode steps between host syncs (all rows stopped? compact the batch?)


@dataclass
class Rollout:
    tokens: torch.Tensor  # [B, N] generated ids, pad_id after each row's end
    lengths: torch.Tensor  # [B] generated tokens per row, the stop sequence included
    logprobs: torch.Tensor  # [B, N] fp32 log_softmax(logits / T) at the chosen ids (T = 1 if greedy); 0 after the end
    stopped: torch.Tensor  # [B] True: the row ended with a stop sequence; False: cut at max_new_tokens

    @property
    def truncated(self) -> torch.Tensor:
        return ~self.stopped


def truncation_mask(scaled: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor | None:
    """scaled [B, V] -> keep [B, V] bool: the top_k largest (ties kept), then the smallest set holding top_p of
    the remaining mass; None when nothing is truncated."""
    keep = None
    if top_k > 0:
        keep = scaled >= scaled.topk(min(top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
    if top_p < 1:
        masked = scaled if keep is None else scaled.masked_fill(~keep, float("-inf"))
        ranked, order = masked.sort(dim=-1, descending=True)
        probs = ranked.softmax(-1)
        inside = probs.cumsum(-1) - probs < top_p  # the tokens ranked above hold less than top_p of the mass
        inside = torch.empty_like(inside).scatter_(-1, order, inside)
        keep = inside if keep is None else keep & inside
    return keep


def sample_next(logits, temperature, top_p, top_k, generator):
    """logits [B, V] -> (ids [B], logprobs [B] fp32 under log_softmax(logits / T), before truncation).
    generator: one torch.Generator, or a list of B (row b's noise from generator[b]: per-row seeds).

    temperature 0 is greedy, its log-probs at T = 1. Sampling is Gumbel-max, argmax(logits / T - log E) with
    E ~ Exp(1), an exact draw from softmax(logits / T) with no host sync, so it can live in a CUDA graph.
    """
    one_generator = isinstance(generator, torch.Generator)
    if logits.is_cuda and triton is not None and temperature > 0 and top_p == 1 and top_k == 0 and one_generator:
        return _fused_gumbel_sample(logits, temperature, generator)
    logprobs = (logits.float() / (temperature if temperature > 0 else 1.0)).log_softmax(-1)
    if temperature == 0:
        ids = logprobs.argmax(-1)
    else:
        noise = torch.empty_like(logprobs).exponential_(generator=generator) if one_generator else \
            torch.stack([torch.empty_like(logprobs[0]).exponential_(generator=g) for g in generator])
        scores = logprobs - noise.log_()
        keep = truncation_mask(logprobs, top_p, top_k)
        if keep is not None:
            scores.masked_fill_(~keep, float("-inf"))  # after the noise: no inf - inf even if E were 0
        ids = scores.argmax(-1)
    return ids, logprobs.gather(-1, ids[:, None])[:, 0]


if triton is not None:
    @triton.jit
    def _gumbel_chunk_kernel(logits, seed, chunk_max, chunk_sumexp, chunk_score, chunk_id, vocab, inv_temperature,
                             BLOCK: tl.constexpr):
        """Program (row, chunk): over BLOCK logits, the max and sum of exp(x - max) of x = logit / T (for the
        log-normaliser) and the best x + Gumbel noise with its id; noise from Philox keyed by a drawn seed."""
        row, chunk = tl.program_id(0), tl.program_id(1)
        cols = chunk * BLOCK + tl.arange(0, BLOCK)
        # the address in int64: rows * vocab passes 2^31 at 14,134 rows of Qwen's 151,936 logits
        x = tl.load(logits + row.to(tl.int64) * vocab + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        x = x * inv_temperature
        top = tl.max(x, 0)
        # Philox counters are 32-bit: past 2^31 elements the offsets wrap, which reuses noise across far-apart rows
        noisy = x - tl.log(-tl.log(tl.rand(tl.load(seed), row * vocab + cols)))  # uniform in [0, 1): finite noise
        out = row * tl.num_programs(1) + chunk
        tl.store(chunk_max + out, top)
        tl.store(chunk_sumexp + out, tl.sum(tl.exp(x - top), 0))
        tl.store(chunk_score + out, tl.max(noisy, 0))
        tl.store(chunk_id + out, chunk * BLOCK + tl.argmax(noisy, 0))


def _fused_gumbel_sample(logits, temperature, generator, block=4096):
    """sample_next's Gumbel-max for CUDA: one pass over the bf16 logits instead of ~8 over fp32 copies."""
    logits = logits.contiguous()
    rows, vocab = logits.shape
    chunks = triton.cdiv(vocab, block)
    top, sumexp, score = (torch.empty(rows, chunks, device=logits.device) for _ in range(3))
    chunk_id = torch.empty(rows, chunks, dtype=torch.long, device=logits.device)
    seed = torch.randint(2**31 - 1, (1,), device=logits.device, generator=generator)
    _gumbel_chunk_kernel[(rows, chunks)](logits, seed, top, sumexp, score, chunk_id, vocab, 1.0 / temperature,
                                         BLOCK=block, num_warps=8)
    most = top.amax(-1, keepdim=True)
    log_normaliser = most + (sumexp * (top - most).exp()).sum(-1, keepdim=True).log()
    ids = chunk_id.gather(-1, score.argmax(-1, keepdim=True))
    chosen = logits.gather(-1, ids).float() * (1.0 / temperature)  # the very x the kernel saw
    return ids[:, 0], (chosen - log_normaliser)[:, 0]


class _Decoder:
    """The rows still decoding. step() feeds each row's last token and samples the next, all in place on the
    device with no host sync, so that CUDA can capture it in a graph; compact() drops finished rows."""

    def __init__(self, model, cache, key_mask, positions, tokens, logprobs, sampling, stop, pad_id, generator,
                 first_slot):
        self.model, self.cache, self.key_mask, self.pos = model, cache, key_mask, positions
        self.tokens, self.logprobs = tokens, logprobs  # [B, max_new] outputs, indexed by self.rows
        self.sampling, self.pad_id, self.generator = sampling, pad_id, generator
        self.stop, self.stop_pad = stop, stop < 0  # [S, L] stop sequences, right-aligned; -1 pads shorter ones
        self.rows = torch.arange(len(positions), device=positions.device)
        self.last = torch.full_like(self.rows, pad_id)  # each row's latest token, fed at the next step
        # each row's last L generated ids, oldest first; -1 (no id) until it has L: a stop must be all generated
        self.recent = torch.full((len(self.rows), stop.shape[1]), -1, dtype=torch.long, device=positions.device)
        self.ends = torch.zeros_like(self.rows)  # [B] by self.rows: the row's length once it has stopped, else 0
        self.done = torch.zeros_like(self.rows, dtype=torch.bool)
        self.n = torch.zeros((), dtype=torch.long, device=positions.device)  # tokens generated so far
        self.first_slot = first_slot  # cache slot of the first generated token: the padded prompt length
        self.attend = key_mask.shape[1]  # cache slots read by attention; set per bucket by the host

    def record(self, logits):
        """Sample from logits [b, V] into output column n; rows already done get pad_id and log-prob 0."""
        ids, logprobs = sample_next(logits, *self.sampling, self.generator)
        ids, logprobs = ids.masked_fill(self.done, self.pad_id), logprobs.masked_fill(self.done, 0.0)
        column = (self.rows, self.n.expand_as(self.rows))
        self.tokens.index_put_(column, ids)
        self.logprobs.index_put_(column, logprobs)
        self.recent.copy_(torch.cat([self.recent[:, 1:], ids[:, None]], dim=1))
        # a row ends when its newest ids equal some stop sequence in every column that sequence fills
        ends_now = ((self.recent[:, None] == self.stop) | self.stop_pad).all(-1).any(-1) & ~self.done
        self.ends.index_put_((self.rows,), torch.where(ends_now, self.n + 1, self.ends[self.rows]))
        self.done |= ends_now
        self.last.copy_(ids)
        self.n += 1

    def step(self):
        hidden = self.model(self.last[:, None], positions=self.pos[:, None],
                            attention_mask=self.key_mask[:, :self.attend], cache=prefix_view(self.cache, self.attend),
                            cache_index=self.n + (self.first_slot - 1), return_hidden=True)
        self.pos += 1
        self.record(self.model.lm_head(hidden[:, 0]))

    def compact(self):
        keep = (~self.done).nonzero()[:, 0]
        self.rows, self.last, self.recent, self.pos, self.done, self.key_mask = (
            t[keep] for t in (self.rows, self.last, self.recent, self.pos, self.done, self.key_mask))
        self.cache.k, self.cache.v = self.cache.k[:, keep], self.cache.v[:, keep]
        if isinstance(self.generator, list):
            self.generator = [self.generator[i] for i in keep.tolist()]


def prefix_view(cache: KVCache, length: int) -> KVCache:
    """The first `length` slots of `cache`, sharing its memory: attention then reads only those."""
    view = copy.copy(cache)
    view.k, view.v, view.max_len = cache.k[..., :length, :], cache.v[..., :length, :], length
    return view


def _captured(step, generator, stream):
    """Run step() once for real (also the warm-up), then capture it in a CUDA graph; returns its replay."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(generator)  # each replay draws fresh noise from our generator
        graph.capture_begin()  # not torch.cuda.graph(): its gc.collect() per capture costs more than a step
        step()
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    return graph.replay


def _check_request(model, prompts, max_new_tokens, temperature, top_p, top_k):
    config = model.config
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate needs a non-empty list of non-empty prompts (lists of token ids)")
    if max_new_tokens < 1 or temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
        raise ValueError(f"need max_new_tokens >= 1, temperature >= 0, 0 < top_p <= 1, top_k >= 0; got "
                         f"{max_new_tokens}, {temperature}, {top_p}, {top_k}")
    config.check_context(prompts, max_new_tokens)
    low, high = min(min(p) for p in prompts), max(max(p) for p in prompts)
    if low < 0 or high >= config.vocab_size:
        raise ValueError(f"prompt token ids must lie in [0, {config.vocab_size}); got ids from {low} to {high}")


def _stop_table(stop_ids, stop_sequences, vocab_size) -> torch.Tensor:
    """Stop ids (sequences of one) and stop sequences (lists of ids) -> [S, L] ids, each sequence right-aligned to
    end in the last column, -1 padding the shorter ones on the left; no stops at all gives [0, 1]."""
    for sequence in stop_sequences:
        if isinstance(sequence, (int, str)):
            raise ValueError(f"stop_sequences is a list of token-id lists such as [[522, 9217, 29]]; got an element "
                             f"{sequence!r}")
    sequences = [[int(i)] for i in stop_ids] + [[int(i) for i in sequence] for sequence in stop_sequences]
    for sequence in sequences:
        if not sequence:
            raise ValueError("a stop sequence is empty: each needs at least one token id")
        if min(sequence) < 0 or max(sequence) >= vocab_size:
            raise ValueError(f"stop sequence {sequence} has an id outside the model's vocabulary [0, {vocab_size})")
    width = max(map(len, sequences), default=1)
    table = torch.full((len(sequences), width), -1, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        table[row, width - len(sequence):] = torch.tensor(sequence)
    return table


def _check_memory(config, batch, max_len, dtype, device):
    if device.type != "cuda":
        return
    free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    need = KVCache.nbytes(config, batch, max_len, dtype)
    if need > free:
        raise ValueError(f"the KV cache for {batch} rows x {max_len} slots needs {need / 2**30:.2f} GiB but only "
                         f"{free / 2**30:.2f} GiB of GPU memory is free: lower the batch size or max_new_tokens")


@torch.inference_mode()
def generate(model, prompts, max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, stop_ids=(), stop_sequences=(),
             seed=None, pad_id=0, cuda_graphs=True) -> Rollout:
    """Continue each of the ragged `prompts` (lists of token ids) by up to max_new_tokens sampled tokens.

    A row ends right after it generates the last id of a stop sequence (a list of ids, such as the tokens of
    "</answer>"; each of stop_ids is a sequence of one), the sequence kept in its output. Only a sequence
    generated whole counts: one lying wholly or partly in the prompt does not stop the row. temperature 0 is
    greedy; top_p / top_k truncate the sampling distribution (off-policy, see the module docstring). Same seed,
    same device -> same output; seed None draws a fresh one. seed may also be a list, one per prompt: each row
    then draws from its own generator, so its samples do not depend on the other rows of the batch (this runs the
    eager loop). cuda_graphs=False runs the plain eager loop on CUDA too (the CPU always does).
    """
    _check_request(model, prompts, max_new_tokens, temperature, top_p, top_k)
    device, dtype = model.lm_head.weight.device, model.lm_head.weight.dtype
    batch, prompt_len = len(prompts), max(len(p) for p in prompts)
    max_len = -(-(prompt_len + max_new_tokens) // 8) * 8  # a multiple of 8 keeps attention kernels aligned
    _check_memory(model.config, batch, max_len, dtype, device)
    if isinstance(seed, (list, tuple)):
        if len(seed) != batch:
            raise ValueError(f"seed is a list of {len(seed)} seeds for {batch} prompts: give one per prompt")
        generator, cuda_graphs = [torch.Generator(device).manual_seed(s) for s in seed], False
    else:
        generator = torch.Generator(device)
        generator.manual_seed(seed) if seed is not None else generator.seed()

    ids = torch.tensor([[pad_id] * (prompt_len - len(p)) + list(p) for p in prompts], device=device)
    real = torch.tensor([[False] * (prompt_len - len(p)) + [True] * len(p) for p in prompts], device=device)
    key_mask = torch.cat([real, real.new_ones(batch, max_len - prompt_len)], dim=1)
    cache = KVCache(model.config, batch, max_len, device, dtype)
    hidden = model(ids, positions=(real.cumsum(-1) - 1).clamp(min=0), attention_mask=key_mask[:, :prompt_len],
                   cache=prefix_view(cache, prompt_len), return_hidden=True)
    tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros(batch, max_new_tokens, device=device)
    stop = _stop_table(stop_ids, stop_sequences, model.config.vocab_size).to(device)
    decoder = _Decoder(model, cache, key_mask, real.sum(-1), tokens, logprobs, (temperature, top_p, top_k), stop,
                       pad_id, generator, prompt_len)
    decoder.record(model.lm_head(hidden[:, -1]))

    use_graphs = cuda_graphs and device.type == "cuda"
    stream = torch.cuda.Stream(device) if use_graphs else None
    replay, shape = None, None
    for generated in range(1, max_new_tokens):
        if generated % CHECK_EVERY == 0:
            alive = int((~decoder.done).sum())  # the only host sync of the loop
            if alive == 0:
                break
            if alive <= len(decoder.rows) // 2:
                decoder.compact()
        decoder.attend = min(-(-(prompt_len + generated) // BUCKET) * BUCKET, max_len)
        if not use_graphs:
            decoder.step()
        elif (len(decoder.rows), decoder.attend) != shape:  # a new batch size or bucket: capture a new graph
            replay, shape = None, (len(decoder.rows), decoder.attend)
            replay = _captured(decoder.step, generator, stream)
        else:
            replay()

    stopped = decoder.ends > 0
    lengths = torch.where(stopped, decoder.ends, max_new_tokens)
    n = int(lengths.max())
    return Rollout(tokens[:, :n], lengths, logprobs[:, :n], stopped)
