"""
Several processes: `torchrun --nproc_per_node=N train.py ...` starts N ranks with RANK, WORLD_SIZE
and LOCAL_RANK set. Every rank draws the same questions and samples its own slice of whole groups;
the loss normalisers are the whole batch's, so the ranks' gradients add up to the single-process
gradient; rank 0 writes every file. Without torchrun there is no process group and these helpers
change nothing.

Every rank starts from rank 0's weights (broadcast_weights: a warm start on GPU is not bitwise
reproducible). "ddp" keeps a replica of the policy per rank; "fsdp" (FSDP2) shards it in place
(spread). Under FSDP2 the sampler is a whole copy (bf16 on GPU: 2 B/param on every rank) refreshed
after each update, not the policy unsharded around generation: every FSDP2 forward is a collective,
while each rank decodes as many steps as its own rows need.
"""
import contextlib
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
    """Under torchrun, join the process group (nccl on CUDA, gloo on the CPU); returns this rank's
    device."""
    if "RANK" not in os.environ:
        return device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def sharded(sharding: str) -> bool:
    """True under torchrun with sharding="fsdp": the policy's weights are FSDP2 shards."""
    return dist.is_initialized() and sharding == "fsdp"


def broadcast_weights(model: Transformer):
    """Every rank takes rank 0's weights (a collective under torchrun; nothing alone)."""
    if dist.is_initialized():
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)


def barrier():
    """Wait for every rank (nothing alone)."""
    if dist.is_initialized():
        dist.barrier()


def leave_together():
    """At the end of a torchrun run: wait for every rank, then leave the process group (a gloo rank
    that tears down while another still works can abort it). Nothing alone."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


class Replicas(DistributedDataParallel):
    """DDP that lends out its model's lm_head: completion_logprobs applies it to hidden states
    outside forward()."""

    @property
    def lm_head(self):
        return self.module.lm_head


def spread(policy: Transformer, sharding: str, device: torch.device) -> Replicas | None:
    """Spread the policy over the ranks. "ddp": a replica per rank, gradients all-reduced; returns
    the wrapper the loss must run through. "fsdp": FSDP2 shards the fp32 weights, their gradients
    and so the AdamW state over the ranks, one group per Block, then the root (embeddings, norm,
    lm_head), in place; returns None. Alone: None."""
    if not dist.is_initialized():
        return None
    # bucket views: the gradients live in DDP's buckets instead of beside them (4 B/param)
    if sharding == "ddp":
        return Replicas(policy, device_ids=[device] if device.type == "cuda" else None,
                        gradient_as_bucket_view=True)
    # imported here: public from torch 2.6, plain runs need less
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(device.type, (world_size(),))
    for block in policy.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(policy, mesh=mesh)
    return None


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """tensor whole: an FSDP2 DTensor shard all-gathered (a collective)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def gathered_to_rank0(state: dict) -> dict:
    """state with its FSDP2 shards replaced, in place and one at a time, by whole tensors on rank
    0's CPU (other ranks drop theirs: a whole 7B state fits on no GPU, nor eight times in one host's
    memory); a collective."""
    for key, value in state.items():
        if isinstance(value, DTensor):
            value = value.full_tensor()
            state[key] = value.cpu() if rank() == 0 else None
    return state


def copy_weights(target: Transformer, source: Transformer):
    """target's weights := source's, cast to target's dtype; FSDP2 shards are gathered one tensor at
    a time, so no whole fp32 copy of the model is ever made (a collective under FSDP2)."""
    with torch.no_grad():
        into = target.state_dict()
        for name, tensor in source.state_dict().items():
            into[name].copy_(whole(tensor))


def mix_weights(target: Transformer, source: Transformer, alpha: float):
    """target's weights := alpha source's + (1 - alpha) its own, summed in fp32, cast to target's
    dtype (TR-DPO's reference sync, arXiv:2404.09656); gathered as copy_weights."""
    with torch.no_grad():
        into = target.state_dict()
        for name, tensor in source.state_dict().items():
            mixed = (1 - alpha) * into[name].float() + alpha * whole(tensor).float()
            into[name].copy_(mixed)


def shard_optimizer_state(optimizer: torch.optim.Optimizer):
    """After loading a checkpoint's whole AdamW moments into an optimizer over FSDP2 shards, keep
    each rank's shard."""
    for param, state in optimizer.state.items():
        for key, value in state.items():
            # the moments; not the 0-d step count
            if isinstance(param, DTensor) and value.shape == param.shape:
                state[key] = distribute_tensor(value, param.device_mesh, param.placements)


def over_ranks(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """tensor's sum (or "max") over the ranks, in place; alone: itself."""
    if dist.is_initialized():
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op.upper()))
    return tensor


def from_every_rank(obj) -> list:
    """[rank 0's obj, rank 1's, ...] (a collective); [obj] in a single process."""
    if not dist.is_initialized():
        return [obj]
    objs = [None] * world_size()
    dist.all_gather_object(objs, obj)
    return objs


def accumulating(policy, last: bool):
    """DDP all-reduces the gradients in the last micro-batch's backward only."""
    return (policy.no_sync() if isinstance(policy, DistributedDataParallel) and not last
            else contextlib.nullcontext())


def all_samples(samples):
    """Every rank's rollout.Samples in rank order, i.e. the whole step's rows, for the log; timings
    are the slowest rank's. The per-token log-probs stay on their rank (None here): the log does not
    read them."""
    if not dist.is_initialized():
        return samples
    parts = from_every_rank(dataclasses.replace(samples, logprobs=None))
    return dataclasses.replace(type(samples).concat(parts),  # the step waits for the slowest rank
                               seconds_sampling=max(p.seconds_sampling for p in parts),
                               seconds_scoring=max(p.seconds_scoring for p in parts))
