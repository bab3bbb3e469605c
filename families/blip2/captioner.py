"""A model that writes alt text: a fine-tuned folder or Hub id, or a base model plus a LoRA/QLoRA adapter."""

from dataclasses import dataclass, field
from pathlib import Path

import torch
from peft import PeftConfig, PeftModel

from altscale.families.blip2.collate import CaptionCollator
from altscale.families.blip2.model import build_model
from altscale.models.build import build_device, build_quantization_config
from altscale.families.blip2.generation import FALLBACK_ALT_TEXT, generate_captions
from altscale.config.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


@dataclass
class CaptionerArguments:
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A fine-tuned model folder or Hub id; with --adapter, its base (default: the base named in "
                  "adapter_config.json). A preset name (blip2-tiny-opt) gives an untrained model, for a baseline."},
    )
    adapter: str | None = field(default=None, metadata={"help": "A LoRA/QLoRA adapter folder or Hub id, put on the model."})
    processor_name_or_path: str | None = field(default=None, metadata={"help": "Default: the adapter folder's, else the model's."})
    dtype: str = field(default="auto", metadata={"help": "auto (bfloat16 on a GPU, float32 on the CPU), float32, bfloat16, float16."})
    load_in_4bit: bool = field(default=False, metadata={"help": "Load the base in 4-bit NF4, as a QLoRA adapter was trained (CUDA GPU only)."})
    batch_size: int = field(default=16, metadata={"help": "Images per generate call."})
    num_beams: int = field(default=1, metadata={"help": "1: greedy; more: beam search."})
    max_new_tokens: int = field(default=30, metadata={"help": "Longest alt text generated, in tokens."})
    prompt: str = field(default="", metadata={"help": "Text the model reads before writing; use the prompt it was trained with."})
    max_alt_chars: int = field(default=125, metadata={"help": "Alt text is cut at a word boundary to at most this many characters."})
    seed: int = field(default=0, metadata={"help": "Seeds the random weights of an untrained preset."})


def check_captioner(args: CaptionerArguments) -> list[str]:
    problems = []
    if args.model_name_or_path is None and args.adapter is None:
        problems.append("model_name_or_path: not given; name a fine-tuned model folder or Hub id, or an adapter with --adapter")
    for name in ("batch_size", "num_beams", "max_new_tokens"):
        if getattr(args, name) < 1:
            problems.append(f"{name}: {getattr(args, name)}; use 1 or more")
    if args.load_in_4bit and not torch.cuda.is_available():
        problems.append("load_in_4bit: bitsandbytes' 4-bit kernels need a CUDA GPU; on the CPU drop it (the adapter then sits on full-precision weights)")
    if args.max_alt_chars < 16:
        problems.append(f"max_alt_chars: {args.max_alt_chars} leaves no room for a description; use 16 or more (125 is usual)")
    return problems


def resolve_dtype(name: str) -> torch.dtype:
    """auto: bf16 on a GPU that has it (half the memory, same speed or better), fp32 on the CPU."""
    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    if name not in DTYPES:
        raise ConfigError(f"dtype: {name!r} is unknown; use auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def adapter_base(adapter: str) -> str:
    """The base model an adapter was trained on, from its adapter_config.json."""
    try:
        return PeftConfig.from_pretrained(adapter).base_model_name_or_path
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"adapter: cannot read {adapter!r} ({err.__class__.__name__}); give a folder or Hub id holding "
            "adapter_config.json and the adapter weights (what a LoRA/QLoRA run saves to its output_dir)"
        ) from None


def load_captioner(model_name_or_path: str | None, *, adapter: str | None = None, processor_name_or_path: str | None = None,
                   dtype: torch.dtype = torch.float32, load_in_4bit: bool = False) -> tuple[torch.nn.Module, object, str]:
    """(model on this machine's device, processor, one line saying what was loaded).

    With an adapter and no model, the base is the one named in the adapter's config. The processor
    comes from processor_name_or_path, else from a local adapter folder that holds one (a published
    adapter ships the processor it was trained with), else from the model.
    """
    if adapter is not None and model_name_or_path is None:
        model_name_or_path = adapter_base(adapter)
    if model_name_or_path is None:
        raise ConfigError("model_name_or_path: not given; name a fine-tuned model folder or Hub id, or an adapter with --adapter")
    if processor_name_or_path is None and adapter is not None and any(Path(adapter, f).is_file() for f in PROCESSOR_FILES):
        processor_name_or_path = adapter
    # QLoRA's adapter was trained on NF4 weights; load_in_4bit reproduces that base (a GPU only), else it sits on dtype weights.
    quantization = build_quantization_config(load_in_4bit, double_quant=True, compute_dtype=torch.bfloat16)
    model, processor, report = build_model(model_name_or_path, dtype=dtype, processor_name_or_path=processor_name_or_path,
                                           quantization=quantization)
    if report.init == "random" and adapter is not None:
        raise ConfigError(
            f"model_name_or_path: {model_name_or_path!r} is a preset, which has random weights, so the adapter would "
            "sit on a model it was not trained with; give the base model's Hub id or folder (adapter_config.json names it)"
        )
    described = report.source + (" (untrained: random weights, a baseline only)" if report.init == "random" else "")
    if adapter is not None:
        if not Path(adapter).exists() and adapter.count("/") != 1:
            raise ConfigError(f"adapter: {adapter!r} is neither a folder nor a Hub id (owner/name)")
        adapter_base(adapter)  # one clear message when the folder holds no adapter
        model = PeftModel.from_pretrained(model, adapter)
        described += f" + adapter {adapter}"
    if quantization is None:  # a 4-bit model is placed on its GPU as it loads and cannot be moved
        model.to(build_device())
    model.eval()
    return model, processor, described


def build_collator(model, processor, prompt: str = "") -> CaptionCollator:
    return CaptionCollator(processor, decoder_only=model.config.use_decoder_only_language_model, prompt=prompt)


def trim_alt_text(text: str, max_chars: int = 125) -> str:
    """One line of at most max_chars, cut at a word boundary; never empty.

    125 characters is the usual advice for alt text (some screen readers cut longer text).
    """
    text = " ".join(text.split())
    if len(text) > max_chars:
        cut = text[: max_chars + 1].rsplit(" ", 1)[0] if " " in text[: max_chars + 1] else text[:max_chars]
        text = cut[:max_chars].rstrip(" ,;:-")
    return text or FALLBACK_ALT_TEXT


def write_alt_text(model, collator: CaptionCollator, images: list, *, max_chars: int = 125, **generation) -> list[str]:
    """Alt text for each image: batched generation (max_new_tokens, num_beams, batch_size), then trimmed."""
    if not images:
        return []
    return [trim_alt_text(text, max_chars) for text in generate_captions(model, collator, images, **generation)]
