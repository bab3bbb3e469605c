"""What building any family's model shares: how `init` resolves, where a process builds, QLoRA's quantization
config, and the three ways weights arrive (random on the target device, random through a quantizing reload,
pretrained through from_pretrained). The family's own builder (families/<family>/model.py) picks the classes."""

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_model
from transformers import BitsAndBytesConfig
from transformers.integrations import is_deepspeed_zero3_enabled

from altscale.config.errors import ConfigError
from altscale.models.presets import find_preset

INITS = ("auto", "pretrained", "random")


@dataclass
class ModelReport:
    """How the model was made, for the run's effective-configuration record."""

    source: str
    init: str
    dtype: str
    device: str
    build_time_s: float
    parameters: int
    processor: str
    token_ids_changed: dict = field(default_factory=dict)


def resolve_init(model_name_or_path: str, init: str) -> str:
    """'auto' means random for a preset name and pretrained for anything else."""
    if init not in INITS:
        raise ConfigError(f"init: {init!r} is unknown; use one of {', '.join(INITS)}")
    if init != "auto":
        return init
    return "random" if find_preset(model_name_or_path) == model_name_or_path else "pretrained"


def build_device() -> torch.device:
    """Where this process builds its model: its own GPU when there is one."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def build_random(model_class, config, dtype: torch.dtype, device: torch.device, attn: str):
    """`model_class` with random weights, built where it will train, in the dtype it trains in (transformers'
    private `_attn_implementation` and `_from_config`, listed in patches/transformers.py)."""
    config._attn_implementation = attn
    if is_deepspeed_zero3_enabled():
        # transformers wraps construction in deepspeed.zero.Init, which partitions as it builds.
        return model_class._from_config(config, dtype=dtype)
    # Build on the target device in the target dtype: a 12B model made in fp32 on the CPU first would
    # spend minutes on initialisation and need 48 GB of host memory.
    with device:
        return model_class._from_config(config, dtype=dtype)


def build_quantization_config(load_in_4bit: bool, double_quant: bool, compute_dtype: torch.dtype,
                              quant_storage: torch.dtype = torch.uint8) -> BitsAndBytesConfig | None:
    """QLoRA's 4-bit NF4 base weights; None when the model is not quantized. `quant_storage`: the dtype the packed
    weights are stored in (FSDP needs the model's dtype to shard them: LaunchPlan.quant_storage)."""
    if not load_in_4bit:
        return None
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=double_quant,
        bnb_4bit_compute_dtype=compute_dtype,
        bnb_4bit_quant_storage=quant_storage,
    )


def quantize_random(model, quantization: BitsAndBytesConfig, dtype: torch.dtype, device: torch.device):
    """Quantize a random model the way a user's checkpoint is: through from_pretrained.

    bitsandbytes quantizes while loading, so the random weights go through a local folder first; a
    checkpoint from the Hub takes the same path without the detour.
    """
    model_class = type(model)
    with tempfile.TemporaryDirectory(prefix="altscale-random-") as folder:
        # Not save_pretrained: under torch.distributed it writes on rank 0 only, and every other rank of a DDP or
        # FSDP launch would find an empty folder (docs/compatibility.md, QLoRA under ddp).
        model.config.save_pretrained(folder)
        save_model(model, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})
        del model
        torch.cuda.empty_cache()
        return model_class.from_pretrained(folder, dtype=dtype, quantization_config=quantization, device_map={"": device})


def load_pretrained(model_class, path: str, dtype: torch.dtype, attn: str, quantization: BitsAndBytesConfig | None = None):
    extra = {"quantization_config": quantization, "device_map": {"": build_device()}} if quantization else {}
    try:
        return model_class.from_pretrained(path, dtype=dtype, attn_implementation=attn, **extra)
    except OSError as err:
        preset = find_preset(path)
        hint = (
            f"; with no network, train the same architecture from random weights with "
            f"model_name_or_path: {preset} (or init: random)"
            if preset
            else "; check the Hub id or the folder (it needs config.json and the weights)"
        )
        raise ConfigError(f"model_name_or_path: cannot load {path!r} ({err.__class__.__name__}){hint}") from None


def count_parameters(model) -> int:
    """Unique parameters (a tied weight once)."""
    return sum({id(p): p.numel() for p in model.parameters()}.values())
