"""LoRA and QLoRA: wrapping any family's model with peft. Which layers get adapters by default is the family's
choice (Family.default_lora_targets); a recipe's lora_target_modules overrides it."""

import re

from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training


def build_lora_config(r: int, alpha: int, dropout: float, targets: str | list[str]) -> LoraConfig:
    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none")


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
