"""Task families: what differs between tasks trained on one engine, looked up in one place from the model.

A family is a subpackage `families/<name>/` whose `FAMILY` (a `Family`) says how to build its model and processor,
collate its examples into batches with labels, count a sample's FLOPs, which layers LoRA adapts by default, which
layers FSDP shards as units, and what the run shows after training. The engine asks `family_for(...)` and never
names a model class; adding a family is adding a folder, found here by its name (no registry to edit).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from altscale.config.errors import ConfigError
from altscale.models.presets import find_preset, preset_family, preset_fields


@dataclass(frozen=True)
class Family:
    """One task family's builders. Every callable is a plain function of the family's own modules."""

    name: str  # the folder under families/
    model_types: tuple[str, ...]  # transformers' `config.model_type` values this family trains
    config_class: type  # builds a preset's config from its fields
    model_class: type  # counts a preset's parameters on the meta device
    # (model_name_or_path, *, init, dtype, attn_implementation, processor_name_or_path, quantization)
    #   -> (model, processor, models.build.ModelReport)
    build_model: Callable[..., tuple[Any, Any, Any]]
    # (model, processor, DataArguments) -> a collator whose batches carry the labels the loss reads
    build_collator: Callable[[Any, Any, Any], Any]
    # (model config, collator, train split) -> training FLOPs of a mean sample (6·N·T convention)
    flops_per_sample: Callable[[Any, Any, Any], float]
    # (model config) -> the regular expression LoRA adapts when a recipe names no lora_target_modules
    default_lora_targets: Callable[[Any], str]
    # (model) -> class names of the repeated blocks FSDP shards one unit at a time
    layer_class_names: Callable[[Any], list[str]]
    # (model) -> the language tower, whose KV cache FSDP's checkpointing turns off and whose tied embeddings
    # become one module
    language_model: Callable[[Any], Any]
    # (model, collator, eval split, max_new_tokens, how many to print) -> what the run shows after training
    show_samples: Callable[..., dict]


def family_names() -> list[str]:
    return sorted(info.name for info in pkgutil.iter_modules(__path__) if info.ispkg)


def family_named(name: str) -> Family:
    if name not in family_names():
        raise ConfigError(f"family {name!r} is unknown; families/ holds {', '.join(family_names())}")
    return importlib.import_module(f"{__name__}.{name}").FAMILY


def family_of_type(model_type: str, where: str) -> Family:
    for name in family_names():
        family = family_named(name)
        if model_type in family.model_types:
            return family
    known = {t: name for name in family_names() for t in family_named(name).model_types}
    raise ConfigError(f"{where}: model_type {model_type!r} belongs to no task family; altscale trains "
                      f"{', '.join(f'{t} ({n})' for t, n in known.items())}")


def family_of_model(model) -> Family:
    """The family of a built model (through a PEFT wrapper: its config is the base model's)."""
    return family_of_type(model.config.model_type, "model")


def family_for(model_name_or_path: str) -> Family:
    """The family of a preset, a local model folder, or a Hub id (whose config.json is read from the Hub)."""
    preset = find_preset(model_name_or_path)
    if preset is not None:
        return family_named(preset_family(preset))
    if Path(model_name_or_path).is_dir() and not Path(model_name_or_path, "config.json").is_file():
        # An adapter folder: its base model decides (recipes/generate.py reads adapter_config.json).
        raise ConfigError(f"model_name_or_path: {model_name_or_path} has no config.json; give a model folder, a "
                          "Hub id or a preset")
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_name_or_path)
    except (OSError, ValueError) as err:
        raise ConfigError(f"model_name_or_path: cannot read the config of {model_name_or_path!r} "
                          f"({err.__class__.__name__}); give a preset, a local model folder, or a Hub id "
                          "(with network)") from None
    return family_of_type(config.model_type, f"model_name_or_path: {model_name_or_path}")


def random_init_config(model_name_or_path: str):
    """The architecture a random init builds: a preset's (by name or Hub id), else a local folder's config.json."""
    preset = find_preset(model_name_or_path)
    if preset is not None:
        return family_named(preset_family(preset)).config_class.from_dict(preset_fields(preset))
    if Path(model_name_or_path, "config.json").is_file():
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(model_name_or_path)
    preset_fields(model_name_or_path)  # raises the "not a preset; use one of ..." message
    raise AssertionError("preset_fields accepted a name find_preset did not know")


def parameter_count(name_or_hub_id: str) -> int | None:
    """Unique parameters of the preset named (or copied from the Hub id) `name_or_hub_id`, counted on the meta
    device (no memory, ~0.1 s); None for anything else (a local folder, an unknown Hub id)."""
    import torch

    from altscale.models.build import count_parameters

    preset = find_preset(name_or_hub_id)
    if preset is None:
        return None
    family = family_named(preset_family(preset))
    with torch.device("meta"):
        model = family.model_class._from_config(family.config_class.from_dict(preset_fields(preset)))
    return count_parameters(model)
