"""Build a BLIP-2 and its processor: pretrained from the Hub or a folder, or random from a preset."""

import time

import torch
from transformers import BitsAndBytesConfig, Blip2Config, Blip2ForConditionalGeneration, Blip2Processor
from transformers.integrations import is_deepspeed_zero3_enabled

from altscale.config.errors import ConfigError
from altscale.families import random_init_config
from altscale.families.blip2.processor import align_token_ids, build_offline_processor, load_processor
from altscale.models.build import (
    ModelReport,
    build_device,
    build_random,
    count_parameters,
    load_pretrained,
    quantize_random,
    resolve_init,
)
from altscale.models.presets import find_preset


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
        model = build_random(Blip2ForConditionalGeneration, config, dtype, device, attn_implementation)
        init_query_tokens(model)
        if quantization is not None:
            model = quantize_random(model, quantization, dtype, device)
        source = f"random init of {find_preset(model_name_or_path) or model_name_or_path}"
    else:
        model = load_pretrained(Blip2ForConditionalGeneration, model_name_or_path, dtype, attn_implementation, quantization)
        processor, processor_source = _processor_for(model.config, processor_name_or_path or model_name_or_path)
        changed, source = {}, f"pretrained {model_name_or_path}"
    report = ModelReport(
        source=source,
        init=init,
        dtype=str(dtype).removeprefix("torch."),
        device=str(next(model.parameters()).device),
        build_time_s=round(time.perf_counter() - start, 2),
        parameters=count_parameters(model),
        processor=processor_source,
        token_ids_changed=changed,
    )
    return model, processor, report


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
