"""Named architectures kept in the repo (models/configs/*.json), so a model can be built with no network.

Each file holds a transformers config plus two keys of ours: `_family`, the folder under families/ that builds it,
and `_hub_id`, the checkpoint whose architecture it copies (null for the tiny test models).
"""

import json
from pathlib import Path

from altscale.config.errors import ConfigError

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


def preset_family(preset: str) -> str:
    """The family folder (families/<name>/) that builds this preset."""
    return _read(preset)["_family"]


def preset_fields(name: str) -> dict:
    """The preset's transformers config as a dict; an unknown name is the user's error, with the known ones."""
    if name not in preset_names():
        raise ConfigError(
            f"model_name_or_path: {name!r} is not a preset; use one of {', '.join(preset_names())}, "
            "a Hub id or a local model directory"
        )
    return {key: value for key, value in _read(name).items() if not key.startswith("_")}
