"""Every change this project makes to a library's behaviour, one module per library, and every library internal the
engine relies on.

- patches/torch.py: DDP's `zero_grad` in place; `masked_scatter` as a gather under CUDA graphs; an optimizer step on
  FSDP2's local shards. Reads DTensor, DDP and FSDP internals (memory breakdown, checkpoint wrapper).
- patches/transformers.py: the mask helpers told they are traced under CUDA graphs. Reads the Trainer's
  `_prepare_inputs` (GraphedTrainer overrides `training_step`), `_from_config`, `_attn_implementation`.
- patches/accelerate.py: the FSDP plugin's wrapping and checkpointing switched off for layers the recipe shards; DDP's
  `gradient_as_bucket_view`. Mirrors `fsdp2_prepare_model`'s `fully_shard` arguments.
- patches/deepspeed.py: nothing changed; the ZeRO optimizers' fields the memory breakdown reads.
- patches/bitsandbytes.py: a CPU-only import warning quieted; the quantization fields the memory breakdown reads.

Each module's docstring says why each change exists and which versions it was checked against. Its `PATCHED`
registry lists both what it changes and which internals the engine reads, as (owner, attribute[, kind]): `owner` is
the dotted import path of a module or class (or function, for "source"), and kind is
- "attribute" (left out): `owner` has `attribute`;
- "instance": `attribute` exists on instances only (set in __init__ or by other code); `owner`'s source sets it;
- "source": `owner`'s source uses the name (a key it passes on, an attribute of a plain namespace it reads).
tests/patches/test_patched_attributes.py checks every entry against the installed version (DeepSpeed's where it is
installed, the GPU machine), and that nothing outside patches/ assigns attributes of a library module or class. The
engine calls the functions here; it never patches a library itself.
"""

from __future__ import annotations

import importlib
import pkgutil

KINDS = ("attribute", "instance", "source")


def patch_modules() -> list[str]:
    """The library modules of this package (torch, transformers, ...), by name."""
    return sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.ispkg)


def patched_attributes() -> list[tuple[str, str, str, str]]:
    """(patches module, owner, attribute, kind) for every entry of every module's `PATCHED` registry."""
    found = []
    for name in patch_modules():
        for entry in importlib.import_module(f"{__name__}.{name}").PATCHED:
            owner, attribute, kind = (*entry, "attribute") if len(entry) == 2 else entry
            found.append((name, owner, attribute, kind))
    return found
