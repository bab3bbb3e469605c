"""Optimizer steps on FSDP2's local shards, not through DTensor's per-operator dispatch.

FSDP2 hands the optimizer its parameters, gradients and state as DTensors. In the profile of an FSDP2 step of
BLIP-2 opt-2.7b on 2 H200s (torch 2.11, the GPU image), `AdamW(fused=True)` over the 1,247 DTensor parameters ran
as per-tensor lerp_/sqrt/addcdiv_ (~10,000 kernels): 370 ms of host time a step, more than half of a whole step on
one GPU (BENCHMARKS.md, 2026-11-23). On evenly sharded tensors the same fused step takes 23 ms
(benchmarks/dtensor_optimizer.py), so which of BLIP-2's parameters send it down the per-tensor path was not
isolated. Every parameter is sharded along dim 0 and AdamW, Adam and SGD work element by element, so stepping
each rank's local shards with the plain optimizer computes exactly the same update, with the optimizer's own
kernels, whatever DTensor would have done.

`ShardLocalStep` does that around the parent class's own `step`: for the step's duration each DTensor parameter is
replaced in `param_groups` by its local tensor, with the local gradient and state; state the step creates is kept
as DTensors over the same memory, so checkpoints, `state_dict()` and the memory breakdown see what they always see.
The swap reaches into torch's optimizer and DTensor internals, so it lives with torch's other changes
(patches/torch.py `local_shards_for_step`).
"""

from __future__ import annotations

import torch

from altscale.patches.torch import local_shards_for_step


class ShardLocalStep:
    """Mixin for an elementwise torch optimizer (SHARD_LOCAL below): `step` runs the parent's step on each DTensor's
    local shard. State tensors the step updates in place keep their DTensor, so only new ones are ever wrapped."""

    @torch.no_grad()
    def step(self, closure=None):
        with local_shards_for_step(self):
            return super().step(closure)


class ShardLocalAdamW(ShardLocalStep, torch.optim.AdamW):
    """AdamW, stepped on FSDP2's local shards."""


class ShardLocalAdam(ShardLocalStep, torch.optim.Adam):
    """Adam, stepped on FSDP2's local shards."""


class ShardLocalSGD(ShardLocalStep, torch.optim.SGD):
    """SGD, stepped on FSDP2's local shards."""


# Optimizers whose update of an element depends on that element alone: stepping shards is stepping the whole.
SHARD_LOCAL = {torch.optim.AdamW: ShardLocalAdamW, torch.optim.Adam: ShardLocalAdam, torch.optim.SGD: ShardLocalSGD}


def shard_local_class(optimizer_cls: type) -> type | None:
    """The shard-local variant of a torch optimizer class, or None for one that is not elementwise."""
    if optimizer_cls in SHARD_LOCAL.values():
        return optimizer_cls
    return SHARD_LOCAL.get(optimizer_cls)
