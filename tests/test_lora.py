"""LoRA in model.py: starts as the base model, trains only the adapters, and switches off into the exact base."""
import copy
import io

import pytest
import torch
import torch.nn.functional as F

from model import LORA_TARGETS, ModelConfig, Transformer

CONFIG = dict(vocab_size=97, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=112, max_seq_len=128)


def base_model(seed=0):
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**CONFIG))


def batch():
    torch.manual_seed(1)
    return torch.randint(0, CONFIG["vocab_size"], (3, 12))


def train(model, steps=3, lr=1e-2):
    """A few AdamW steps of next-token loss on one random batch, over the trainable parameters only."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    ids = batch()
    for _ in range(steps):
        loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model


def logits(model):
    with torch.no_grad():
        return model(batch())


def test_fresh_adapters_give_the_base_logits_exactly():
    base = base_model().eval()
    lora = copy.deepcopy(base).add_lora(rank=4, alpha=8, targets=LORA_TARGETS)
    assert lora.layers[0].attn.q_proj.lora_A.abs().sum() > 0  # B = 0 alone must be what cancels the update
    assert torch.equal(logits(lora), logits(base))


def test_only_the_adapters_train():
    base = base_model()
    lora = copy.deepcopy(base).add_lora(rank=4, alpha=8, targets=("q_proj", "v_proj", "down_proj"))
    trainable = {name for name, p in lora.named_parameters() if p.requires_grad}
    assert trainable and all(name.rsplit(".", 1)[-1] in ("lora_A", "lora_B") for name in trainable)
    c = lora.config
    per_layer = (c.dim + c.n_heads * c.head_dim) + (c.dim + c.n_kv_heads * c.head_dim) + (c.ffn_dim + c.dim)
    assert sum(lora.get_parameter(n).numel() for n in trainable) == c.n_layers * 4 * per_layer  # r (in + out)
    lora.zero_grad()
    ids = batch()
    F.cross_entropy(lora(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
    for name, p in lora.named_parameters():
        assert (p.grad is not None) == (name in trainable), name
    train(lora)
    frozen = base.state_dict()
    for name, p in lora.state_dict().items():
        if "lora_" not in name:
            assert torch.equal(p, frozen[name]), f"{name} moved: the base weights must stay frozen"


def test_adapters_disabled_is_the_base_model_after_training():
    base = base_model().eval()
    lora = train(copy.deepcopy(base).add_lora(rank=4, alpha=8, targets=LORA_TARGETS)).eval()
    trained = logits(lora)
    assert not torch.allclose(trained, logits(base), atol=1e-3)  # the adapters changed the policy
    with lora.adapters_disabled():
        assert torch.equal(logits(lora), logits(base))
    assert torch.equal(logits(lora), trained)  # switched back on when the block ends


def test_merge_computes_the_same_function_and_unmerge_restores_the_weights():
    base = base_model().eval()
    lora = train(copy.deepcopy(base).add_lora(rank=4, alpha=8, targets=LORA_TARGETS)).eval()
    weights = {n: t.clone() for n, t in lora.state_dict().items()}
    live = logits(lora)
    lora.merge_lora()
    merged = logits(lora)
    assert not torch.equal(merged, live)  # the merged weights are what runs, not the adapter path
    torch.testing.assert_close(merged, live, atol=1e-5, rtol=0)
    with lora.adapters_disabled():
        assert torch.equal(logits(lora), logits(base))
    with pytest.raises(RuntimeError, match="unmerge_lora"):
        lora(batch())  # a forward that would train the snapshot
    lora.unmerge_lora()
    for name, t in lora.state_dict().items():
        assert torch.equal(t, weights[name]), name
    assert torch.equal(logits(lora), live)


def test_merged_state_dict_is_a_plain_model_and_leaves_the_live_one_alone():
    lora = train(base_model().add_lora(rank=4, alpha=8, targets=LORA_TARGETS)).eval()
    weights = {n: t.clone() for n, t in lora.state_dict().items()}
    plain = base_model(seed=5).eval()
    plain.load_state_dict(lora.merged_state_dict(), strict=True)
    torch.testing.assert_close(logits(plain), logits(lora), atol=1e-5, rtol=0)
    for name, t in lora.state_dict().items():
        assert torch.equal(t, weights[name]), name


def test_checkpoint_round_trip_keeps_the_adapters():
    lora = train(base_model().add_lora(rank=4, alpha=8, dropout=0.1, targets=LORA_TARGETS)).eval()
    buffer = io.BytesIO()
    torch.save(lora.state_dict(), buffer)
    resumed = base_model(seed=7).add_lora(rank=4, alpha=8, dropout=0.1, targets=LORA_TARGETS).eval()
    resumed.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())), strict=True)
    assert torch.equal(logits(resumed), logits(lora))
    with resumed.adapters_disabled(), lora.adapters_disabled():
        assert torch.equal(logits(resumed), logits(lora))  # the base weights came back too


def test_dropout_acts_on_the_adapter_path_in_training_only():
    lora = train(base_model().add_lora(rank=4, alpha=8, dropout=0.5, targets=LORA_TARGETS))
    ids = batch()  # drawn once: batch() reseeds the generator that dropout draws from
    with torch.no_grad():
        assert not torch.equal(lora(ids), lora(ids))
        lora.eval()
        assert torch.equal(lora(ids), lora(ids))
        with lora.adapters_disabled():
            lora.train()
            assert torch.equal(lora(ids), lora(ids))  # nothing random outside the adapters


def test_gradient_checkpointing_gives_the_same_adapter_gradients():
    lora = train(base_model().add_lora(rank=4, alpha=8, targets=LORA_TARGETS))
    grads = []
    for flag in (False, True):
        lora.grad_checkpointing = flag
        lora.zero_grad()
        lora(batch()).logsumexp(-1).sum().backward()
        grads.append([p.grad.clone() for p in lora.parameters() if p.requires_grad])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_bad_lora_requests_are_refused_by_name():
    with pytest.raises(ValueError, match="targets must be"):
        base_model().add_lora(rank=4, alpha=8, targets=("qkv_proj",))
    with pytest.raises(ValueError, match="rank >= 1"):
        base_model().add_lora(rank=0, alpha=8)
    with pytest.raises(ValueError, match="already has LoRA"):
        base_model().add_lora(rank=4, alpha=8).add_lora(rank=4, alpha=8)
    with pytest.raises(ValueError, match="no LoRA adapters"):
        with base_model().adapters_disabled():
            pass
