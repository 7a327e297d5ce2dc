"""
Several processes: `torchrun --nproc_per_node=N train.py ...` starts N ranks with RANK, WORLD_SIZE and LOCAL_RANK
set. Every rank draws the same questions and samples its own slice of whole groups; the loss normalisers are the
whole batch's, so the ranks' gradients add up to the single-process gradient; rank 0 writes every file.
Without torchrun there is no process group and these helpers change nothing.
"""
import dataclasses
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn.parallel import DistributedDataParallel

from model import Transformer


def rank() -> int:
    return int(os.environ.get("RANK", 0))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", 1))


def init_distributed(device: torch.device) -> torch.device:
    """Under torchrun, join the process group (nccl on CUDA, gloo on the CPU); returns this rank's device."""
    if "RANK" not in os.environ:
        return device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


class Replicas(DistributedDataParallel):
    """DDP that lends out its model's lm_head: completion_logprobs applies it to hidden states outside forward()."""

    @property
    def lm_head(self):
        return self.module.lm_head


def spread(policy: Transformer, sharding: str, device: torch.device) -> Replicas | None:
    """Spread the policy over the ranks. "ddp": a replica per rank, gradients all-reduced; returns the wrapper the
    loss must run through. "fsdp": FSDP2 shards the fp32 weights, their gradients and so the AdamW state over the
    ranks, one group per Block, then the root (embeddings, norm, lm_head), in place; returns None."""
    if sharding == "ddp":  # bucket views: the gradients live in DDP's buckets instead of beside them (4 B/param)
        return Replicas(policy, device_ids=[device] if device.type == "cuda" else None, gradient_as_bucket_view=True)
    from torch.distributed.fsdp import fully_shard  # imported here: public from torch 2.6, plain runs need less
    mesh = init_device_mesh(device.type, (world_size(),))
    for block in policy.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(policy, mesh=mesh)
    return None


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """tensor whole: an FSDP2 DTensor shard is all-gathered (a collective: every rank must call this)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def gathered_to_rank0(state: dict) -> dict:
    """state with its FSDP2 shards replaced, in place and one at a time, by whole tensors on rank 0's CPU (other
    ranks drop theirs: a whole 7B state fits on no GPU, nor eight times in one host's memory); a collective."""
    for key, value in state.items():
        if isinstance(value, DTensor):
            value = value.full_tensor()
            state[key] = value.cpu() if rank() == 0 else None
    return state


def copy_weights(target: Transformer, source: Transformer):
    """target's weights := source's, cast to target's dtype; FSDP2 shards are gathered one tensor at a time, so no
    whole fp32 copy of the model is ever made (a collective under FSDP2)."""
    with torch.no_grad():
        into = target.state_dict()
        for name, tensor in source.state_dict().items():
            into[name].copy_(whole(tensor))


def shard_optimizer_state(optimizer: torch.optim.Optimizer):
    """After loading a checkpoint's whole AdamW moments into an optimizer over FSDP2 shards, keep each rank's shard."""
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(param, DTensor) and value.shape == param.shape:  # the moments; not the 0-d step count
                state[key] = distribute_tensor(value, param.device_mesh, param.placements)


def summed_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """tensor summed over the ranks, in place (a collective); tensor itself in a single process."""
    if dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor


def max_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """tensor's elementwise maximum over the ranks, in place (a collective); tensor itself in a single process."""
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def from_every_rank(obj) -> list:
    """[rank 0's obj, rank 1's, ...] (a collective); [obj] in a single process."""
    if not dist.is_initialized():
        return [obj]
    objs = [None] * world_size()
    dist.all_gather_object(objs, obj)
    return objs


def all_samples(samples):
    """Every rank's rollout.Samples in rank order, i.e. the whole step's rows, for the log; timings are the slowest
    rank's. The per-token log-probs stay on their rank (None here): the log does not read them."""
    if not dist.is_initialized():
        return samples
    parts, merged = [vars(part) for part in from_every_rank(dataclasses.replace(samples, logprobs=None))], {}
    for key, value in parts[0].items():
        if value is None:  # logprobs; claims, without process supervision
            merged[key] = None
        elif isinstance(value, list):
            merged[key] = [x for part in parts for x in part[key]]
        elif isinstance(value, dict):  # the reward components
            merged[key] = {name: [x for part in parts for x in part[key][name]] for name in value}
        else:  # seconds: the step waits for the slowest rank
            merged[key] = max(part[key] for part in parts)
    return type(samples)(**merged)
