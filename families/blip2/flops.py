"""Analytic FLOPs of one BLIP-2 training sample (the MFU's numerator; callbacks/flops.py has the denominator).

Forward FLOPs per sample, counting 2 FLOPs per multiply-add of every matrix multiply in the
transformer blocks, plus the attention scores (QKᵀ and the weighted sum of V: 4·q·k·d for q queries
attending to k keys of width d, full matrix even where a causal mask hides half of it, as PaLM's MFU does):

  vision tower (ViT), T_v = (image_size / patch_size)² + 1 tokens (257 for 224/14), per layer:
      2·T_v·(4·d_v² + 2·d_v·f_v) + 4·T_v²·d_v
  Q-Former, q = num_query_tokens (32) queries, per layer:
      2·q·(4·d_q² + 2·d_q·f_q) + 4·q²·d_q
    and on every `cross_attention_frequency`-th layer (layer index % frequency == 0) the cross-attention
    over the image tokens: Q and output projections on the queries, K and V projections on the T_v
    image tokens of width d_v:
      2·q·2·d_q² + 2·T_v·2·d_q·d_v + 4·q·T_v·d_q
    plus the language projection of the queries: 2·q·d_q·d_lm
  language model (decoder-only, e.g. OPT), T = q + text_tokens positions, per layer:
      2·T·(2·d² + 2·d·d_kv + m·d·f) + 4·T²·d
    (d_kv = num_key_value_heads·head_dim where the config has it, else d; m = 3 gated MLP matrices for
    silu activations, else 2), plus the LM head over every position: 2·T·d·V.
  language model (encoder-decoder, Flan-T5), inner width a = num_heads·d_kv, m = 3 for gated-gelu:
    encoder over T_e = q + prompt_tokens positions, per layer: 2·T_e·(4·d·a + m·d·f) + 4·T_e²·a
    decoder over T_d = text_tokens positions, per layer: self-attention 2·T_d·4·d·a + 4·T_d²·a,
      cross-attention 2·T_d·2·d·a + 2·T_e·2·d·a + 4·T_d·T_e·a, MLP 2·T_d·m·d·f
    plus the LM head over the decoder positions: 2·T_d·d·V.

Left out, each well under 1% for BLIP-2 sizes: embeddings and the patch convolution, layer norms,
biases, softmax, activations, the loss.

Training FLOPs = forward × multiplier / 2 per component. The default multiplier 6 is the usual
"6 × params × tokens" model-FLOPs convention (forward 2, backward 4) used for MFU, whatever is frozen;
pass e.g. {"vision": 2} to count a frozen vision tower as forward only (hardware FLOPs), or 4 for a
frozen block that gradients must still pass through (a LoRA-adapted language model).
"""

from __future__ import annotations

from typing import Any


def _get(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def _pair(value: Any) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


def blip2_forward_flops(config: Any, text_tokens: float, prompt_tokens: float = 0) -> dict[str, float]:
    """Forward FLOPs of one sample per component ("vision", "qformer", "language"): see the module docstring.

    For a decoder-only model `text_tokens` counts every text position (bos, prompt, caption, eos); for an
    encoder-decoder one it counts the decoder positions, and `prompt_tokens` the encoder's text positions.
    """
    vision, qformer, text = config.vision_config, config.qformer_config, config.text_config
    q = config.num_query_tokens

    image_h, image_w = _pair(vision.image_size)
    patch_h, patch_w = _pair(vision.patch_size)
    t_v = (image_h // patch_h) * (image_w // patch_w) + 1
    d_v, f_v = vision.hidden_size, vision.intermediate_size
    vision_flops = vision.num_hidden_layers * (2 * t_v * (4 * d_v**2 + 2 * d_v * f_v) + 4 * t_v**2 * d_v)

    d_q, f_q = qformer.hidden_size, qformer.intermediate_size
    d_enc = qformer.encoder_hidden_size
    d_lm = text.hidden_size
    cross_layers = sum(1 for i in range(qformer.num_hidden_layers) if i % qformer.cross_attention_frequency == 0)
    qformer_flops = (
        qformer.num_hidden_layers * (2 * q * (4 * d_q**2 + 2 * d_q * f_q) + 4 * q**2 * d_q)
        + cross_layers * (2 * q * 2 * d_q**2 + 2 * t_v * 2 * d_q * d_enc + 4 * q * t_v * d_q)
        + 2 * q * d_q * d_lm
    )

    if getattr(text, "is_encoder_decoder", False):
        language_flops = _t5_forward_flops(text, encoder_tokens=q + prompt_tokens, decoder_tokens=text_tokens)
        return {"vision": float(vision_flops), "qformer": float(qformer_flops), "language": float(language_flops)}

    t = q + text_tokens
    d = d_lm
    f = _get(text, "ffn_dim", "intermediate_size")
    heads = text.num_attention_heads
    head_dim = _get(text, "head_dim", default=d // heads)
    d_kv = _get(text, "num_key_value_heads", default=heads) * head_dim
    mlp_matrices = 3 if _get(text, "hidden_act", "activation_function", default="") in ("silu", "swiglu") else 2
    language_flops = (
        text.num_hidden_layers * (2 * t * (2 * d**2 + 2 * d * d_kv + mlp_matrices * d * f) + 4 * t**2 * d)
        + 2 * t * d * text.vocab_size
    )
    return {"vision": float(vision_flops), "qformer": float(qformer_flops), "language": float(language_flops)}


def _t5_forward_flops(text: Any, encoder_tokens: float, decoder_tokens: float) -> float:
    d, f, a = text.d_model, text.d_ff, text.num_heads * text.d_kv
    m = 3 if getattr(text, "is_gated_act", False) else 2
    t_e, t_d = encoder_tokens, decoder_tokens
    encoder = text.num_layers * (2 * t_e * (4 * d * a + m * d * f) + 4 * t_e**2 * a)
    decoder = text.num_decoder_layers * (
        2 * t_d * 4 * d * a + 4 * t_d**2 * a  # self-attention
        + 2 * t_d * 2 * d * a + 2 * t_e * 2 * d * a + 4 * t_d * t_e * a  # cross-attention
        + 2 * t_d * m * d * f  # MLP
    )
    return encoder + decoder + 2 * t_d * d * text.vocab_size


def blip2_flops_per_sample(config: Any, text_tokens: float, multipliers: dict[str, float] | None = None,
                           prompt_tokens: float = 0) -> float:
    """Training FLOPs of one sample with `text_tokens` text positions (the query positions are added here).

    `multipliers` per component default to 6 (the 6·N·T convention); see the module docstring.
    """
    factors = {"vision": 6.0, "qformer": 6.0, "language": 6.0, **(multipliers or {})}
    forward = blip2_forward_flops(config, text_tokens, prompt_tokens)
    return sum(flops * factors[name] / 2 for name, flops in forward.items())
