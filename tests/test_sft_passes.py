"""sft.causal_passes (sft_rows_per_pass > 0, configs/demo_aha.py): the warm start's rows right-padded under causal
attention, without the dense mask, give the loss and gradients of the default left-padded micro-batches."""
import contextlib
import random

import pytest
import torch

import sft
from model import ModelConfig, Transformer


def tiny_rows(n=7, seed=0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, 50) for _ in range(rng.randrange(3, 12))] for _ in range(n)]
    targets = [[rng.randrange(1, 50) for _ in range(rng.randrange(1, 15))] for _ in range(n)]
    return prompts, targets


def loss_and_grads(rows_per_pass, prompts, targets, chunk=2048):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=50, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                                    ffn_dim=48, max_seq_len=64))
    loss = sft.sft_loss_backward(model, prompts, targets, 3, 0, "cpu", contextlib.nullcontext(), chunk,
                                 rows_per_pass)
    return loss, {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("rows_per_pass, chunk", [(1, 2048), (3, 2048), (8, 5)])
def test_causal_passes_give_the_masked_loss_and_gradients(rows_per_pass, chunk):
    prompts, targets = tiny_rows()
    loss, grads = loss_and_grads(0, prompts, targets)
    causal_loss, causal_grads = loss_and_grads(rows_per_pass, prompts, targets, chunk)
    assert causal_loss.item() == pytest.approx(loss.item(), rel=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(causal_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_causal_passes_score_each_target_token_once():
    prompts, targets = tiny_rows()
    passes = sft.causal_passes(prompts, targets, 3, pad_id=0, device="cpu")
    assert sum(len(ids) for ids, _ in passes) == len(prompts)
    scored_ids = sorted(tuple(ids[row, 1:][scored[row, :-1]].tolist()) for ids, scored in passes
                        for row in range(len(ids)))
    assert scored_ids == sorted(map(tuple, targets))
    widths = [ids.shape[1] for ids, _ in passes]
    assert widths == sorted(widths)  # rows of a length share a pass: each pass as wide as its longest
    assert all(not scored[:, -1].any() for _, scored in passes)
