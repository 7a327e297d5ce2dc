"""sample.generate: greedy equals transformers, cached log-probs equal a full forward, sampling frequencies
match the intended distribution, stop/pad/seed/error behaviour; on a GPU, graphs equal the eager loop."""
import contextlib
import gc
import itertools

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import sample
from conftest import qwen_tokenizer_dir
from template import load_tokenizer, stop_sequences, stop_token_ids
from model import ModelConfig, Transformer
from sample import generate

VOCAB = 97
PROMPTS = [[5, 17, 3, 44, 9], [8, 1, 90, 33, 2, 61, 7, 12, 40], [70, 6, 6], [11, 23, 58, 4, 96, 30, 19]]


def tiny_model(seed=0, std=0.12, **overrides):
    """Weights of std 0.12 rather than 0.02: varied continuations that depend on the context, not one echoed token."""
    torch.manual_seed(seed)
    config = dict(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=112,
                  max_seq_len=96, tie_embeddings=False)
    model = Transformer(ModelConfig(**{**config, **overrides})).eval()
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() == 2:
                weight.normal_(0, std)
    return model


def full_forward_logprobs(model, prompts, completions, temperature):
    """log_softmax(logits / T) in fp32 (as the sampler computes it) of a fresh no-cache forward at each completion
    token: a list of [len] tensors on the CPU."""
    seqs = [p + c for p, c in zip(prompts, completions)]
    width = max(map(len, seqs))
    ids = torch.tensor([[0] * (width - len(s)) + s for s in seqs])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    device = model.lm_head.weight.device
    with torch.no_grad():
        logprobs = (model(ids.to(device), attention_mask=mask.to(device)).float() / temperature).log_softmax(-1)
    out = []
    for row, (s, c) in enumerate(zip(seqs, completions)):
        start = width - len(c)  # logits at position i predict token i + 1
        out.append(logprobs[row, start - 1:width - 1].cpu().gather(-1, torch.tensor(c)[:, None])[:, 0])
    return out


def test_greedy_matches_transformers_generate_on_a_ragged_batch():
    torch.manual_seed(0)
    hf = Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
                                      tie_word_embeddings=True, initializer_range=0.2)).eval()
    with torch.no_grad():  # random q/k/v biases, so the bias path counts
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    ours = Transformer.from_hf_model(hf).eval()
    width, pad = max(map(len, PROMPTS)), 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])

    def hf_new_tokens(stop_ids):
        with torch.no_grad():
            out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                              eos_token_id=stop_ids or None, pad_token_id=pad)
        return out[:, width:].tolist()

    free = generate(ours, PROMPTS, 20, temperature=0)
    assert free.tokens.tolist() == hf_new_tokens([]) and not free.stopped.any()
    stop = [free.tokens[0, 4].item(), free.tokens[2, 9].item()]  # rows 0 and 2 (at least) hit one of these
    ours_stop, expected = generate(ours, PROMPTS, 20, temperature=0, stop_ids=stop, pad_id=pad), hf_new_tokens(stop)
    assert ours_stop.stopped[0] and ours_stop.stopped[2] and ours_stop.lengths[0] <= 5
    for row, length in enumerate(ours_stop.lengths.tolist()):
        assert ours_stop.tokens[row, :length].tolist() == expected[row][:length]


def first_stop(tokens, sequences):
    """Reference: the length of `tokens` up to the end of the first stop sequence in it, None if there is none."""
    for end in range(1, len(tokens) + 1):
        if any(len(s) <= end and tokens[end - len(s):end] == s for s in sequences):
            return end
    return None


PAIRS = [[a, b] for a in range(1, 13) for b in range(13, 25)]  # two-token stops: sampled rows end at varied steps


@pytest.mark.parametrize("stops", [dict(stop_ids=[0, 1, 2]), dict(stop_ids=[0], stop_sequences=PAIRS + [[5, 5, 5]])])
def test_cached_logprobs_equal_a_full_forward_with_early_stops_and_compaction(monkeypatch, stops):
    monkeypatch.setattr(sample, "BUCKET", 8)  # several attention buckets within 40 tokens
    monkeypatch.setattr(sample, "CHECK_EVERY", 4)
    compactions = []
    original = sample._Decoder.compact
    monkeypatch.setattr(sample._Decoder, "compact", lambda self: (compactions.append(len(self.rows)), original(self)))
    model = tiny_model()
    prompts, pad = PROMPTS * 2, 96
    sequences = [[i] for i in stops["stop_ids"]] + stops.get("stop_sequences", [])
    out = generate(model, prompts, 40, temperature=0.7, seed=3, pad_id=pad, **stops)
    assert compactions, "no row was dropped from the batch: the compaction path went untested"
    assert out.stopped.any() and not out.stopped.all() and out.tokens.shape == (8, 40)
    lengths = out.lengths.tolist()
    assert len(set(lengths)) > 2, "rows should stop at different steps"
    expected = full_forward_logprobs(model, prompts, [out.tokens[r, :n].tolist() for r, n in enumerate(lengths)], 0.7)
    for row, n in enumerate(lengths):
        torch.testing.assert_close(out.logprobs[row, :n], expected[row], atol=1e-4, rtol=0)
        assert (out.tokens[row, n:] == pad).all() and (out.logprobs[row, n:] == 0).all()
        assert first_stop(out.tokens[row, :n].tolist(), sequences) == (n if out.stopped[row] else None)
        assert n == 40 or out.stopped[row]


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 0), (0.5, 1.0, 0), (1.3, 0.7, 0), (1.0, 1.0, 6),
                                                     (0.8, 0.9, 12)])
def test_sampled_frequencies_match_the_truncated_tempered_distribution(temperature, top_p, top_k):
    model = tiny_model(tie_embeddings=False)
    with torch.no_grad():
        model.lm_head.weight.mul_(2)  # a peaked next-token distribution, so T, top-p and top-k all matter
        logits = model(torch.tensor([[4, 8]]))[0, -1]
    draws = 6000
    out = generate(model, [[4, 8]] * draws, 1, temperature=temperature, top_p=top_p, top_k=top_k, seed=0)
    logprobs = (logits / temperature).log_softmax(-1)
    torch.testing.assert_close(out.logprobs[:, 0], logprobs[out.tokens[:, 0]], atol=1e-5, rtol=0)
    probs = logprobs.exp()
    ranked, order = probs.sort(descending=True)  # the intended support, computed independently
    keep = torch.zeros(VOCAB, dtype=torch.bool)
    kept = (top_k or VOCAB)
    keep[order[:kept]] = True
    ranked = ranked[:kept] / ranked[:kept].sum()
    keep[order[(ranked.cumsum(0) - ranked >= top_p).nonzero()[:, 0]]] = False
    counts = torch.bincount(out.tokens[:, 0], minlength=VOCAB)
    assert counts[~keep].sum() == 0, "a token outside the top-p / top-k set was sampled"
    assert_frequencies(counts[keep], probs[keep])


def assert_frequencies(counts, probs):
    """Chi-square goodness of fit of integer counts [K] to probabilities [K] (renormalised), rare bins pooled."""
    counts, probs = counts.double().cpu(), probs.double().cpu()
    expected = counts.sum() * probs / probs.sum()
    rare = expected < 5  # pool the rare tokens into one bin: chi-square needs expected counts >= 5
    if rare.any():
        counts = torch.cat([counts[~rare], counts[rare].sum()[None]])
        expected = torch.cat([expected[~rare], expected[rare].sum()[None]])
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    dof = len(counts) - 1
    assert dof >= 3 and chi2 < dof + 6 * (2 * dof) ** 0.5, f"chi-square {chi2:.1f} with {dof} degrees of freedom"


def test_a_stop_id_inside_the_prompt_does_not_stop_the_row():
    model = tiny_model()
    for stop in range(VOCAB):  # a stop id that starts every prompt but that the model then never generates
        prompts = [[stop] + p for p in PROMPTS]
        free = generate(model, prompts, 12, temperature=0)
        if not (free.tokens == stop).any():
            break
    out = generate(model, prompts, 12, temperature=0, stop_ids=[stop])
    assert torch.equal(out.tokens, free.tokens) and out.lengths.tolist() == [12] * 4 and out.truncated.all()


def test_a_stop_sequence_split_across_tokens_ends_the_row_and_is_kept():
    model = tiny_model()
    free = generate(model, PROMPTS, 20, temperature=0).tokens.tolist()
    split = free[1][5:8]  # three generated tokens of row 1
    never = next(t for t in range(VOCAB) if all(t not in row for row in free))
    partial = free[1][5:7] + [never]  # its first two ids are generated, its last never is: it must not stop a row
    stop_id = next(t for t in free[3][6:] if t not in free[1][:8])  # stops row 3, not row 1
    sequences = [split, partial, [stop_id]]
    assert first_stop(free[1], sequences) == 8  # the setup: row 1 ends with `split`
    out = generate(model, PROMPTS, 20, temperature=0, stop_ids=[stop_id], stop_sequences=[split, partial])
    assert out.tokens[1, 5:8].tolist() == split and out.lengths[1] == 8 and out.stopped[1]
    for row, tokens in enumerate(free):
        n = first_stop(tokens, sequences) or 20
        assert out.lengths[row] == n and out.stopped[row] == (first_stop(tokens, sequences) is not None)
        assert out.tokens[row, :n].tolist() == tokens[:n] and (out.tokens[row, n:] == 0).all()


def test_a_stop_sequence_in_the_prompt_does_not_stop_the_row():
    model = tiny_model()
    free = generate(model, PROMPTS, 12, temperature=0)
    inside = [p[-3:] for p in PROMPTS]
    straddling = [p[-2:] + [row[0]] for p, row in zip(PROMPTS, free.tokens.tolist())]  # its last id is generated
    assert all(first_stop(row, inside + straddling) is None for row in free.tokens.tolist())  # none generated whole
    out = generate(model, PROMPTS, 12, temperature=0, stop_sequences=inside + straddling)
    assert torch.equal(out.tokens, free.tokens) and out.lengths.tolist() == [12] * 4 and out.truncated.all()


def test_greedy_stop_at_answer_close_equals_transformers_stop_strings():
    """A tiny random Qwen2 made to write known Qwen tokens (a bigram chain through one-hot embeddings) stops where
    transformers' generate(stop_strings=["</answer>"]) does, on the token splits template.stop_sequences lists.
    (transformers also matches a stop string that begins in the prompt; generate() does not: no row does here.)"""
    tokenizer = load_tokenizer(qwen_tokenizer_dir())
    ids = lambda text: tokenizer.encode(text, add_special_tokens=False)
    chain = [("7", "4"), ("4", "2"), ("2", " </"), (" </", "answer"), ("answer", ">\n"), (">\n", "User"),
             ("User", ":"), (":", "User"), (" =", "</"), ("</", "answer"), (" <", "answer"), ("!", "Done"),
             ("Done", "<|im_end|>")]  # " <answer>\n" (after " <") is no stop; "</" and " </" begin two that are
    torch.manual_seed(0)
    hf = Qwen2ForCausalLM(Qwen2Config(vocab_size=151936, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
                                      tie_word_embeddings=False)).eval()
    with torch.no_grad():
        hf.lm_head.weight.zero_()
        for slot, (token, successor) in enumerate(chain):
            (token,), (successor,) = ids(token), ids(successor)
            hf.model.embed_tokens.weight[token] = torch.nn.functional.one_hot(torch.tensor(slot), 64)
            hf.lm_head.weight[successor, slot] = 1.0
    prompts = [ids(q) for q in ("Sum: 7", "Tag: <", "Close: =", "End!")]
    width, pad = max(map(len, prompts)), tokenizer.pad_token_id
    with torch.no_grad():
        expected = hf.generate(input_ids=torch.tensor([[pad] * (width - len(p)) + p for p in prompts]),
                               attention_mask=torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts]),
                               max_new_tokens=10, do_sample=False, stop_strings=["</answer>"], tokenizer=tokenizer,
                               eos_token_id=stop_token_ids(tokenizer), pad_token_id=pad)[:, width:]
    out = generate(Transformer.from_hf_model(hf).eval(), prompts, 10, temperature=0,
                   stop_sequences=stop_sequences(tokenizer, "r1_zero"), pad_id=pad)
    assert out.tokens.tolist() == expected.tolist()
    texts = [tokenizer.decode(row[:n]) for row, n in zip(out.tokens.tolist(), out.lengths.tolist())]
    assert texts == ["42 </answer>\n", "answer>\n" + "User:" * 4, "</answer>\n",
                     "Done<|im_end|>"]
    assert out.stopped.tolist() == [True, False, True, True]


def test_all_rows_stopping_early_shortens_the_output():
    out = generate(tiny_model(), PROMPTS, 30, stop_ids=range(VOCAB), seed=0, pad_id=1)
    assert out.tokens.shape == (4, 1) and out.lengths.tolist() == [1] * 4 and out.stopped.all()


def test_same_seed_same_output_different_seed_different_output():
    model = tiny_model()
    a, b, c = (generate(model, PROMPTS, 16, seed=s) for s in (7, 7, 8))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.tokens, c.tokens)


def test_bad_requests_are_clear_errors():
    model = tiny_model()
    with pytest.raises(ValueError, match=r"prompt #1 is 9 tokens; with max_new_tokens=90 that is 99, longer than the model's context of 96"):
        generate(model, PROMPTS, 90)
    with pytest.raises(ValueError, match="non-empty"):
        generate(model, [], 4)
    with pytest.raises(ValueError, match="non-empty"):
        generate(model, [[1, 2], []], 4)
    with pytest.raises(ValueError, match=r"\[0, 97\)"):
        generate(model, [[1, 97]], 4)
    with pytest.raises(ValueError, match="stop sequence is empty"):
        generate(model, PROMPTS, 4, stop_sequences=[[3, 4], []])
    with pytest.raises(ValueError, match=r"stop sequence \[3, 97\] has an id outside .*\[0, 97\)"):
        generate(model, PROMPTS, 4, stop_sequences=[[3, 97]])
    with pytest.raises(ValueError, match=r"stop sequence \[-1\] has an id outside"):
        generate(model, PROMPTS, 4, stop_ids=[-1])
    with pytest.raises(ValueError, match="list of token-id lists"):
        generate(model, PROMPTS, 4, stop_sequences=[3, 4])
    with pytest.raises(ValueError, match="list of token-id lists"):
        generate(model, PROMPTS, 4, stop_sequences=["</answer>"])


@pytest.mark.gpu
def test_fused_cuda_sampler_draws_from_the_tempered_distribution():
    torch.manual_seed(0)
    logits = (3 * torch.randn(10_000)).to("cuda", torch.bfloat16)  # 3 chunks of 4096: the cross-chunk merge counts
    generator = torch.Generator("cuda").manual_seed(0)
    ids, logprobs = sample.sample_next(logits.expand(40_000, -1), 0.8, 1.0, 0, generator)
    assert not sample.FALLEN_BACK  # the fused kernel drew these, not the torch ops after a fallback
    expected = (logits.float() / 0.8).log_softmax(-1)
    torch.testing.assert_close(logprobs, expected[ids], atol=1e-5, rtol=0)
    assert_frequencies(torch.bincount(ids, minlength=10_000), expected.exp())


@pytest.mark.gpu
def test_cuda_graphs_equal_the_eager_loop_and_a_full_forward():
    model = tiny_model(dim=256, n_layers=4, n_heads=8, n_kv_heads=2, head_dim=32, ffn_dim=512, vocab_size=2048,
                       max_seq_len=512).to("cuda", torch.bfloat16)
    prompts = [[(7 * i + 3 * j) % 2048 for j in range(20 + 13 * i)] for i in range(12)]
    for kwargs in (dict(temperature=0), dict(temperature=0.8, top_p=0.95, seed=1), dict(temperature=1.0, seed=2),
                   dict(temperature=1.0, seed=3, stop_ids=range(40))):  # early stops: compaction and recapture
        graphed = generate(model, prompts, 300, **kwargs)
        eager = generate(model, prompts, 300, cuda_graphs=False, **kwargs)
        assert graphed.fast_paths["cuda_graphs"] and "cuda_graphs" not in eager.fast_paths, sample.FALLEN_BACK
        assert torch.equal(graphed.tokens, eager.tokens), kwargs
        torch.testing.assert_close(graphed.logprobs, eager.logprobs, atol=1e-3, rtol=0)
    greedy = generate(model, prompts, 300, temperature=0)
    assert_logprobs_of_a_full_forward(model, prompts, greedy)


@pytest.mark.gpu
def test_the_fused_decode_kernels_equal_themselves_graphed_and_a_full_forward():
    """Issue 56: the sampler's copy (fused projections) decodes with kernels.decode_step, eager and as CUDA graphs
    alike (the same kernels: the same tokens), its log-probs those of a full forward within bf16's rounding, for
    grouped heads and plain ones, with early stops (compaction, recapture)."""
    for heads, kv in ((8, 2), (4, 4)):
        model = tiny_model(dim=256, n_layers=4, n_heads=heads, n_kv_heads=kv, head_dim=32, ffn_dim=512,
                           vocab_size=2048, max_seq_len=512).to("cuda", torch.bfloat16).fuse_projections()
        prompts = [[(7 * i + 3 * j) % 2048 for j in range(20 + 13 * i)] for i in range(12)]
        for kwargs in (dict(temperature=0), dict(temperature=1.0, seed=3, stop_ids=range(40))):
            graphed = generate(model, prompts, 300, **kwargs)
            eager = generate(model, prompts, 300, cuda_graphs=False, **kwargs)
            assert graphed.fast_paths["fused_decode"] and graphed.fast_paths["cuda_graphs"], sample.FALLEN_BACK
            assert torch.equal(graphed.tokens, eager.tokens), kwargs
            torch.testing.assert_close(graphed.logprobs, eager.logprobs, atol=1e-3, rtol=0)
            assert_logprobs_of_a_full_forward(model, prompts, graphed)


def assert_logprobs_of_a_full_forward(model, prompts, rollout):
    """The sampler's log-probs of its tokens are as close to an fp32 no-cache forward of the same weights as the
    model's own bf16 forward is (issue 63: the tolerance is the measured error of torch's bf16 path, on the same
    device): within twice its largest error over the rollout. Both round each layer's sums to bf16, in other orders
    (the cache, the fused kernels' bf16 attention dots), so neither is the other to the bit; a mask, position or cache
    error costs whole units. On an H100 (2026-11-28): 0.25-0.44 against its 0.22-0.41 (0.70-1.15x); 0.18 from the bf16 forward."""
    completions = [rollout.tokens[r, :n].tolist() for r, n in enumerate(rollout.lengths.tolist())]
    exact = Transformer(model.config).to(model.lm_head.weight.device).eval()
    exact.load_state_dict({name: weight.float() for name, weight in model.state_dict().items()})
    with torch.no_grad():
        fp32 = full_forward_logprobs(exact, prompts, completions, 1.0)
        own = full_forward_logprobs(model, prompts, completions, 1.0)
    got = [rollout.logprobs[row, :len(c)].float().cpu() for row, c in enumerate(completions)]
    torch_error = max((o.float() - e).abs().max().item() for o, e in zip(own, fp32))
    error = max((g - e).abs().max().item() for g, e in zip(got, fp32))
    print(f"sampler's log-probs from an fp32 forward: {error:.4f}; the bf16 forward's own: {torch_error:.4f}")
    assert 0 < torch_error and error <= 2 * torch_error, (error, torch_error)


def test_per_row_seeds_make_each_row_independent_of_its_batch():
    model = tiny_model()
    seeds = [11, 12, 13, 14]
    together = generate(model, PROMPTS, 12, temperature=1.0, seed=seeds)
    for i, prompt in enumerate(PROMPTS):  # alone, or beside other rows, a row draws the same tokens
        alone = generate(model, [prompt], 12, temperature=1.0, seed=[seeds[i]])
        assert alone.tokens[0].tolist() == together.tokens[i, :alone.tokens.shape[1]].tolist()
    assert together.tokens[0].tolist() != generate(model, PROMPTS, 12, temperature=1.0, seed=[99, 12, 13, 14]).tokens[0].tolist()
    with pytest.raises(ValueError, match="one per prompt"):
        generate(model, PROMPTS, 4, seed=[1, 2])


def one_warning_each(capsys, path: str, doing: str = ""):
    """One line said, naming the fast path, what it failed to do and the config key that skips it."""
    lines = [line for line in capsys.readouterr().err.splitlines() if "going on with the eager torch path" in line]
    assert len(lines) == 1 and lines[0].startswith(f"sample.py: {path} failed {doing}"), lines
    assert f"{sample.SWITCHES[path]}=False skips the attempt" in lines[0] and lines[0] == sample.FALLEN_BACK[path]


class FakeCuda:
    """torch.cuda's graph machinery on the CPU, following torch 2.11's own rules.

    Private pools are counted twice, by the device's caching allocator (c10/cuda/CUDACachingAllocator.cpp:
    create_or_incref_pool and releasePool) and by the pinned host one (aten/src/ATen/core/CachingHostAllocator.h:
    create_or_incref_pool_under_lock, release_pool), each by the same rule: the first use of an id makes a pool with
    one user; a later one asserts TORCH_INTERNAL_ASSERT(use_count > 0) before counting one more; a release counts one
    fewer and keeps the pool under its id, at 0 users. CUDAGraph.capture_begin(pool=id) uses the pool in both
    (aten/src/ATen/cuda/CUDAGraph.cpp), CUDAGraph::reset releases both when a graph whose capture ended is freed;
    MemPool() uses and ~MemPool releases the device allocator's only (aten/src/ATen/cuda/MemPool.cpp), and
    graph_pool_handle() only draws a fresh id, making no pool. A capture records the step's work without running it
    (the decoder's step is intercepted while a capture is under way); each replay runs it."""

    def __init__(self):
        self.users, self.host_users, self.ids = {}, {}, itertools.count(1)  # pool id -> users, per allocator
        self.capturing, self.captures = None, []  # the graph being captured; (rows, attended slots) of each capture

    @staticmethod
    def incref(users: dict, pool, where: str):
        if pool in users and users[pool] <= 0:
            raise RuntimeError(f"it->second->use_count > 0 INTERNAL ASSERT FAILED at {where}, please report a bug "
                               "to PyTorch.")
        users[pool] = users.get(pool, 0) + 1


@pytest.fixture
def fake_cuda(monkeypatch):
    """sample.py's CUDA graph path on the CPU, through FakeCuda; returns it."""
    cuda = FakeCuda()

    class MemPool:
        def __init__(self):
            self.id = (0, next(cuda.ids))
            cuda.incref(cuda.users, self.id, "c10/cuda/CUDACachingAllocator.cpp")

        def __del__(self):
            cuda.users[self.id] -= 1

    class CUDAGraph:
        pool, ended = None, False

        def register_generator_state(self, generator):
            pass

        def capture_begin(self, pool=None):
            self.pool, self.work = pool or (next(cuda.ids), 0), []
            cuda.incref(cuda.users, self.pool, "c10/cuda/CUDACachingAllocator.cpp")
            cuda.incref(cuda.host_users, self.pool, "aten/src/ATen/core/CachingHostAllocator.h")
            cuda.capturing = self

        def capture_end(self):
            cuda.capturing, self.ended = None, True

        def replay(self):
            for work in self.work:
                work()

        def __del__(self):
            if self.ended:
                cuda.users[self.pool] -= 1
                cuda.host_users[self.pool] -= 1

    real_step = sample._Decoder.step

    def memory(decoder):
        """What a captured step's kernels have baked in: each tensor it reads or writes, by address, shape and
        strides."""
        tensors = [getattr(decoder, name) for name in ("rows", "pos", "starts", "last", "recent", "mask", "tokens",
                                                       "logprobs", "stops", "slot", "stop")]
        return [(t.data_ptr(), t.shape, t.stride()) for t in tensors + [decoder.cache.k, decoder.cache.v]]

    def step(decoder):
        if cuda.capturing is None:
            return real_step(decoder)
        captured = memory(decoder)

        def replay():  # a graph replays on the memory it was captured on, whatever the Python objects say
            assert memory(decoder) == captured, "a replay on other memory than its capture's"
            real_step(decoder)
        cuda.capturing.work.append(replay)
        cuda.captures.append((len(decoder.rows), decoder.attend))

    class Stream:
        def wait_stream(self, other):
            pass
    monkeypatch.setattr(sample._Decoder, "step", step)
    monkeypatch.setattr(sample, "FAST_PATH_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(sample, "GRAPH_RESOURCES", {})
    for name, fake in dict(MemPool=MemPool, CUDAGraph=CUDAGraph, graph_pool_handle=lambda: (0, next(cuda.ids)),
                           Stream=lambda device=None: Stream(), current_stream=lambda device=None: Stream(),
                           stream=lambda stream: contextlib.nullcontext(), synchronize=lambda device=None: None,
                           device=lambda device: contextlib.nullcontext()).items():
        monkeypatch.setattr(torch.cuda, name, fake)
    return cuda


def test_a_failing_cuda_graph_capture_falls_back_to_the_eager_loop_with_one_warning(monkeypatch, capsys, fake_cuda):
    """Issue 42: the capture fails (mocked: the CPU has no CUDA graphs); the step it warmed up with still counts, the
    rest decodes eagerly, the tokens are the eager loop's, one line says so, and a later call stays eager silently;
    each rollout says CUDA graphs did not decode it (issue 46)."""
    model = tiny_model()
    eager = generate(model, PROMPTS, 20, temperature=1.0, seed=3, cuda_graphs=False, fused_sampling=False)
    captures = []

    def failing_capture(step, generator, pool):
        captures.append(1)
        raise RuntimeError("operation not permitted when stream is capturing\n(more lines)")
    monkeypatch.setattr(sample, "_capture", failing_capture)
    for _ in range(2):
        out = generate(model, PROMPTS, 20, temperature=1.0, seed=3, cuda_graphs=True, fused_sampling=False)
        assert torch.equal(out.tokens, eager.tokens) and torch.equal(out.logprobs, eager.logprobs)
        assert out.fast_paths == {"cuda_graphs": False, "fused_decode": False}  # not a fused model
    assert len(captures) == 1 and sample.GRAPHS in sample.FALLEN_BACK
    one_warning_each(capsys, "CUDA graphs", "to capture a decode step (RuntimeError: operation not permitted")


def test_cuda_graphs_that_cannot_even_be_set_up_fall_back_too(monkeypatch, capsys):
    """A fast-path device without CUDA (the CPU, made one here; bench.py --fast_paths_on_cpu rehearses the same):
    making the side stream and the pool fails, which is a fallback like any other, not a crash."""
    monkeypatch.setattr(sample, "FAST_PATH_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(sample, "GRAPH_RESOURCES", {})
    model = tiny_model()
    eager = generate(model, PROMPTS, 20, temperature=1.0, seed=3, cuda_graphs=False, fused_sampling=False,
                     fused_decode=False)
    out = generate(model, PROMPTS, 20, temperature=1.0, seed=3, fused_sampling=False, fused_decode=False)
    assert torch.equal(out.tokens, eager.tokens) and out.fast_paths == {"cuda_graphs": False}
    assert eager.fast_paths == {}  # a path not asked for is not reported
    one_warning_each(capsys, "CUDA graphs", "to set up (a side stream and a memory pool)")


def test_a_failing_fused_sampling_kernel_falls_back_to_the_torch_ops_with_one_warning(monkeypatch, capsys):
    """Issue 42: Triton builds its launcher with a C compiler on first use, which a slim image lacks; the kernel's
    failure (mocked) leaves the draw to the torch ops, whose tokens these are, with one line said once."""
    model = tiny_model()
    plain = generate(model, PROMPTS, 12, temperature=1.0, seed=5, fused_sampling=False)
    launches = []

    def failing_kernel(logits, temperature, generator, decoder=None):  # the draw alone, or record()
        launches.append(1)
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")
    monkeypatch.setattr(sample, "FAST_PATH_DEVICES", ("cuda", "cpu"))  # the CPU made a fast-path device
    monkeypatch.setattr(sample, "_fused_possible", lambda device, temperature, top_p, top_k:
                        sample.FUSED not in sample.FALLEN_BACK)
    monkeypatch.setattr(sample, "_fused_gumbel_sample", failing_kernel)
    for _ in range(2):
        out = generate(model, PROMPTS, 12, temperature=1.0, seed=5, cuda_graphs=False, fused_decode=False)
        assert torch.equal(out.tokens, plain.tokens) and torch.equal(out.logprobs, plain.logprobs)
    assert len(launches) == 1
    one_warning_each(capsys, sample.FUSED, "to compile or launch")


def test_a_failure_inside_a_capture_ends_the_capture_and_raises_the_steps_own_error(monkeypatch):
    """Issue 42: an exception between capture_begin and capture_end must not leave the stream capturing (the
    emergency checkpoint would fail too and bury the real error): the capture is ended, the step's error raised."""
    events = []

    class Graph:
        def register_generator_state(self, generator):
            pass

        def capture_begin(self, pool=None):
            events.append(("begin", pool))

        def capture_end(self):
            events.append("end")
            raise RuntimeError("capture invalidated")  # ending an aborted capture complains too: not the story

    def step():
        raise ValueError("the step's own error")
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    with pytest.raises(ValueError, match="the step's own error"):
        sample._capture(step, generator=None, pool="the one pool")
    assert events == [("begin", "the one pool"), "end"]


def test_captures_across_rollouts_buckets_and_compactions_never_find_their_pool_released(monkeypatch, fake_cuda):
    """Issue 46: sample.py passed one graph_pool_handle() to every capture; the allocators (fake_cuda follows their
    rule) refuse a capture into a pool once every graph captured into it is freed, which happened at the first new
    bucket: every later capture of the process failed and decoding went eager. With a keeper graph holding the pool
    for the process (a MemPool would hold the device allocator's count only, not the host one's: it failed on an
    H200), a rollout with bucket changes and compactions makes several captures, none fails, and the tokens are the
    eager loop's. Issue 63: the graphs are kept with the decoder (sample.KEPT) and the next rollout of the same shapes
    replays them, capturing nothing, on the memory they were captured on (the fake checks it), with the same tokens;
    another seed replays them too. A rollout of another batch size replaces the kept decoder: its graphs freed, both
    counts of users come back to the keeper's own and the new graphs'."""
    monkeypatch.setattr(sample, "BUCKET", 8)  # a new bucket, so a new capture, every 8 tokens
    monkeypatch.setattr(sample, "CHECK_EVERY", 4)
    model, prompts, stops = tiny_model(), PROMPTS * 4, dict(stop_ids=range(0, VOCAB, 9))
    eager = generate(model, prompts, 40, seed=3, cuda_graphs=False, fused_sampling=False, **stops)
    for rollout in range(2):
        captured = len(fake_cuda.captures)
        out = generate(model, prompts, 40, seed=3, fused_sampling=False, **stops)
        shapes = fake_cuda.captures[captured:]
        if rollout == 0:
            assert len(shapes) >= 4 and len({rows for rows, _ in shapes}) >= 2, shapes  # buckets, and compactions
        else:
            assert shapes == [], shapes  # every step a replay
        assert torch.equal(out.tokens, eager.tokens) and torch.equal(out.logprobs, eager.logprobs)
        assert out.fast_paths == {"cuda_graphs": True, "fused_decode": False} and not sample.FALLEN_BACK
    other = generate(model, prompts, 40, seed=4, fused_sampling=False, **stops)
    assert torch.equal(other.tokens, generate(model, prompts, 40, seed=4, cuda_graphs=False, fused_sampling=False,
                                              **stops).tokens)
    (_, pool, _), = sample.GRAPH_RESOURCES.values()  # one stream and one pool served every capture
    kept = len(sample.KEPT[0].replays)
    assert kept >= 4 and fake_cuda.users == fake_cuda.host_users == {pool: 1 + kept}  # the keeper and the kept graphs
    generate(model, PROMPTS, 40, seed=3, fused_sampling=False, **stops)  # another batch size
    gc.collect()  # the fake's captured steps refer to their decoder (a real graph holds no Python object): a cycle
    assert fake_cuda.users == fake_cuda.host_users == {pool: 1 + len(sample.KEPT[0].replays)}


def test_the_prefill_in_pieces_of_rows_equals_one_prefill_and_frees_its_hidden_states(monkeypatch):
    """Issue 42: rows x prompt length beyond PREFILL_TOKENS prefill in pieces, each writing its rows' cache: the same
    tokens and log-probs (to rounding) as one prefill; and no prefill's hidden states live on into the decode loop."""
    import weakref
    model = tiny_model()
    whole = generate(model, PROMPTS, 10, temperature=0)
    monkeypatch.setattr(sample, "PREFILL_TOKENS", 2 * max(map(len, PROMPTS)))  # two rows a forward
    forwards, alive = [], []
    real_forward, real_step = model.forward, sample._Decoder.step

    def forward(ids, *args, **kwargs):
        out = real_forward(ids, *args, **kwargs)
        if ids.shape[1] > 1:
            forwards.append(weakref.ref(out))
        return out

    def step(self):
        alive.append(any(ref() is not None for ref in forwards))
        return real_step(self)
    monkeypatch.setattr(model, "forward", forward)
    monkeypatch.setattr(sample._Decoder, "step", step)
    pieces = generate(model, PROMPTS, 10, temperature=0)
    assert len(forwards) == 2 and alive and not any(alive)
    assert torch.equal(pieces.tokens, whole.tokens) and torch.allclose(pieces.logprobs, whole.logprobs, atol=1e-5)


class CallCount(torch.overrides.TorchFunctionMode):
    """Counts the tensor operations called, each about one kernel launch on a GPU; views, shapes
    and metadata are not counted."""
    FREE = {"view", "reshape", "expand", "expand_as", "transpose", "split", "chunk", "detach",
            "__getitem__", "__get__", "__len__", "__bool__", "__index__", "__format__", "size",
            "dim", "numel", "stride", "tolist", "__hash__", "__iter__", "unsqueeze", "squeeze"}

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") not in self.FREE:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def test_a_decode_step_launches_at_most_24_ops_per_layer_and_35_around_them():
    """At GRPO's decode shapes a step's time is set by how many kernels it launches (issue 49):
    the ops of one decode step of generate, per transformer layer and outside the layers, counted
    as the difference between 32 and 64 new tokens, for 1 and 2 layers (the eager path, which CUDA
    graphs capture on a GPU; the stop sequences of a GRPO rollout included)."""
    def per_step(n_layers):
        counts = []
        for new_tokens in (32, 64):
            model = tiny_model(n_layers=n_layers, max_seq_len=128)
            with torch.inference_mode(), CallCount() as count:
                generate(model, [[1, 2, 3, 4, 5, 6, 7, 8]] * 4, new_tokens, seed=0,
                         stop_ids=(96,), stop_sequences=[[94, 95, 96], [95, 96]])
            counts.append(count.calls)
        return (counts[1] - counts[0]) / 32
    one, two = per_step(1), per_step(2)
    per_layer, outside = two - one, 2 * one - two
    assert per_layer <= 24 and outside <= 35, (per_layer, outside)


def test_a_rollout_that_keeps_no_graphs_captures_anew_and_leaves_the_kept_decoder(monkeypatch, fake_cuda):
    """Issue 63: keep_graphs=False (a run whose update has no room for the cache: run_management.keep_graphs_of)
    captures its graphs anew in every rollout and keeps nothing; it leaves a decoder kept by another rollout alone;
    the tokens are the same either way. A model with LoRA adapters (merged weights made anew each rollout) keeps
    nothing either."""
    monkeypatch.setattr(sample, "BUCKET", 8)
    model = tiny_model()
    eager = generate(model, PROMPTS, 20, seed=3, cuda_graphs=False, fused_sampling=False)
    for _ in range(2):
        captured = len(fake_cuda.captures)
        out = generate(model, PROMPTS, 20, seed=3, fused_sampling=False, keep_graphs=False)
        assert len(fake_cuda.captures) > captured and sample.KEPT == []
        assert torch.equal(out.tokens, eager.tokens)
    generate(model, PROMPTS, 20, seed=3, fused_sampling=False)
    kept = sample.KEPT[0]
    generate(model, PROMPTS, 20, seed=3, fused_sampling=False, keep_graphs=False)
    assert sample.KEPT == [kept]
    model.add_lora(2, 4.0, 0.0, ["q_proj"])
    sample.KEPT.clear()
    with model.lora_merged():
        generate(model, PROMPTS, 20, seed=3, fused_sampling=False)
    assert sample.KEPT == []
