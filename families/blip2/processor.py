"""The BLIP-2 processor: image preprocessing plus the language model's tokenizer."""

from pathlib import Path

import importlib.util

from transformers import Blip2Config, Blip2Processor, BlipImageProcessorPil
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

from altscale.families.blip2.layers import language_family
from altscale.models.tokenizer import load_offline_tokenizer


def _image_processor_class():
    """The torchvision backend where it is installed (faster), else PIL.

    Even importing BlipImageProcessor without torchvision prints a fallback warning, so it is imported only here.
    """
    if importlib.util.find_spec("torchvision"):
        from transformers import BlipImageProcessor

        return BlipImageProcessor
    return BlipImageProcessorPil


def build_offline_processor(config: Blip2Config) -> Blip2Processor:
    """A processor made from files in the repo, matching the published BLIP-2 preprocessing."""
    size = config.vision_config.image_size
    backend = _image_processor_class()
    image_processor = backend(
        size={"height": size, "width": size},
        image_mean=OPENAI_CLIP_MEAN,
        image_std=OPENAI_CLIP_STD,
        do_convert_rgb=True,  # greyscale, RGBA and CMYK photos become 3-channel RGB
    )
    tokenizer = load_offline_tokenizer(language_family(config))
    return Blip2Processor(image_processor, tokenizer, num_query_tokens=config.num_query_tokens)


def load_processor(path: str | Path) -> Blip2Processor:
    """The processor saved with a model, locally or on the Hub."""
    return Blip2Processor.from_pretrained(path)


def align_token_ids(config: Blip2Config, processor: Blip2Processor) -> dict[str, tuple]:
    """Point the config's special-token ids at the processor's; returns {field: (was, now)} for the report.

    The repo's offline tokenizer is much smaller than the real ones, so its <image> id differs from the
    Hub config's; the model must look for the id the processor writes.
    """
    tokenizer = processor.tokenizer
    wanted = {
        "image_token_id": tokenizer.convert_tokens_to_ids(processor.image_token.content),
        "text_config.pad_token_id": tokenizer.pad_token_id,
        "text_config.eos_token_id": tokenizer.eos_token_id,
    }
    if config.use_decoder_only_language_model:
        wanted["text_config.bos_token_id"] = tokenizer.bos_token_id
    else:
        wanted["text_config.decoder_start_token_id"] = tokenizer.pad_token_id
    changed = {}
    for field, value in wanted.items():
        target = config.text_config if field.startswith("text_config.") else config
        name = field.removeprefix("text_config.")
        if getattr(target, name, None) != value:
            changed[field] = (getattr(target, name, None), value)
            setattr(target, name, value)
    return changed
