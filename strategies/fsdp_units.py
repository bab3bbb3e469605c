"""How the towers' layers become FSDP2 units: k consecutive layers per unit, each unit gathering the next early.

accelerate would call `fully_shard` once per layer. Every unit costs host work in each forward and backward
(hooks, the all-gather's copy-in and copy-out, one setattr per parameter when gathered and again when freed),
and BLIP-2 opt-2.7b has 83 layers: on 2 H200s that host work, not the NVLink transfers, held FSDP to 31-44 % of
one GPU's speed per GPU, and 8 layers a unit raised it to 44-62 % (BENCHMARKS.md). Grouping layers
(`fsdp_layers_per_unit`) divides the number of units; the price is memory, since a gathered unit is k layers
wide. The forward prefetch issues the next unit's all-gather when a unit starts, instead of when the next one
does, so the transfer runs while this unit's kernels are launched.

This module shards the layers itself, then leaves accelerate the rest of its FSDP2 setup (the embedding and head
unit, the root unit, the optimizer, the state dict); strategies/fsdp.py then clears the plugin's wrap policy and
checkpointing (patches/accelerate.py), so that accelerate does not look for the layers again (fully_shard renames
their classes FSDP<name>) nor wrap them a second time. The layers get the `fully_shard` arguments accelerate gives
the rest (patches/accelerate.py `fully_shard_kwargs` mirrors its fsdp2_prepare_model).
"""

from __future__ import annotations

import torch

from altscale.patches.accelerate import fully_shard_kwargs


def layer_runs(model: torch.nn.Module, class_names: list[str]) -> list[list[torch.nn.Module]]:
    """The layers to shard, as runs of consecutive siblings: an nn.ModuleList's matching children, in order; a
    matching layer outside any list is a run of its own. A matching layer is not searched further."""
    names = set(class_names)
    runs = []

    def visit(module: torch.nn.Module) -> None:
        children = list(module.children())
        matching = [child for child in children if type(child).__name__ in names]
        if isinstance(module, torch.nn.ModuleList) and matching:
            runs.append(matching)
        else:
            runs.extend([child] for child in matching)
        for child in children:
            if type(child).__name__ not in names:
                visit(child)

    visit(model)
    return runs


def checkpoint_layers(model: torch.nn.Module, runs: list[list[torch.nn.Module]]) -> list[list[torch.nn.Module]]:
    """Wraps every layer in torch's CheckpointWrapper (as accelerate's fsdp2_apply_ac does); returns the wrapped
    runs. The wrapper lives in a private torch module (listed in patches/torch.py)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    names = {id(module): name for name, module in model.named_modules()}
    wrapped_runs = []
    for run in runs:
        wrapped = []
        for layer in run:
            wrapper = checkpoint_wrapper(layer, preserve_rng_state=False)
            model.set_submodule(names[id(layer)], wrapper)
            wrapped.append(wrapper)
        wrapped_runs.append(wrapped)
    return wrapped_runs


def shard_layers(runs: list[list[torch.nn.Module]], layers_per_unit: int, forward_prefetch: bool,
                 **shard_kwargs) -> list[int]:
    """fully_shard on each group of `layers_per_unit` consecutive layers; returns the units' layer counts.

    With `forward_prefetch`, each unit asks FSDP to all-gather the next unit of its run as it starts its forward.
    """
    from torch.distributed.fsdp import fully_shard

    sizes = []
    for run in runs:
        units = [run[start:start + layers_per_unit] for start in range(0, len(run), layers_per_unit)]
        for unit in units:
            fully_shard(unit if len(unit) > 1 else unit[0], **shard_kwargs)
            sizes.append(len(unit))
        if forward_prefetch:
            for unit, following in zip(units, units[1:]):
                unit[0].set_modules_to_forward_prefetch([following[0]])
    return sizes


def shard_towers(model: torch.nn.Module, plugin, class_names: list[str], checkpointed: bool, layers_per_unit: int,
                 forward_prefetch: bool) -> dict:
    """Checkpoints (if planned) and shards the layers of `class_names`; the plugin's other settings stay accelerate's.

    Returns what it did, for the run record. The caller then tells accelerate to leave these layers alone
    (strategies/fsdp.py configure_fsdp).
    """
    runs = layer_runs(model, class_names)
    if checkpointed:
        runs = checkpoint_layers(model, runs)
    sizes = shard_layers(runs, layers_per_unit, forward_prefetch, **fully_shard_kwargs(plugin))
    return {"layer_units": len(sizes), "layers_per_unit": layers_per_unit, "forward_prefetch": forward_prefetch,
            "checkpointed_layers": sum(sizes) if checkpointed else 0}
