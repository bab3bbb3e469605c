"""Build the BLIP-2 model and its processor: pretrained from the Hub or a folder, or random from a preset."""

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_model
from transformers import BitsAndBytesConfig, Blip2Config, Blip2ForConditionalGeneration, Blip2Processor
from transformers.integrations import is_deepspeed_zero3_enabled

from models.presets import find_preset, hub_id, load_preset_config
from models.processor import align_token_ids, build_offline_processor, load_processor
from recipes.errors import ConfigError

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


def build_model(
    model_name_or_path: str,
    *,
    init: str = "auto",
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    processor_name_or_path: str | None = None,
    quantization: BitsAndBytesConfig | None = None,
) -> tuple[Blip2ForConditionalGeneration, Blip2Processor, ModelReport]:
    start = time.perf_counter()
    init = resolve_init(model_name_or_path, init)
    if init == "random":
        config = random_init_config(model_name_or_path)
        processor, processor_source = _processor_for(config, processor_name_or_path)
        changed = align_token_ids(config, processor)
        device = build_device()
        model = _build_random(config, dtype, device, attn_implementation)
        if quantization is not None:
            model = _quantize_random(model, quantization, dtype, device)
        source = f"random init of {find_preset(model_name_or_path) or model_name_or_path}"
    else:
        model = _load_pretrained(model_name_or_path, dtype, attn_implementation, quantization)
        processor, processor_source = _processor_for(model.config, processor_name_or_path or model_name_or_path)
        changed, source = {}, f"pretrained {model_name_or_path}"
    report = ModelReport(
        source=source,
        init=init,
        dtype=str(dtype).removeprefix("torch."),
        device=str(next(model.parameters()).device),
        build_time_s=round(time.perf_counter() - start, 2),
        parameters=sum(p.numel() for p in model.parameters()),
        processor=processor_source,
        token_ids_changed=changed,
    )
    return model, processor, report


def random_init_config(model_name_or_path: str) -> Blip2Config:
    """The architecture kept in the repo for a preset name or a Hub id, else the config of a local model folder."""
    preset = find_preset(model_name_or_path)
    if preset:
        return load_preset_config(preset)
    if Path(model_name_or_path, "config.json").is_file():
        return Blip2Config.from_pretrained(model_name_or_path)
    return load_preset_config(model_name_or_path)  # raises the "unknown preset" message


def _processor_for(config: Blip2Config, path: str | None) -> tuple[Blip2Processor, str]:
    if path is None:
        return build_offline_processor(config), "offline (repo tokenizer + BLIP image processor)"
    try:
        return load_processor(path), str(path)
    except OSError as err:
        raise ConfigError(
            f"processor: cannot load one from {path!r} ({err.__class__.__name__}). Give a folder or Hub id "
            "that has the processor files with processor_name_or_path, or build a random model from a preset "
            "(init: random), which uses the offline processor kept in the repo"
        ) from None


def _build_random(config: Blip2Config, dtype: torch.dtype, device: torch.device, attn: str):
    config._attn_implementation = attn
    if is_deepspeed_zero3_enabled():
        # transformers wraps construction in deepspeed.zero.Init, which partitions as it builds.
        model = Blip2ForConditionalGeneration._from_config(config, dtype=dtype)
    else:
        # Build on the target device in the target dtype: a 12B model made in fp32 on the CPU first would
        # spend minutes on initialisation and need 48 GB of host memory.
        with device:
            model = Blip2ForConditionalGeneration._from_config(config, dtype=dtype)
    init_query_tokens(model)
    return model


def init_query_tokens(model: Blip2ForConditionalGeneration) -> None:
    """Draw the learned queries from N(0, initializer_range), as the original BLIP-2 does.

    transformers initialises them to zeros, which only a checkpoint overwrites: from random weights,
    identical all-zero queries meet the Q-Former's LayerNorm (eps 1e-12), which divides by ~sqrt(eps): on the
    tiny model the first gradient norm was 6e17 for the queries and 2.5e12 for the Q-Former (README.md).
    """
    std = model.config.qformer_config.initializer_range
    with torch.no_grad():
        if is_deepspeed_zero3_enabled():
            import deepspeed

            with deepspeed.zero.GatheredParameters([model.query_tokens], modifier_rank=0):
                model.query_tokens.normal_(0.0, std)
        else:
            model.query_tokens.normal_(0.0, std)


def build_quantization_config(load_in_4bit: bool, double_quant: bool, compute_dtype: torch.dtype,
                              quant_storage: torch.dtype = torch.uint8) -> BitsAndBytesConfig | None:
    """QLoRA's 4-bit NF4 base weights; None when the model is not quantized. `quant_storage`: the dtype the packed
    weights are stored in (FSDP needs the model's dtype to shard them: recipes/launch.py quant_storage)."""
    if not load_in_4bit:
        return None
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=double_quant,
        bnb_4bit_compute_dtype=compute_dtype,
        bnb_4bit_quant_storage=quant_storage,
    )


def _quantize_random(model, quantization: BitsAndBytesConfig, dtype: torch.dtype, device: torch.device):
    """Quantize a random model the way a user's checkpoint is: through from_pretrained.

    bitsandbytes quantizes while loading, so the random weights go through a local folder first; a
    checkpoint from the Hub takes the same path without the detour.
    """
    with tempfile.TemporaryDirectory(prefix="altscale-random-") as folder:
        # Not save_pretrained: under torch.distributed it writes on rank 0 only, and every other rank of a DDP or
        # FSDP launch would find an empty folder (docs/compatibility.md, QLoRA under ddp).
        model.config.save_pretrained(folder)
        save_model(model, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})
        del model
        torch.cuda.empty_cache()
        return Blip2ForConditionalGeneration.from_pretrained(
            folder, dtype=dtype, quantization_config=quantization, device_map={"": device}
        )


def _load_pretrained(path: str, dtype: torch.dtype, attn: str, quantization: BitsAndBytesConfig | None = None):
    extra = {"quantization_config": quantization, "device_map": {"": build_device()}} if quantization else {}
    try:
        return Blip2ForConditionalGeneration.from_pretrained(path, dtype=dtype, attn_implementation=attn, **extra)
    except OSError as err:
        preset = find_preset(path)
        hint = (
            f"; with no network, train the same architecture from random weights with "
            f"model_name_or_path: {preset} (or init: random)"
            if preset
            else "; check the Hub id or the folder (it needs config.json and the weights)"
        )
        raise ConfigError(f"model_name_or_path: cannot load {path!r} ({err.__class__.__name__}){hint}") from None
