"""Tiny models on disk for the generate, score and publish tests: built untrained, no download."""

import torch
from peft import LoraConfig, get_peft_model

from altscale.families.blip2.model import build_model


def save_tiny_model(folder) -> str:
    """An untrained tiny BLIP-2 with its processor, saved like a fine-tuned output_dir."""
    torch.manual_seed(0)
    model, processor, _ = build_model("blip2-tiny-opt")
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return str(folder)


def tiny_lora(base_folder: str):
    """A LoRA model on the saved base whose adapter visibly changes what it writes (random lora_B, not zeros)."""
    model, processor, _ = build_model(base_folder)
    torch.manual_seed(1)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    return peft_model, processor
