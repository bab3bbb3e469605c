"""BLIP-2 captioning: a ViT, a Q-Former and a language model (OPT or Flan-T5) learn to write alt text for photos."""

from transformers import Blip2Config, Blip2ForConditionalGeneration

from altscale.families import Family
from altscale.families.blip2.collate import CaptionCollator
from altscale.families.blip2.flops import blip2_flops_per_sample
from altscale.families.blip2.layers import language_family, language_model, layer_class_names
from altscale.families.blip2.model import build_model
from altscale.families.blip2.samples import show_captions

# Adapters on the language model's attention and MLP and on the Q-Former's attention: the parts that
# turn image features into words. The ViT-g vision tower stays frozen, as in BLIP-2's own training.
LORA_TARGETS = {
    "opt": r".*language_model\..*\.(q_proj|k_proj|v_proj|out_proj|fc1|fc2)",
    "t5": r".*language_model\..*\.(q|k|v|o|wi_0|wi_1|wo)",
}
QFORMER_TARGETS = r".*qformer\..*\.(query|key|value)"


def default_lora_targets(config) -> str:
    """A regular expression peft matches against full module names."""
    return f"{LORA_TARGETS[language_family(config)]}|{QFORMER_TARGETS}"


def build_collator(model, processor, data) -> CaptionCollator:
    """`data`: the recipe's DataArguments (prompt, max_caption_tokens, pad_to_multiple_of)."""
    return CaptionCollator(
        processor,
        decoder_only=model.config.use_decoder_only_language_model,
        prompt=data.prompt,
        max_caption_tokens=data.max_caption_tokens,
        pad_to_multiple_of=data.pad_to_multiple_of,
    )


def flops_per_sample(config, collator: CaptionCollator, train_set, sample_size: int = 256) -> float:
    """Training FLOPs of a mean sample, from the caption lengths of up to `sample_size` training examples."""
    captions = train_set.select(range(min(sample_size, len(train_set))))["text"]
    caption_tokens = sum(len(collator.caption_ids(text)) for text in captions) / len(captions)
    prompt_tokens = len(collator.prompt_ids())
    if config.use_decoder_only_language_model:
        return blip2_flops_per_sample(config, text_tokens=prompt_tokens + caption_tokens)
    return blip2_flops_per_sample(config, text_tokens=caption_tokens, prompt_tokens=prompt_tokens)


FAMILY = Family(
    name="blip2",
    model_types=(Blip2Config.model_type,),
    config_class=Blip2Config,
    model_class=Blip2ForConditionalGeneration,
    build_model=build_model,
    build_collator=build_collator,
    flops_per_sample=flops_per_sample,
    default_lora_targets=default_lora_targets,
    layer_class_names=layer_class_names,
    language_model=language_model,
    show_samples=show_captions,
)
