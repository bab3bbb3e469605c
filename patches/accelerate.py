"""accelerate, as this project changes it. Checked with accelerate 1.15 (GPU image) and 1.15.0 (CPU tests).

What is changed, and why:
- The FSDP plugin the Trainer built from the launch is edited before the Trainer prepares the model
  (`set_fsdp_plugin`): the recipe shards the towers' layers itself (strategies/fsdp_units.py), so accelerate's own
  layer wrapping and activation checkpointing are switched off, and the layer classes it would look for are the
  family's. accelerate offers no setting for "these layers are already sharded".
- The DDP settings the Trainer handed accelerate are edited before the model is wrapped (`set_ddp_handler`):
  gradients as views into DDP's buckets (strategies/ddp.py), which the Trainer has no argument for; accelerate reads
  the handler only when it wraps the model, so an edit made before then is what DDP gets.

What is mirrored or read (accelerate internals the engine relies on, no behaviour changed; listed in `PATCHED` so
that an upgrade that renames them fails tests/patches rather than a run):
- `fully_shard_kwargs` passes `fully_shard` what accelerate's `fsdp2_prepare_model` passes it (without a device mesh
  config), so the layers sharded by the recipe are sharded as accelerate shards the rest; `PATCHED` names the keys
  in that function's source, so a change there fails the check;
- `get_module_class_from_name` (strategies/fsdp.py checks the launch's layer class names against the model);
- `AcceleratedOptimizer.optimizer` (callbacks/memory.py unwraps the optimizer that holds the state, through
  `DeepSpeedOptimizerWrapper` too).
"""

from __future__ import annotations

from typing import Any

# What this module changes in accelerate and what the engine reads of its internals; tests/patches checks each.
# (owner, attribute): `owner` (a module or class, by dotted path) has `attribute`.
# (owner, attribute, "instance"): set on instances only (in __init__ or by other code); the owner's source sets it.
# (owner, name, "source"): the owner's source names it (a key it passes on).
PATCHED = (
    # changed: set_fsdp_plugin
    ("accelerate.utils.FullyShardedDataParallelPlugin", "transformer_cls_names_to_wrap"),
    ("accelerate.utils.FullyShardedDataParallelPlugin", "auto_wrap_policy"),
    ("accelerate.utils.FullyShardedDataParallelPlugin", "activation_checkpointing"),
    # changed: set_ddp_handler (and read for the run record)
    ("accelerate.Accelerator", "ddp_handler", "instance"),
    ("accelerate.utils.DistributedDataParallelKwargs", "gradient_as_bucket_view"),
    ("accelerate.utils.DistributedDataParallelKwargs", "bucket_cap_mb"),
    ("accelerate.utils.DistributedDataParallelKwargs", "find_unused_parameters"),
    # mirrored: fully_shard_kwargs
    ("accelerate.utils.fsdp_utils", "fsdp2_prepare_model"),
    ("accelerate.utils.fsdp_utils.fsdp2_prepare_model", "reshard_after_forward", "source"),
    ("accelerate.utils.fsdp_utils.fsdp2_prepare_model", "offload_policy", "source"),
    ("accelerate.utils.fsdp_utils.fsdp2_prepare_model", "mp_policy", "source"),
    ("accelerate.utils.FullyShardedDataParallelPlugin", "reshard_after_forward"),
    ("accelerate.utils.FullyShardedDataParallelPlugin", "cpu_offload"),
    ("accelerate.utils.FullyShardedDataParallelPlugin", "mixed_precision_policy"),
    # read
    ("accelerate.utils.dataclasses", "get_module_class_from_name"),
    ("accelerate.optimizer.AcceleratedOptimizer", "optimizer", "instance"),
    ("accelerate.utils.deepspeed", "DeepSpeedOptimizerWrapper"),
)


def _set_fields(obj, owner: str, values: dict[str, Any]) -> None:
    """Sets fields of an accelerate object by name; a field this accelerate lacks is a bug to fix here, not a silent
    no-op."""
    fields = {entry[1] for entry in PATCHED if entry[0] == owner}
    for name, value in values.items():
        assert name in fields and hasattr(obj, name), f"accelerate's {owner} has no {name} (patches/accelerate.py)"
        setattr(obj, name, value)


def set_fsdp_plugin(plugin, **values: Any) -> None:
    """Sets FSDP plugin fields by name, before the Trainer prepares the model."""
    _set_fields(plugin, "accelerate.utils.FullyShardedDataParallelPlugin", values)


def set_ddp_handler(handler, **values: Any) -> None:
    """Sets the Trainer's DDP settings (accelerate's DistributedDataParallelKwargs) by name, before DDP wraps the
    model."""
    _set_fields(handler, "accelerate.utils.DistributedDataParallelKwargs", values)


def fully_shard_kwargs(plugin) -> dict:
    """The fully_shard arguments accelerate 1.15's fsdp2_prepare_model passes (without a device mesh config)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return {
        "reshard_after_forward": plugin.reshard_after_forward,
        "offload_policy": plugin.cpu_offload,
        "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(),
    }
