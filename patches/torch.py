"""torch, as this project changes it. Checked with torch 2.11 (GPU image) and 2.13.0 (CPU tests).

What is changed, and why:
- DDP's `zero_grad` (`zero_grad_in_place`): the Trainer calls `model.zero_grad()` on the DDP wrapper after every
  optimizer step with torch's default `set_to_none=True`, which drops the gradients that `gradient_as_bucket_view`
  made views into DDP's buckets; the next step's first micro-batches then accumulate into fresh tensors and the
  peak holds a second copy of every gradient (strategies/ddp.py). This instance's `zero_grad` zeroes in place.
- `Tensor.masked_scatter` (`masked_scatter_as_gather`): its backward selects with a size only the device knows, a
  wait for the host that a CUDA graph cannot hold. While CUDA graphs run (strategies/cuda_graphs.py `capture_safe`),
  a TorchFunctionMode routes the row-wise calls (BLIP-2 placing its query outputs among the text embeddings) to the
  same copy written as a gather; values and gradients are identical, any other mask goes to torch's own.
- An optimizer's `param_groups` and `state` during its step (`local_shards_for_step`): FSDP2 hands the optimizer
  DTensors, which torch's fused AdamW steps one operator at a time through DTensor's dispatch (370 ms of host time a
  step for BLIP-2 opt-2.7b on 2 H200s: strategies/sharded_optim.py). For the step's duration each DTensor parameter
  is replaced by its local shard, with the local gradient and state; afterwards the DTensors are put back and state
  the step created is wrapped as DTensors over the same memory. torch offers no switch for "step the local shards".

What is read (torch internals the engine relies on, no behaviour changed; listed in `PATCHED` so that a torch
upgrade that renames them fails tests/patches rather than a run on the GPU machine):
- `DTensor._local_tensor` (the step above; `to_local()` would record an autograd op for every parameter);
- `torch._foreach_zero_` (strategies/cuda_graphs.py zeroes released gradient buffers in one launch);
- `torch.distributed.algorithms._checkpoint.checkpoint_wrapper` (strategies/fsdp_units.py wraps layers as
  accelerate's fsdp2_apply_ac does; callbacks/effective_config.py counts `CheckpointWrapper`s);
- DDP's `_get_ddp_logging_data`, FSDP2's `_get_fsdp_state`, its param groups (`fsdp_param_groups`: 2.11 keeps one
  per state, 2.13 a list) and each FSDP param's `_orig_size`, `param_dtype`, `orig_dtype` (callbacks/memory.py
  `communication_buffers`); FSDP1's `_fsdp_flattened` marker (callbacks/effective_config.py names the strategy).
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch.overrides import TorchFunctionMode

# What this module changes in torch and what the engine reads of its internals; tests/patches checks each exists.
# (owner, attribute): `owner` (a module or class, by dotted path) has `attribute`.
# (owner, attribute, "instance"): set on instances only (in __init__ or by other code); the owner's source sets it.
PATCHED = (
    # changed
    ("torch.nn.parallel.DistributedDataParallel", "zero_grad"),
    ("torch.Tensor", "masked_scatter"),
    ("torch.overrides", "TorchFunctionMode"),
    ("torch.optim.Optimizer", "param_groups", "instance"),
    ("torch.optim.Optimizer", "state", "instance"),
    # read
    ("torch.distributed.tensor.DTensor", "_local_tensor", "instance"),
    ("torch.distributed.tensor.DTensor", "from_local"),
    ("torch", "_foreach_zero_"),
    ("torch.distributed.algorithms._checkpoint.checkpoint_wrapper", "checkpoint_wrapper"),
    ("torch.distributed.algorithms._checkpoint.checkpoint_wrapper", "CheckpointWrapper"),
    ("torch.nn.parallel.DistributedDataParallel", "_get_ddp_logging_data"),
    ("torch.distributed.fsdp.FSDPModule", "_get_fsdp_state"),
    # 2.11's one group per state, a property over 2.13's list `_fsdp_param_groups`, which fsdp_param_groups prefers
    # where it exists (2.11 lacks it, so it cannot be required here)
    ("torch.distributed.fsdp._fully_shard._fsdp_state.FSDPState", "_fsdp_param_group", "instance"),
    ("torch.distributed.fsdp._fully_shard._fsdp_param_group.FSDPParamGroup", "fsdp_params", "instance"),
    ("torch.distributed.fsdp._fully_shard._fsdp_param_group.FSDPParamGroup", "post_forward_mesh_info", "instance"),
    ("torch.distributed.fsdp._fully_shard._fsdp_param.FSDPParam", "_orig_size", "instance"),
    ("torch.distributed.fsdp._fully_shard._fsdp_param.FSDPParam", "param_dtype", "instance"),
    ("torch.distributed.fsdp._fully_shard._fsdp_param.FSDPParam", "orig_dtype", "instance"),
    ("torch.distributed.fsdp._common_utils", "_fsdp_flattened", "instance"),
)


# ---------------------------------------------------------------- DDP


def zero_grad_in_place(model) -> bool:
    """Rebinds a DDP wrapper's `zero_grad` to zero in place; True if `model` is DDP (else nothing changes)."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return False
    model.zero_grad = functools.partial(type(model).zero_grad, model, set_to_none=False)
    return True


def fsdp_param_groups(state) -> list:
    """The param groups of one FSDP2 state (`FSDPModule._get_fsdp_state()`): torch 2.13 keeps a list of them, 2.11 one
    (or None)."""
    groups = getattr(state, "_fsdp_param_groups", None) or [getattr(state, "_fsdp_param_group", None)]
    return [group for group in groups if group is not None]


# ---------------------------------------------------------------- masked_scatter under CUDA graphs


@contextlib.contextmanager
def masked_scatter_as_gather():
    """Inside it, row-wise `Tensor.masked_scatter` runs as `masked_scatter_rows` (a backward without a host wait)."""
    with _GatherForMaskedScatter():
        yield


class _GatherForMaskedScatter(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.masked_scatter:
            placed = masked_scatter_rows(*args, **kwargs)
            if placed is not None:
                return placed
        return func(*args, **kwargs)


def masked_scatter_rows(target: torch.Tensor, mask: torch.Tensor, source: torch.Tensor) -> torch.Tensor | None:
    """`target.masked_scatter(mask, source)` where `mask` selects whole rows of the last dimension (its last size is
    1), written as a gather: its backward is a scatter-add, where masked_scatter's selects with a size only the
    device knows. None for other masks (the caller falls back to masked_scatter)."""
    width = target.shape[-1]
    if mask.dtype != torch.bool or mask.dim() != target.dim() or mask.shape[-1] != 1 or source.shape[-1] != width:
        return None
    rows = mask.expand(*target.shape[:-1], 1).reshape(-1)
    take = (rows.long().cumsum(0) - 1).clamp(min=0)  # the source row each selected target row receives
    picked = source.reshape(-1, width).index_select(0, take).to(target.dtype)
    return torch.where(rows.unsqueeze(-1), picked, target.reshape(-1, width)).view(target.shape)


# ---------------------------------------------------------------- an optimizer step on FSDP2's local shards


def _dtensor_class():
    from torch.distributed.tensor import DTensor

    return DTensor


@contextlib.contextmanager
def local_shards_for_step(optimizer: torch.optim.Optimizer):
    """Inside it, `optimizer` holds each DTensor parameter's local shard (with its local gradient and state) in place
    of the DTensor; on leaving, the DTensors come back. State tensors the step updates in place keep their DTensor,
    so only new ones are wrapped, as DTensors sharded like their parameter over the same memory."""
    dtensor = _dtensor_class()
    swapped, entered = [], {}  # entered: parameter -> its state as DTensors, set aside for the step
    for group in optimizer.param_groups:
        swapped.append((group, group["params"]))
        group["params"] = [_enter_local(optimizer, p, entered) if isinstance(p, dtensor) else p
                           for p in group["params"]]
    try:
        yield
    finally:
        for group, params in swapped:
            group["params"] = params
        for param, state in entered.items():
            _leave_local(optimizer, param, state)


def _enter_local(optimizer, param, entered: dict) -> torch.Tensor:
    local = param._local_tensor
    local.grad = None if param.grad is None else param.grad._local_tensor
    entered[param] = optimizer.state.pop(param, None) or {}
    if entered[param]:
        optimizer.state[local] = {key: getattr(value, "_local_tensor", value) for key, value in entered[param].items()}
    return local


def _leave_local(optimizer, param, before: dict) -> None:
    local = param._local_tensor
    local.grad = None
    state = optimizer.state.pop(local, None)
    if state:
        optimizer.state[param] = {key: before[key] if getattr(before.get(key), "_local_tensor", None) is value
                                  else _as_dtensor_like(value, param) for key, value in state.items()}


def _as_dtensor_like(value, param):
    """A local shard-shaped state tensor as a DTensor sharded like `param`, over the same memory; others as they are."""
    dtensor = _dtensor_class()
    if isinstance(value, dtensor) or not isinstance(value, torch.Tensor) or value.shape != param._local_tensor.shape:
        return value
    return dtensor.from_local(value, param.device_mesh, param.placements, run_check=False, shape=param.shape,
                              stride=param.stride())
