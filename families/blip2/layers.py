"""The repeated blocks of a built BLIP-2: the units FSDP shards, gathers and checkpoints one at a time.

Read from the model itself rather than named per family, so a new language model needs no edit here: each of
the three towers keeps its blocks in its first nn.ModuleList (transformers 5.17: Blip2EncoderLayer in the
vision tower, Blip2QFormerLayer in the Q-Former, OPTDecoderLayer or T5Block in the language model).

Why not the model's `_no_split_modules`, accelerate's fallback: on Blip2ForConditionalGeneration it names
Blip2TextEmbeddings, which this model does not contain (accelerate then stops with "Could not find the
transformer layer class"), and Blip2Attention / Blip2QFormerMultiHeadAttention, which would cut each vision and
Q-Former layer into two units and leave the Q-Former's MLPs in the root unit.
"""

import torch


def towers(model) -> dict[str, torch.nn.Module]:
    """The three towers of a BLIP-2 (through a PEFT wrapper)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {"vision": base.vision_model, "qformer": base.qformer, "language": base.language_model}


def layer_class_names(model) -> list[str]:
    """The class names of each tower's repeated block, vision first (e.g. Blip2EncoderLayer, Blip2QFormerLayer,
    OPTDecoderLayer)."""
    names = []
    for tower_name, tower in towers(model).items():
        blocks = next((module for module in tower.modules() if isinstance(module, torch.nn.ModuleList)), None)
        assert blocks is not None and len(blocks) > 0, f"the {tower_name} tower has no list of layers"
        names.append(type(blocks[0]).__name__)
    return list(dict.fromkeys(names))


def language_family(config) -> str:
    """'opt' for decoder-only language models, 't5' for encoder-decoder ones: which offline tokenizer and which
    LoRA targets apply."""
    return "opt" if config.use_decoder_only_language_model else "t5"


def language_model(model) -> torch.nn.Module:
    """The language tower: the part whose KV cache and tied embeddings FSDP's setup deals with."""
    return towers(model)["language"]
