"""What the run really does, read from the live objects rather than from the YAML that asked for it.

`effective_config(args, model, optimizer)` is the plain function; `describe_effective_config(trainer)`
reads the Trainer's own attributes. Taken after the first optimizer step, optimizer states exist
(torch and bitsandbytes create them lazily in the first `step()`); before it, they read as "not yet
created". The library internals read here (DeepSpeed's ZeRO fields, FSDP1's flattened marker, transformers'
bound checkpoint function, bitsandbytes' quant state) are listed in patches/<library>.py.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import torch

from altscale.callbacks.memory import DTensor, unwrap_optimizer, zero_stage


def _class_name(obj: Any) -> str | None:
    return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"


def _true_numel(param: torch.Tensor) -> int:
    """Logical element count: ZeRO-3 placeholders and 4-bit packed weights report fewer than they stand for."""
    if hasattr(param, "ds_numel"):
        return int(param.ds_numel)
    quant_state = getattr(param, "quant_state", None)
    if quant_state is not None and getattr(quant_state, "shape", None) is not None:
        return int(torch.Size(quant_state.shape).numel())
    return param.numel()


def _where(tensor: torch.Tensor) -> str:
    if DTensor is not None and isinstance(tensor, DTensor):
        return f"{tensor.to_local().device.type} (DTensor sharded over {tensor.device_mesh.size()} ranks)"
    return tensor.device.type


def _reentrant(model: torch.nn.Module) -> bool | str | None:
    """use_reentrant as bound into the checkpoint function transformers installed on the layers."""
    for module in model.modules():
        func = getattr(module, "_gradient_checkpointing_func", None)
        if func is None:
            continue
        while isinstance(func, functools.partial):
            if "use_reentrant" in func.keywords:
                return bool(func.keywords["use_reentrant"])
            func = func.func
        return "torch default"
    return None


def _optimizer_options(optimizer: Any) -> dict[str, Any] | None:
    """The switches that pick an implementation inside one class: AdamW's fused or foreach kernels, bitsandbytes'
    8- or 32-bit state. `optim: adamw_torch` and `adamw_torch_fused` build the same class and differ only here."""
    if optimizer is None:
        return None
    defaults = getattr(optimizer, "defaults", None) or {}
    options = {key: defaults[key] for key in ("fused", "foreach") if key in defaults}
    bits = getattr(getattr(optimizer, "args", None), "optim_bits", None)
    if bits is not None:
        options["optim_bits"] = bits
    return options


def _strategy(args: Any, model: torch.nn.Module, inner: Any) -> str:
    stage = zero_stage(inner)
    if stage is not None:
        offload = []
        if getattr(inner, "cpu_offload", False) or getattr(inner, "offload_optimizer", False):
            offload.append("optimizer")
        if getattr(inner, "offload_param", False):
            offload.append("params")
        return f"deepspeed zero{stage}" + (f" offload {'+'.join(offload)}" if offload else "")
    params = list(model.parameters())
    if DTensor is not None and any(isinstance(p, DTensor) for p in params):
        return "fsdp2"
    if any(type(p).__name__ == "FlatParameter" or hasattr(p, "_fsdp_flattened") for p in params):
        return "fsdp1"
    return "ddp" if args.world_size > 1 else "single device"


def effective_config(args: Any, model: torch.nn.Module, optimizer: Any = None) -> dict[str, Any]:
    """Optimizer class, dtypes and placement of params / grads / optimizer state / master weights, and the rest."""
    inner = unwrap_optimizer(optimizer)
    stage = zero_stage(inner)
    params = list(model.parameters())

    param_dtypes, param_places, grad_dtypes = Counter(), Counter(), Counter()
    trainable = frozen = 0
    for p in params:
        n = _true_numel(p)
        param_dtypes[str(getattr(p, "ds_tensor", p).dtype)] += n
        param_places[_where(getattr(p, "ds_tensor", p))] += n
        if p.requires_grad:
            trainable += n
        else:
            frozen += n
        if p.grad is not None:
            grad_dtypes[str(p.grad.dtype)] += n

    base = getattr(inner, "optimizer", None) if stage is not None else inner
    state_dtypes, state_places = Counter(), Counter()
    for per_param in getattr(base, "state", {}).values():
        for name, value in per_param.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:  # skip scalar step counters
                state_dtypes[f"{name}: {value.dtype}"] += 1
                state_places[_where(value)] += value.numel()

    master = None
    if stage is not None:
        partitions = getattr(inner, "fp32_partitioned_groups_flat", None) or getattr(
            inner, "single_partition_of_fp32_groups", [])
        if partitions:
            master = {"dtype": str(partitions[0].dtype), "device": partitions[0].device.type,
                      "sharded_over_ranks": args.world_size}
            grad_dtypes = Counter({str(partitions[0].dtype) + " (partitioned)": sum(t.numel() for t in partitions)})

    world = args.world_size
    model_dtype = getattr(model, "dtype", None)
    gc_on = bool(getattr(model, "is_gradient_checkpointing", False))
    return {
        "strategy": _strategy(args, model, inner),
        "optimizer_class": _class_name(base),
        "optimizer_options": _optimizer_options(base),
        "optimizer_wrapper_class": _class_name(inner) if stage is not None else None,
        "optim_arg": str(getattr(args, "optim", None)),
        "param_dtypes": dict(param_dtypes),
        "param_devices": dict(param_places),
        "grad_dtypes": dict(grad_dtypes) or "none yet (no backward has run)",
        "optimizer_state_dtypes": dict(state_dtypes) or "not yet created (created by the first step)",
        "optimizer_state_devices": dict(state_places) or None,
        "master_weights": master or "none: the optimizer updates the parameters in their own dtype",
        "gradient_checkpointing": gc_on,
        "gradient_checkpointing_reentrant": _reentrant(model) if gc_on else None,
        "gradient_checkpointing_kwargs": getattr(args, "gradient_checkpointing_kwargs", None),
        # FSDP's activation checkpointing wraps layers in torch's CheckpointWrapper instead (strategies/fsdp_units.py);
        # fully_shard then renames each wrapper's class to FSDPCheckpointWrapper, a subclass.
        "checkpoint_wrapped_layers": sum(any(c.__name__ == "CheckpointWrapper" for c in type(m).__mro__)
                                         for m in model.modules()),
        "trainable_params": trainable,
        "frozen_params": frozen,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "world_size": world,
        "global_batch_size": args.per_device_train_batch_size * args.gradient_accumulation_steps * world,
        "bf16": bool(args.bf16),
        "fp16": bool(args.fp16),
        "model_dtype": str(model_dtype) if model_dtype is not None else None,
    }


def describe_effective_config(trainer: Any) -> dict[str, Any]:
    """`effective_config` of a Trainer's arguments, model and optimizer."""
    return effective_config(trainer.args, trainer.model, trainer.optimizer)


def format_effective_config(config: dict[str, Any]) -> str:
    """The effective configuration as aligned `key: value` lines."""
    width = max(len(key) for key in config)
    return "\n".join(["effective configuration:"] + [f"  {key:<{width}}  {value}" for key, value in config.items()])
