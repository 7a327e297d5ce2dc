"""Batched sampling with a preallocated KV cache: the rollout engine of GRPO and of evaluation.

generate() left-pads ragged prompts, prefills them (in one forward pass, or in pieces of rows when
rows x length passes PREFILL_TOKENS), then decodes one token for every row per step. On CUDA a whole
decode step (model, sampling, bookkeeping) is one CUDA graph replay with no host sync; the host
looks at the batch only every CHECK_EVERY steps, to end when every row has stopped and to drop
finished rows from the batch and the cache once half of them have. Attention reads only the first L
cache slots, L rounded up to a multiple of BUCKET (one graph per bucket), so early steps don't read
the whole cache. A step launches few kernels (the launches, not the bytes, set its time at GRPO's
shapes): it keeps its attention mask in the additive form SDPA computes with, opening one slot a
step, and records each sampled id, its log-prob and whether a stop sequence ends there by cache
slot; a row's output is read once at the end, up to its first stop.

The three GPU-only fast paths, CUDA graphs, the fused Triton sampling kernel and the fused decode
kernels (kernels.py: the model's layers for one token per row; config keys cuda_graphs,
fused_sampling and fused_decode), fall back to the eager torch path, the one the CPU tests run, on
their first failure (a compile, a launch, a capture): one line says so, the path stays off for the
rest of the process (fall_back), and every Rollout says which fast paths decoded it
(Rollout.fast_paths; the step's log records it). generate chooses its decode step once: the
model's forward or the fused kernels, each eager or replayed as CUDA graphs.

Log-probs are those of log_softmax(logits / T) in fp32, before top-p/top-k truncation: with top_p <
1 or top_k > 0 tokens are drawn from the truncated distribution, so the samples are off-policy with
respect to these log-probs (and to the policy the trainer scores). sample_next draws by Gumbel-max,
argmax(logits / T - log E) with E ~ Exp(1): an exact draw from softmax(logits / T) with no host
sync, so that it can live in a CUDA graph; temperature 0 is greedy, its log-probs at T = 1.
"""
import contextlib
import copy
import itertools
import sys
from dataclasses import dataclass, field

import torch

import kernels
from model import KVCache

try:  # CUDA only: fuses the sampling epilogue into one read of the logits
    import triton
    import triton.language as tl
except ImportError:
    triton = None

BUCKET = 128  # attended cache length is rounded up to a multiple of this: one CUDA graph per bucket
CHECK_EVERY = 16  # decode steps between host syncs (all rows stopped? compact the batch?)
# rows x padded prompt length per prefill forward: bounds the prefill's activations
PREFILL_TOKENS = 2 ** 17
FAST_PATH_DEVICES = ("cuda",)  # where CUDA graphs and the Triton kernel are tried
# the fast paths, by the names fall_back says
GRAPHS = "CUDA graphs"
FUSED = "the fused Triton sampling kernel"
FUSED_DECODE = "the fused decode kernels"
# each fast path's config key (and generate argument)
SWITCHES = {GRAPHS: "cuda_graphs", FUSED: "fused_sampling", FUSED_DECODE: "fused_decode"}
# fast path -> the line fall_back said: the paths that failed in this process, off from then on
FALLEN_BACK = {}


def fall_back(path: str, doing: str, error: Exception):
    """A GPU-only fast path failed while `doing` something: say so once, in one line a user can act
    on, and keep it off for the rest of the process; the caller goes on with the eager torch
    path."""
    if path in FALLEN_BACK:
        return
    reason = (str(error).strip().splitlines() or [""])[0][:200]
    FALLEN_BACK[path] = (f"sample.py: {path} failed {doing} ({type(error).__name__}: {reason}); "
                         "going on with the eager torch path, slower but the same samples "
                         f"({SWITCHES[path]}=False skips the attempt)")
    print(FALLEN_BACK[path], file=sys.stderr, flush=True)


@dataclass
class Rollout:
    tokens: torch.Tensor  # [B, N] generated ids, pad_id after each row's end
    lengths: torch.Tensor  # [B] generated tokens per row, the stop sequence included
    logprobs: torch.Tensor  # [B, N] fp32 log_softmax(logits / T) at the ids (T = 1 if greedy)
    stopped: torch.Tensor  # [B] True: the row ended with a stop sequence; False: cut at the limit
    # {config key: whether that fast path decoded this rollout}, for each fast path asked for on a
    # fast-path device (SWITCHES); {} elsewhere
    fast_paths: dict = field(default_factory=dict)

    @property
    def truncated(self) -> torch.Tensor:
        return ~self.stopped


@torch.inference_mode()
def generate(model, prompts, max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, stop_ids=(),
             stop_sequences=(), seed=None, pad_id=0, cuda_graphs=True, keep_graphs=True,
             fused_sampling=True, fused_decode=True, check=True) -> Rollout:
    """Continue each ragged prompt (a list of ids) by up to max_new_tokens tokens, a row ending
    after a stop sequence (kept). seed: an int, None, or one per row. check=False: checked."""
    if check:
        _check_request(model, prompts, max_new_tokens, temperature, top_p, top_k, stop_ids,
                       stop_sequences, seed)
    device = model.lm_head.weight.device
    batch = len(prompts)
    prompt_len = max(len(p) for p in prompts)
    max_len = cache_slots(prompt_len, max_new_tokens)
    fast = device.type in FAST_PATH_DEVICES  # the GPU's fast paths
    if isinstance(seed, (list, tuple)):  # a generator per row: the eager loop
        generator, cuda_graphs = [torch.Generator(device).manual_seed(s) for s in seed], False
    else:
        generator = torch.Generator(device)
        generator.manual_seed(seed) if seed is not None else generator.seed()
    ids = torch.tensor([[pad_id] * (prompt_len - len(p)) + list(p) for p in prompts], device=device)
    real = torch.tensor([[False] * (prompt_len - len(p)) + [True] * len(p) for p in prompts],
                        device=device)  # [B, P]: not padding
    stop = _stop_table(stop_ids, stop_sequences).to(device)
    sampling = (temperature, top_p, top_k, fused_sampling and fast)
    decoder = (_kept if fast else _Decoder)(model, batch, max_len, sampling, stop, pad_id,
                                            generator, cuda_graphs and keep_graphs, fused_decode)
    generator, max_len = decoder.generator, decoder.cache.max_len
    positions = (real.cumsum(-1) - 1).clamp(min=0)
    chunk = max(1, PREFILL_TOKENS // prompt_len)
    first = []
    for start in range(0, batch, chunk):  # the prefill, chunk rows at a time
        rows = slice(start, start + chunk)
        hidden = model(ids[rows], positions=positions[rows], attention_mask=real[rows],
                       cache=prefix_view(decoder.cache, prompt_len, rows), return_hidden=True)
        first.append(model.lm_head(hidden[:, -1]))
        del hidden  # [rows, P, dim]: not kept
    decoder.start(real)
    decoder.record(torch.cat(first))
    step = _fast_step(decoder, generator, cuda_graphs, fused_decode) if fast else decoder.step
    for generated in range(1, max_new_tokens):
        if generated % CHECK_EVERY == 0:
            alive = int((~decoder.stops[decoder.rows].any(-1)).sum())  # the loop's one host sync
            if alive == 0:
                break
            if alive <= len(decoder.rows) // 2:
                decoder.compact()
        decoder.attend = min(-(-(prompt_len + generated) // BUCKET) * BUCKET, max_len)
        step()
    stops = decoder.stops[:, prompt_len:prompt_len + max_new_tokens]
    stopped = stops.any(-1)
    lengths = torch.where(stopped, stops.int().argmax(-1) + 1, max_new_tokens)  # to the first stop
    n = int(lengths.max())
    after = torch.arange(n, device=device) >= lengths[:, None]  # sampled after the row's end
    tokens = decoder.tokens[:, prompt_len:prompt_len + n].masked_fill(after, pad_id)
    logprobs = decoder.logprobs[:, prompt_len:prompt_len + n].masked_fill(after, 0.0)
    fast_paths = _fast_paths_used(model, cuda_graphs, fused_sampling and isinstance(
        generator, torch.Generator), fused_decode, temperature, top_p, top_k) if fast else {}
    return Rollout(tokens, lengths, logprobs, stopped, fast_paths)


def _fast_step(decoder, generator, cuda_graphs: bool, fused_decode: bool):
    """The decode step on a fast-path device: the fused kernels for a model made for them
    (kernels.possible), else the model's forward; replayed as CUDA graphs with cuda_graphs."""
    step = decoder.step
    device = decoder.mask.device
    if fused_decode and FUSED_DECODE not in FALLEN_BACK and kernels.possible(decoder.model, device):
        step = _until_it_fails(decoder.fused_step, decoder.step, FUSED_DECODE)
    return _Graphed(step, decoder, generator, device) if cuda_graphs else step


def _until_it_fails(fast, eager, path: str):
    """A decode step that runs fast() until a call fails, then (fall_back saying so) eager() from
    that call on, for the rest of the process. A failed call may have written the step's cache
    slot in some layers: eager() writes them all again."""
    def step():
        if path not in FALLEN_BACK:
            try:
                return fast()
            except Exception as error:  # Triton compiles with a C compiler on first use
                fall_back(path, "to compile or launch", error)
        return eager()
    return step


class _Graphed:
    """A decode step replayed as CUDA graphs: one per row count and attention bucket, captured on
    its first step (_captured) and kept in decoder.replays, for this rollout and later ones
    (_kept); eager once a capture has failed (fall_back)."""

    def __init__(self, step, decoder, generator, device):
        self.step, self.decoder, self.generator, self.device = step, decoder, generator, device

    def __call__(self):
        shape = (len(self.decoder.rows), self.decoder.attend)
        replay = self.decoder.replays.get(shape)
        if GRAPHS in FALLEN_BACK:
            self.step()
        elif replay is None:  # a new row count or bucket: decodes this step, captures it
            replay = _captured(self.step, self.generator, self.device)
            if replay is not None:
                self.decoder.replays[shape] = replay
        else:
            replay()


def _check_request(model, prompts, max_new_tokens, temperature, top_p, top_k, stop_ids,
                   stop_sequences, seed):
    """generate's arguments and the memory it needs: a ValueError naming the first that is wrong."""
    config = model.config
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate needs a non-empty list of non-empty prompts (token-id lists)")
    if max_new_tokens < 1 or temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
        raise ValueError("need max_new_tokens >= 1, temperature >= 0, 0 < top_p <= 1, top_k >= 0; "
                         f"got {max_new_tokens}, {temperature}, {top_p}, {top_k}")
    config.check_context(prompts, max_new_tokens)
    low, high = min(min(p) for p in prompts), max(max(p) for p in prompts)
    if low < 0 or high >= config.vocab_size:
        raise ValueError(f"prompt token ids must lie in [0, {config.vocab_size}); got ids from "
                         f"{low} to {high}")
    for sequence in stop_sequences:
        if isinstance(sequence, (int, str)):
            raise ValueError("stop_sequences is a list of token-id lists such as [[522, 9217, "
                             f"29]]; got an element {sequence!r}")
    for sequence in [[i] for i in stop_ids] + [list(s) for s in stop_sequences]:
        if not sequence:
            raise ValueError("a stop sequence is empty: each needs at least one token id")
        if min(sequence) < 0 or max(sequence) >= config.vocab_size:
            raise ValueError(f"stop sequence {sequence} has an id outside the model's vocabulary "
                             f"[0, {config.vocab_size})")
    if isinstance(seed, (list, tuple)) and len(seed) != len(prompts):
        raise ValueError(f"seed is a list of {len(seed)} seeds for {len(prompts)} prompts: give "
                         "one per prompt")
    device = model.lm_head.weight.device
    if device.type == "cuda":
        _check_memory(config, len(prompts), max(map(len, prompts)), max_new_tokens,
                      model.lm_head.weight.dtype, device)


def cache_slots(prompt_len: int, max_new_tokens: int) -> int:
    """The KV cache's slots: a multiple of 8, for aligned kernels."""
    return -(-(prompt_len + max_new_tokens) // 8) * 8


def _check_memory(config, batch, prompt_len, max_new_tokens, dtype, device):
    """On CUDA (the caller's condition), a ValueError before any work unless the KV cache and the
    prefill (prefill_nbytes) fit the free memory."""
    max_len = cache_slots(prompt_len, max_new_tokens)
    free = torch.cuda.mem_get_info(device)[0]
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)  # cached
    cache = KVCache.nbytes(config, batch, max_len, dtype)
    prefill = prefill_nbytes(config, batch, prompt_len, dtype)
    if cache + prefill > free:
        raise ValueError(f"the KV cache for {batch} rows x {max_len} slots ({cache / 2**30:.2f} "
                         f"GiB) and the prefill of {prompt_len}-token prompts "
                         f"({prefill / 2**30:.2f} GiB) need more than the {free / 2**30:.2f} GiB "
                         "of GPU memory free: lower the batch size, the prompts' length or "
                         "max_new_tokens")


def prefix_view(cache: KVCache, length: int, rows=slice(None)) -> KVCache:
    """The first `length` slots of `cache` (of these rows), sharing its memory."""
    view = copy.copy(cache)
    view.k = cache.k[:, rows, :, :length]
    view.v = cache.v[:, rows, :, :length]
    view.max_len = length
    return view


def _stop_table(stop_ids, stop_sequences) -> torch.Tensor:
    """Stop ids and sequences -> [S, L] ids, right-aligned, -1 padding; no stops: [0, 1]."""
    sequences = [[int(i)] for i in stop_ids]
    sequences += [[int(i) for i in sequence] for sequence in stop_sequences]
    width = max(map(len, sequences), default=1)
    table = torch.full((len(sequences), width), -1, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        table[row, width - len(sequence):] = torch.tensor(sequence)
    return table


class _Decoder:
    """The rows still decoding. step() feeds each row's last token and samples the next, all in
    place on the device with no host sync, so that CUDA can capture it in a graph; compact() drops
    finished rows."""

    def __init__(self, model, batch, max_len, sampling, stop, pad_id, generator, *_):
        device, dtype = stop.device, model.lm_head.weight.dtype
        self.model, self.sampling, self.generator = model, sampling, generator
        self.cache = KVCache(model.config, batch, max_len, device, dtype)
        self.stop = stop  # [S, L] stop sequences, right-aligned; -1 pads
        self.stop_pad = stop < 0
        self.mask = torch.empty(batch, 1, 1, max_len, dtype=dtype, device=device)  # additive
        # by row and slot: ids, log-probs, whether a stop ends there
        self.tokens = torch.full((batch, max_len), pad_id, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(batch, max_len, device=device)
        self.stops = torch.zeros(batch, max_len, dtype=torch.bool, device=device)
        self.slot = torch.empty((), dtype=torch.long, device=device)  # the slot sampled last
        self.rows = torch.arange(batch, device=device)
        self.pos = torch.empty_like(self.rows)  # each row's next RoPE position
        self.starts = torch.empty_like(self.rows)  # each row's first real slot
        self.last = torch.zeros_like(self.rows)  # each row's latest token
        # each row's last L ids, oldest first (-1: none yet)
        self.recent = torch.full((batch, stop.shape[1]), -1, dtype=torch.long, device=device)
        self.attend = max_len  # cache slots attention reads (a bucket)

    def start(self, real):
        """After the prefill of prompts real [B, P] (left-padded): the mask, positions, slot."""
        positions = real.sum(-1)
        self.mask.fill_(float("-inf"))[:, 0, 0, :real.shape[1]].masked_fill_(real, 0.0)
        self.pos.copy_(positions)
        self.starts.copy_(real.shape[1] - positions)
        self.slot.fill_(real.shape[1])

    def record(self, logits):
        """Sample slot `slot`'s ids from logits [b, V]; record them, their log-probs, stops."""
        temperature, top_p, top_k, fused = self.sampling
        if fused and _fused_record(self, logits, temperature, top_p, top_k):  # all in 2 kernels
            return
        ids, logprobs = sample_next(logits, temperature, top_p, top_k, self.generator, fused)
        column = (self.rows, self.slot.expand_as(self.rows))
        self.tokens.index_put_(column, ids)
        self.logprobs.index_put_(column, logprobs)
        self.recent.copy_(torch.cat([self.recent[:, 1:], ids[:, None]], dim=1))
        # a stop ends here: the newest ids equal it wherever it is not -1
        matches = ((self.recent[:, None] == self.stop) | self.stop_pad).all(-1)  # [b, S]
        self.stops.index_put_(column, matches.any(-1))
        self.last.copy_(ids)

    def step(self):
        """Feed each row's latest token at its slot, then sample the next slot's."""
        self.mask.index_fill_(-1, self.slot.view(1), 0.0)  # a query sees itself
        hidden = self.model(self.last[:, None], positions=self.pos[:, None],
                            attention_mask=self.mask[..., :self.attend],
                            cache=prefix_view(self.cache, self.attend), cache_index=self.slot,
                            return_hidden=True)
        self.slot += 1
        self.pos += 1
        self.record(self.model.lm_head(hidden[:, 0]))

    def fused_step(self):
        """step() with the model's layers in kernels.decode_step: attention reads each row's slots
        from its first real one to `slot`; the mask is kept up to date all the same, so that the
        eager step can take over at any step."""
        self.mask.index_fill_(-1, self.slot.view(1), 0.0)
        hidden = kernels.decode_step(self.model, self.last, self.pos, self.slot, self.starts,
                                     self.cache, self.attend)
        self.slot += 1
        self.pos += 1
        self.record(self.model.lm_head(hidden))

    def compact(self):
        keep = (~self.stops[self.rows].any(-1)).nonzero()[:, 0]  # the rows not stopped
        self.rows, self.last, self.recent, self.pos, self.mask, self.starts = (
            t[keep] for t in (self.rows, self.last, self.recent, self.pos, self.mask, self.starts))
        self.cache.k, self.cache.v = self.cache.k[:, keep], self.cache.v[:, keep]
        if isinstance(self.generator, list):
            self.generator = [self.generator[i] for i in keep.tolist()]


class _KeptDecoder(_Decoder):
    """The decoder on a fast-path device. compact() keeps a power-of-two count of rows (those still
    decoding, filled up with stopped ones, decoded on and never read) at the front of the same
    buffers, so that a process sees at most log2(B) + 1 row counts and each (row count, bucket)
    reads the same memory in every rollout; with CUDA graphs the decoder (buffers, cache,
    generator) and its captured steps (replays) are kept for later rollouts (_kept)."""
    ROWWISE = ("rows", "pos", "starts", "last", "recent", "mask")

    def __init__(self, *args):
        super().__init__(*args)
        self.key = None  # what _kept matches a later rollout on
        self.replays = {}  # (rows, attend) -> the replay of a decode step captured at that shape
        self.whole = {name: getattr(self, name) for name in self.ROWWISE}
        self.whole_cache = (self.cache.k, self.cache.v)

    def rewind(self, pad_id):
        """Every row again, in order, and no token yet: for the next rollout, before its prefill."""
        for name in self.ROWWISE:
            setattr(self, name, self.whole[name])
        self.cache.k, self.cache.v = self.whole_cache
        torch.arange(len(self.rows), out=self.rows)
        self.tokens.fill_(pad_id)
        self.logprobs.zero_()
        self.stops.zero_()
        self.recent.fill_(-1)

    def compact(self):
        stopped = self.stops[self.rows].any(-1)
        order = torch.cat((stopped.logical_not().nonzero()[:, 0], stopped.nonzero()[:, 0]))
        keep = order[:1 << (int((~stopped).sum()) - 1).bit_length()].sort().values
        n = len(keep)
        for name in self.ROWWISE:
            whole = self.whole[name]
            whole[:n] = getattr(self, name)[keep]  # gathered first: the source overlaps
            setattr(self, name, whole[:n])
        for whole, part in zip(self.whole_cache, (self.cache.k, self.cache.v)):
            whole[:, :n] = part[:, keep]
        self.cache.k, self.cache.v = (whole[:, :n] for whole in self.whole_cache)
        if isinstance(self.generator, list):
            self.generator = [self.generator[i] for i in keep.tolist()]


# the decoder kept for the next rollout with CUDA graphs (one a process: its cache and graphs)
KEPT = []


def _kept(model, batch, max_len, sampling, stop, pad_id, generator, keep, fused_decode):
    """A fast-path device's decoder for a rollout: with keep (cuda_graphs and keep_graphs) the one
    kept from the last rollout if it decodes alike (the model and its weights' memory, the rows,
    sampling, stop table's shape and the decode step; at least max_len slots), its generator
    re-seeded as `generator` and its stop table refilled; else a new one, kept in its place. A
    model with LoRA adapters samples on merged weights made anew each rollout: not kept."""
    if not keep or any(hasattr(m, "lora_A") for m in model.modules()):
        return _KeptDecoder(model, batch, max_len, sampling, stop, pad_id, generator)
    weights = tuple(t.data_ptr() for t in itertools.chain(model.parameters(), model.buffers()))
    key = (model, weights, batch, sampling, tuple(stop.shape), fused_decode)
    if KEPT and KEPT[0].key == key and KEPT[0].cache.max_len >= max_len:
        kept = KEPT[0]
        kept.rewind(pad_id)
        kept.generator.manual_seed(generator.initial_seed())
        kept.stop.copy_(stop)
        kept.stop_pad.copy_(stop < 0)
        return kept
    KEPT.clear()  # the kept graphs and cache freed first
    KEPT.append(_KeptDecoder(model, batch, max_len, sampling, stop, pad_id, generator))
    KEPT[0].key = key
    return KEPT[0]


# device -> (side stream, pool id, keeper graph): one of each serves every capture of the process
GRAPH_RESOURCES = {}


def _captured(step, generator, device):
    """Run step() once for real (a warm-up that decodes this step's token), then capture it in a
    CUDA graph, both on the side stream every capture shares; returns the graph's replay, or None
    when the capture failed (fall_back: the caller goes on eagerly)."""
    try:
        stream, pool, _ = _graph_resources(device)
    except Exception as error:  # no CUDA stream or pool to be had on this device
        fall_back(GRAPHS, "to set up (a side stream and a memory pool)", error)
        _unstick(generator, device)
        step()
        return None
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            step()
            try:
                return _capture(step, generator, pool)
            except Exception as error:
                fall_back(GRAPHS, "to capture a decode step", error)
                _unstick(generator, device)
                return None
    finally:
        torch.cuda.current_stream().wait_stream(stream)


def _graph_resources(device):
    """The side stream and the memory pool that every capture on device shares, made once per
    process.

    The pool lives as long as the process because a graph captured into it does: the keeper, a
    one-kernel graph never replayed. A bare pool id (graph_pool_handle) would not do: the device's
    caching allocator and the pinned host one each count a pool's users (capture_begin adds one in
    both, a freed graph takes its one back: torch 2.11, c10/cuda/CUDACachingAllocator.cpp
    create_or_incref_pool and releasePool, aten/src/ATen/core/ CachingHostAllocator.h) and refuse a
    capture into a pool whose count fell to 0, as it does when a rollout's graphs are freed; a
    torch.cuda.MemPool holds a count in the device allocator only. With the keeper, every capture of
    every rollout reuses the pool's memory: reserved memory stays flat from step to step."""
    if device not in GRAPH_RESOURCES:
        with torch.cuda.device(device):
            stream = torch.cuda.Stream(device)
            pool = torch.cuda.graph_pool_handle()
            keeper = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream):
                keeper.capture_begin(pool=pool)
                torch.zeros(1, device=device)  # one kernel: torch warns of an empty graph
                keeper.capture_end()
        GRAPH_RESOURCES[device] = (stream, pool, keeper)
    return GRAPH_RESOURCES[device]


def _unstick(generator, device):
    """After a capture that failed once begun: each CUDA generator it registered (ours and the
    device's default one) is left marked as capturing, and its next eager draw fails ("Offset
    increment outside graph capture"); give each a fresh copy of its own state (the same seed and
    offset), so the eager path draws what it would have."""
    if device.type != "cuda":
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    for stuck in (generator, torch.cuda.default_generators[index]):
        stuck.graphsafe_set_state(stuck.clone_state())


def _capture(step, generator, pool):
    """step() captured in a CUDA graph in pool, each replay drawing fresh noise from generator;
    returns its replay. A failure inside the capture ends it before the error propagates, so the
    stream is usable again (for the eager path, and for the checkpoint that a failing step
    writes)."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    graph.register_generator_state(generator)
    # not torch.cuda.graph(): its gc.collect() per capture costs more than a step
    graph.capture_begin(pool=pool)
    try:
        step()
    except BaseException:
        # the step's error is the story, not the aborted capture's
        with contextlib.suppress(Exception):
            graph.capture_end()
        raise
    graph.capture_end()
    return graph.replay


def sample_next(logits, temperature, top_p, top_k, generator, fused: bool = True):
    """logits [B, V] -> (ids [B], fp32 log_softmax(logits / T) [B] there), by Gumbel-max."""
    one_generator = isinstance(generator, torch.Generator)
    if fused and one_generator and _fused_possible(logits.device, temperature, top_p, top_k):
        return _fused_or_eager(logits, temperature, generator)
    scaled = logits.float() if temperature in (0, 1) else logits.float() / temperature  # 0: greedy
    logprobs = scaled.log_softmax(-1)
    if temperature == 0:
        ids = logprobs.argmax(-1)
    else:
        if one_generator:
            noise = torch.empty_like(logprobs).exponential_(generator=generator)
        else:  # a generator per row
            noise = torch.stack([torch.empty_like(row).exponential_(generator=g)
                                 for row, g in zip(logprobs, generator)])
        scores = logprobs - noise.log_()
        if top_p < 1 or top_k > 0:  # after the noise: no inf - inf even if E were 0
            scores.masked_fill_(~truncation_mask(logprobs, top_p, top_k), float("-inf"))
        ids = scores.argmax(-1)
    return ids, logprobs.gather(-1, ids[:, None])[:, 0]


def _fused_possible(device, temperature, top_p, top_k) -> bool:
    """Whether the fused kernel applies: Triton importable, a fast-path device, plain tempered
    sampling, and the kernel not fallen back from in this process."""
    return (triton is not None and device.type in FAST_PATH_DEVICES and temperature > 0
            and top_p == 1 and top_k == 0 and FUSED not in FALLEN_BACK)


def _fused_or_eager(logits, temperature, generator):
    """sample_next's draw by the fused kernel; if it fails (Triton builds its launcher with a C
    compiler on first use; a launch can fail), fall_back says so and the eager path draws."""
    try:
        return _fused_gumbel_sample(logits, temperature, generator)
    except Exception as error:
        fall_back(FUSED, "to compile or launch", error)
    return sample_next(logits, temperature, 1.0, 0, generator, fused=False)


def _fused_record(decoder, logits, temperature, top_p, top_k) -> bool:
    """decoder.record(logits) by the fused kernels, the bookkeeping in their combine: whether they
    did it (not where they do not apply, nor when they failed: fall_back)."""
    if not (isinstance(decoder.generator, torch.Generator)
            and _fused_possible(logits.device, temperature, top_p, top_k)):
        return False
    try:
        _fused_gumbel_sample(logits, temperature, decoder.generator, decoder=decoder)
        return True
    except Exception as error:
        fall_back(FUSED, "to compile or launch", error)
        return False


def truncation_mask(scaled: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """scaled [B, V] -> keep [B, V] bool: the top_k largest (ties kept), then the smallest set
    holding top_p of the remaining mass (top_p < 1 or top_k > 0)."""
    keep = None
    if top_k > 0:
        keep = scaled >= scaled.topk(min(top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
    if top_p < 1:
        masked = scaled if keep is None else scaled.masked_fill(~keep, float("-inf"))
        ranked, order = masked.sort(dim=-1, descending=True)
        probs = ranked.softmax(-1)
        # the tokens ranked above hold less than top_p of the mass
        inside = probs.cumsum(-1) - probs < top_p
        inside = torch.empty_like(inside).scatter_(-1, order, inside)
        keep = inside if keep is None else keep & inside
    return keep


if triton is not None:
    @triton.jit(do_not_specialize=["vocab", "per_split"])
    def _gumbel_kernel(logits, seed, partial, partial_ids, vocab, per_split, inv_temperature,
                       BLOCK: tl.constexpr):
        """Program (row, split): the Gumbel-max draw from softmax(logits / T) over the split's
        per_split columns of the row's bf16 logits, and their part of the log-normaliser. Each of
        BLOCK // 4 lanes reads four neighbouring logits and draws their four uniforms in one Philox
        call (tl.rand4x: counter row * ceil(vocab / 4) + column // 4, the column's remainder picking
        the output: the same draws however the vocabulary is split), and keeps a running max and
        sum of exp and a running best noisy score with its id. The lanes are combined into the
        split's (max, sum of exp at that max, best score) and the best's id (the first of equals,
        as torch's argmax), for _gumbel_combine_kernel."""
        row = tl.program_id(0).to(tl.int64)
        split = tl.program_id(1)
        lanes = tl.arange(0, BLOCK // 4)
        key = tl.load(seed)
        quads = (vocab + 3) // 4
        top = tl.full((BLOCK // 4,), float("-inf"), tl.float32)
        sumexp = tl.zeros((BLOCK // 4,), tl.float32)
        best = tl.full((BLOCK // 4,), float("-inf"), tl.float32)
        best_id = tl.zeros((BLOCK // 4,), tl.int64)
        row_logits = logits + row * vocab
        for start in range(split * per_split, tl.minimum((split + 1) * per_split, vocab), BLOCK):
            quad = start // 4 + lanes
            u0, u1, u2, u3 = tl.rand4x(key, (row * quads + quad).to(tl.int32))
            top, sumexp, best, best_id = _gumbel_visit(row_logits, quad * 4, u0, vocab,
                                                       inv_temperature, top, sumexp, best, best_id)
            top, sumexp, best, best_id = _gumbel_visit(row_logits, quad * 4 + 1, u1, vocab,
                                                       inv_temperature, top, sumexp, best, best_id)
            top, sumexp, best, best_id = _gumbel_visit(row_logits, quad * 4 + 2, u2, vocab,
                                                       inv_temperature, top, sumexp, best, best_id)
            top, sumexp, best, best_id = _gumbel_visit(row_logits, quad * 4 + 3, u3, vocab,
                                                       inv_temperature, top, sumexp, best, best_id)
        most = tl.max(top, 0)
        shift = tl.where(most == float("-inf"), 0.0, most)  # an empty split: 0 to add
        winner = tl.max(best, 0)
        at = row * tl.num_programs(1) + split
        tl.store(partial + at * 3, most)
        tl.store(partial + at * 3 + 1, tl.sum(sumexp * tl.exp(top - shift), 0))
        tl.store(partial + at * 3 + 2, winner)
        tl.store(partial_ids + at, tl.min(tl.where(best == winner, best_id, vocab), 0))

    @triton.jit
    def _gumbel_visit(row_logits, column, uniform, vocab, inv_temperature, top, sumexp, best,
                      best_id):
        """One logit per lane (at column): the running max and sum of exp of x = logit / T, and the
        running best x + Gumbel noise -log(-log(uniform)) with its column."""
        x = tl.load(row_logits + column, mask=column < vocab,
                    other=float("-inf")).to(tl.float32) * inv_temperature
        newest = tl.maximum(top, x)
        shift = tl.where(newest == float("-inf"), 0.0, newest)  # no logit yet: nothing to add
        sumexp = sumexp * tl.exp(top - shift) + tl.exp(x - shift)
        noisy = x - tl.log(-tl.log(uniform))
        better = noisy > best
        return newest, sumexp, tl.where(better, noisy, best), tl.where(better, column, best_id)

    @triton.jit(do_not_specialize=["vocab", "n_splits", "max_len", "width", "n_stops"])
    def _gumbel_combine_kernel(logits, partial, partial_ids, ids, logprobs, vocab, n_splits,
                               inv_temperature, rows, slot, tokens, logprob_slots, stops, recent,
                               last, stop, max_len, width, n_stops, SPLITS: tl.constexpr,
                               RECORD: tl.constexpr, WIDTH: tl.constexpr,
                               STOPS: tl.constexpr):
        """Program `row`: the splits' parts -> the drawn id (the best score's, the first of equals)
        and its log-prob, x - log-normaliser; a NaN logit never wins (its log-normaliser, hence
        its log-prob, is NaN, as the torch path's). RECORD: also _Decoder.record's bookkeeping
        (ids and logprobs unused): the id and log-prob written at the row's `slot` of tokens and
        logprob_slots (rows: the decoder's rows), the row's `width` most recent ids shifted in,
        whether a stop sequence (stop: [n_stops, width], right-aligned, -1 pads) ends there, and
        the id as the row's last."""
        row = tl.program_id(0).to(tl.int64)
        splits = tl.arange(0, SPLITS)
        inside = splits < n_splits
        at = row * n_splits + splits
        top = tl.load(partial + at * 3, mask=inside, other=float("-inf"))
        sumexp = tl.load(partial + at * 3 + 1, mask=inside, other=0.0)
        best = tl.load(partial + at * 3 + 2, mask=inside, other=float("-inf"))
        best_ids = tl.load(partial_ids + at, mask=inside, other=vocab)
        most = tl.max(top, 0)
        log_normaliser = most + tl.log(tl.sum(sumexp * tl.exp(top - most), 0))
        winner = tl.max(best, 0)
        chosen = tl.min(tl.where(best == winner, best_ids, vocab), 0)
        chosen = tl.minimum(tl.maximum(chosen, 0), vocab - 1)  # all -inf or NaN: still a real id
        logprob = tl.load(logits + row * vocab + chosen).to(tl.float32) * inv_temperature
        logprob = logprob - log_normaliser
        if RECORD:
            cell = tl.load(rows + row) * max_len + tl.load(slot)
            tl.store(tokens + cell, chosen)
            tl.store(logprob_slots + cell, logprob)
            column = tl.arange(0, WIDTH)
            older = tl.load(recent + row * width + column + 1, mask=column + 1 < width, other=0)
            newest = tl.where(column == width - 1, chosen, older)  # [WIDTH]: oldest first
            tl.store(recent + row * width + column, newest, mask=column < width)
            sequence = tl.arange(0, STOPS)
            real = (sequence < n_stops)[:, None] & (column < width)[None, :]
            table = tl.load(stop + sequence[:, None] * width + column[None, :], mask=real,
                            other=-1)  # [STOPS, WIDTH]
            differs = real & (table >= 0) & (table != newest[None, :])
            ends = (tl.sum(differs.to(tl.int32), 1) == 0) & (sequence < n_stops)
            tl.store(stops + cell, tl.max(ends.to(tl.int32), 0) > 0)
            tl.store(last + row, chosen)
        else:
            tl.store(ids + row, chosen)
            tl.store(logprobs + row, logprob)


# the logits a sampling program reads per loop step, and per split of the vocabulary (a multiple of
# it: every split starts on a Philox quad); Qwen's 151,936 logits: 10 splits
GUMBEL_BLOCK = 4096
GUMBEL_SPLIT = 4 * GUMBEL_BLOCK


def _fused_gumbel_sample(logits, temperature, generator, block=GUMBEL_BLOCK, split=GUMBEL_SPLIT,
                         decoder=None):
    """sample_next's Gumbel-max for CUDA: two kernels, one pass over the bf16 logits where the torch
    path makes ~8 over fp32 copies, the vocabulary cut in splits of `split` columns (a program each)
    combined per row. decoder: its record()'s bookkeeping done by the combine (returns None)."""
    logits = logits.contiguous()
    rows, vocab = logits.shape
    splits = triton.cdiv(vocab, split)
    device = logits.device
    partial = torch.empty(rows, splits, 3, device=device)  # per split: max, sum of exp, best score
    partial_ids = torch.empty(rows, splits, dtype=torch.long, device=device)
    seed = torch.randint(2**31 - 1, (1,), device=device, generator=generator)
    _gumbel_kernel[(rows, splits)](logits, seed, partial, partial_ids, vocab, split,
                                   1.0 / temperature, BLOCK=block, num_warps=8)
    ids = torch.empty(rows, dtype=torch.long, device=device)
    logprobs = torch.empty(rows, device=device)
    d = decoder
    books = (d.rows, d.slot, d.tokens, d.logprobs, d.stops, d.recent, d.last, d.stop) if d else (
        (ids,) * 8)  # unused without a decoder
    max_len, width, n_stops = (d.tokens.shape[1], d.stop.shape[1], d.stop.shape[0]) if d else (
        1, 1, 0)
    _gumbel_combine_kernel[(rows,)](
        logits, partial, partial_ids, ids, logprobs, vocab, splits, 1.0 / temperature, *books,
        max_len, width, n_stops, SPLITS=triton.next_power_of_2(splits), RECORD=d is not None,
        WIDTH=triton.next_power_of_2(width), STOPS=max(1, triton.next_power_of_2(n_stops)))
    return None if d is not None else (ids, logprobs)


def _fast_paths_used(model, cuda_graphs, fused_sampling, fused_decode, temperature, top_p,
                     top_k) -> dict:
    """Rollout.fast_paths on a fast-path device: for each fast path asked for, whether it decoded
    the rollout (not when it fell back, nor where it does not apply)."""
    device = model.lm_head.weight.device
    used = {}
    if cuda_graphs:
        used[SWITCHES[GRAPHS]] = GRAPHS not in FALLEN_BACK
    if fused_sampling:
        used[SWITCHES[FUSED]] = _fused_possible(device, temperature, top_p, top_k)
    if fused_decode:
        used[SWITCHES[FUSED_DECODE]] = (kernels.possible(model, device)
                                        and FUSED_DECODE not in FALLEN_BACK)
    return used


def prefill_nbytes(config, batch_size: int, prompt_len: int, dtype: torch.dtype) -> int:
    """The transient memory of generate's prefill of batch_size prompts of prompt_len tokens (a
    rollout's largest forward), in bytes, at least: for the rows of one prefill forward
    (PREFILL_TOKENS), the larger of one layer's attention (q, K and V repeated to every head as
    model.attention_kv does on CUDA, its output) and its MLP (two activations of ffn_dim and their
    product), the residual stream and its normed copy; and every row's last-position logits (in
    dtype, in fp32, the sampling noise)."""
    elem = torch.empty((), dtype=dtype).element_size()
    tokens = min(batch_size, max(1, PREFILL_TOKENS // prompt_len)) * prompt_len
    attention = 4 * tokens * config.n_heads * config.head_dim * elem
    mlp = 3 * tokens * config.ffn_dim * elem
    activations = max(attention, mlp) + 2 * tokens * config.dim * elem
    return activations + batch_size * config.vocab_size * (elem + 8)  # + the last logits
