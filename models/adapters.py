"""LoRA and QLoRA: which layers get adapters, and wrapping the model with peft."""

import re

from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

# Adapters on the language model's attention and MLP and on the Q-Former's attention: the parts that
# turn image features into words. The ViT-g vision tower stays frozen, as in BLIP-2's own training.
LORA_TARGETS = {
    "opt": r".*language_model\..*\.(q_proj|k_proj|v_proj|out_proj|fc1|fc2)",
    "t5": r".*language_model\..*\.(q|k|v|o|wi_0|wi_1|wo)",
}
QFORMER_TARGETS = r".*qformer\..*\.(query|key|value)"


def default_lora_targets(family: str) -> str:
    """A regular expression peft matches against full module names."""
    return f"{LORA_TARGETS[family]}|{QFORMER_TARGETS}"


def build_lora_config(family: str, r: int, alpha: int, dropout: float, targets: list[str] | None) -> LoraConfig:
    return LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=targets or default_lora_targets(family),
        bias="none",
    )


def apply_lora(model, lora_config: LoraConfig, *, quantized: bool, gradient_checkpointing: bool):
    """Freeze the model and add trainable adapters; quantized (QLoRA) models are prepared for k-bit training first."""
    if quantized:
        # Casts norms to fp32 and makes inputs require grad, so checkpointed layers still pass gradients.
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing)
    elif gradient_checkpointing:
        # With every base weight frozen, checkpointed blocks would see inputs that need no grad and drop
        # the adapters' gradients; this makes the embeddings' output require grad.
        model.enable_input_require_grads()
    return get_peft_model(model, lora_config)


def matched_modules(model, pattern: str) -> list[str]:
    return [name for name, _ in model.named_modules() if re.fullmatch(pattern, name)]
