"""Write alt text with a BLIP-2 model: batched, greedy or beam search."""

import torch

from altscale.families.blip2.collate import CaptionCollator

FALLBACK_ALT_TEXT = "image"  # alt text must never be empty: an empty alt marks a picture as decorative


@torch.no_grad()
def generate_captions(
    model, collator: CaptionCollator, images: list, *, max_new_tokens: int = 30, num_beams: int = 1, batch_size: int = 16,
    **generate_kwargs,
) -> list[str]:
    """One caption per image, stripped; an empty generation becomes FALLBACK_ALT_TEXT, so alt text is never blank."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    captions = []
    for start in range(0, len(images), batch_size):
        inputs = collator.generation_inputs(images[start : start + batch_size])
        inputs = {key: value.to(device) for key, value in inputs.items()}
        inputs["pixel_values"] = inputs["pixel_values"].to(dtype)
        output = model.generate(
            **inputs, max_new_tokens=max_new_tokens, num_beams=num_beams, do_sample=False, **generate_kwargs
        )
        if model.config.use_decoder_only_language_model:
            # A decoder-only model returns the prompt too; keep what it wrote after it.
            output = output[:, inputs["input_ids"].shape[1] :]
        texts = collator.tokenizer.batch_decode(output, skip_special_tokens=True)
        captions.extend(text.strip() or FALLBACK_ALT_TEXT for text in texts)
    model.train(was_training)
    return captions
