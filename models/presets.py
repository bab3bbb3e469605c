"""Named BLIP-2 architectures kept in the repo, so a model can be built with no network."""

import json
from pathlib import Path

import torch
from transformers import Blip2Config, Blip2ForConditionalGeneration

from recipes.errors import ConfigError

CONFIG_DIR = Path(__file__).parent / "configs"


def preset_names() -> list[str]:
    return sorted(path.stem for path in CONFIG_DIR.glob("*.json"))


def _read(name: str) -> dict:
    return json.loads((CONFIG_DIR / f"{name}.json").read_text())


def find_preset(name_or_hub_id: str) -> str | None:
    """The preset named `name_or_hub_id`, or the one built after that Hub checkpoint; None if neither."""
    if name_or_hub_id in preset_names():
        return name_or_hub_id
    for name in preset_names():
        if _read(name)["_hub_id"] == name_or_hub_id:
            return name
    return None


def hub_id(preset: str) -> str | None:
    """The Hub checkpoint whose architecture the preset copies (None for the tiny test models)."""
    return _read(preset)["_hub_id"]


def load_preset_config(name: str) -> Blip2Config:
    if name not in preset_names():
        raise ConfigError(
            f"model_name_or_path: {name!r} is not a preset; use one of {', '.join(preset_names())}, "
            "a Hub id or a local model directory"
        )
    fields = _read(name)
    fields.pop("_hub_id")
    return Blip2Config.from_dict(fields)


def language_family(config: Blip2Config) -> str:
    """'opt' for decoder-only language models, 't5' for encoder-decoder ones."""
    return "opt" if config.use_decoder_only_language_model else "t5"


def parameter_count(name_or_hub_id: str) -> int | None:
    """Unique parameters of the preset named (or copied from the Hub id) `name_or_hub_id`, counted on the meta
    device (no memory, ~0.1 s); None for anything else (a local folder, an unknown Hub id)."""
    preset = find_preset(name_or_hub_id)
    if preset is None:
        return None
    with torch.device("meta"):
        model = Blip2ForConditionalGeneration._from_config(load_preset_config(preset))
    return sum({id(p): p.numel() for p in model.parameters()}.values())
