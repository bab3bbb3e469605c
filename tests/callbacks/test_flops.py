"""blip2_flops_per_sample against a hand count on a tiny BLIP-2 config; the peak FLOP/s table."""

import pytest
from transformers import Blip2Config

from altscale.callbacks.flops import peak_bf16_flops
from altscale.families.blip2.flops import blip2_flops_per_sample, blip2_forward_flops


def _tiny_config():
    return Blip2Config(
        vision_config={"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": 28, "patch_size": 14},
        qformer_config={"hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 2, "num_attention_heads": 2,
                        "cross_attention_frequency": 2, "encoder_hidden_size": 8},
        text_config={"model_type": "opt", "hidden_size": 16, "ffn_dim": 32, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "vocab_size": 50, "word_embed_proj_dim": 16},
        num_query_tokens=4,
    )


def test_forward_flops_match_hand_count():
    # vision: T_v = (28/14)² + 1 = 5; per layer 2·5·(4·8² + 2·8·16) + 4·5²·8 = 5920; 2 layers.
    # qformer: per layer 2·4·(4·8² + 2·8·12) + 4·4²·8 = 4096, 2 layers; cross-attention on layer 0:
    #   2·4·2·8² + 2·5·2·8·8 + 4·4·5·8 = 2944; projection 2·4·8·16 = 1024.
    # language: T = 4 + 6 = 10; 2·10·(2·16² + 2·16·16 + 2·16·32) + 4·10²·16 = 47360; head 2·10·16·50 = 16000.
    assert blip2_forward_flops(_tiny_config(), text_tokens=6) == {
        "vision": 11840.0, "qformer": 12160.0, "language": 63360.0}


def test_training_flops_use_multipliers():
    config = _tiny_config()
    assert blip2_flops_per_sample(config, 6) == 3 * (11840 + 12160 + 63360) == 262080
    assert blip2_flops_per_sample(config, 6, multipliers={"vision": 2}) == 11840 + 3 * (12160 + 63360)


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.4e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H200", 989.4e12),
    ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA GeForce RTX 4090", None), (None, None),
])
def test_peak_flops_by_device_name(name, peak):
    assert peak_bf16_flops(name) == peak
