import pytest
import torch

from altscale.families.blip2.model import build_model
from altscale.models.build import resolve_init
from altscale.families import parameter_count, random_init_config
from altscale.models.presets import find_preset, preset_names
from altscale.config.errors import ConfigError

# Unique parameter counts of the published checkpoints (transformers 5.17, meta device; ../shared/ARCHITECTURES.md).
PUBLISHED = {
    "blip2-opt-2.7b": 3_744_761_856,
    "blip2-opt-6.7b": 7_752_869_376,
    "blip2-flan-t5-xl": 3_876_648_448,
    "blip2-flan-t5-xxl": 12_098_000_384,
}


def test_opt_27b_matches_the_hub_config_exactly():
    assert parameter_count("blip2-opt-2.7b") == parameter_count("Salesforce/blip2-opt-2.7b") == 3_744_761_856
    assert parameter_count("outputs/my-model") is None  # not a preset: nothing to count without loading it


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_every_real_preset_within_a_tenth_of_a_percent(name):
    assert abs(parameter_count(name) - PUBLISHED[name]) / PUBLISHED[name] < 1e-3


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_real_presets_keep_the_published_vision_tower_and_qformer(name):
    config = random_init_config(name)
    vision, qformer = config.vision_config, config.qformer_config
    assert (vision.image_size, vision.patch_size, vision.hidden_size, vision.num_hidden_layers) == (224, 14, 1408, 39)
    assert (vision.num_attention_heads, vision.intermediate_size) == (16, 6144)
    assert (qformer.hidden_size, qformer.num_hidden_layers, qformer.cross_attention_frequency) == (768, 12, 2)
    assert config.num_query_tokens == 32


def test_preset_lookup_by_name_and_by_hub_id():
    assert find_preset("blip2-opt-2.7b") == "blip2-opt-2.7b"
    assert find_preset("Salesforce/blip2-flan-t5-xxl") == "blip2-flan-t5-xxl"
    assert find_preset("someone/else") is None
    assert {"blip2-tiny-opt", "blip2-tiny-t5"} <= set(preset_names())


def test_init_auto_is_random_for_presets_and_pretrained_for_hub_ids():
    assert resolve_init("blip2-tiny-opt", "auto") == "random"
    assert resolve_init("Salesforce/blip2-opt-2.7b", "auto") == "pretrained"
    assert resolve_init("Salesforce/blip2-opt-2.7b", "random") == "random"
    with pytest.raises(ConfigError, match="init: 'zeros' is unknown"):
        resolve_init("blip2-tiny-opt", "zeros")


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ConfigError, match="blip2-opt-2.7b, .*blip2-tiny-opt"):
        build_model("blip2-opt-99b", init="random")


def test_hub_id_offline_suggests_the_preset(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="model_name_or_path: blip2-opt-2.7b"):
        build_model("Salesforce/blip2-opt-2.7b", init="pretrained")


def test_random_init_builds_in_the_asked_dtype():
    model, processor, report = build_model("blip2-tiny-t5", dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert report.init == "random" and report.dtype == "bfloat16"
    assert model.config.image_token_id == processor.tokenizer.convert_tokens_to_ids("<image>")


def test_hub_id_with_random_init_uses_the_repo_architecture():
    from altscale.families import random_init_config

    assert random_init_config("Salesforce/blip2-opt-6.7b").text_config.hidden_size == 4096


def test_a_local_model_folder_loads_pretrained_with_its_processor(tmp_path):
    model, processor, _ = build_model("blip2-tiny-opt")
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    loaded, loaded_processor, report = build_model(str(tmp_path))
    assert report.init == "pretrained" and report.processor == str(tmp_path)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert loaded_processor.tokenizer.get_vocab() == processor.tokenizer.get_vocab()
    _, _, fresh = build_model(str(tmp_path), init="random")  # same architecture, new weights
    assert fresh.init == "random" and fresh.parameters == report.parameters


def test_a_folder_without_a_model_says_what_it_needs(tmp_path):
    with pytest.raises(ConfigError, match="needs config.json and the weights"):
        build_model(str(tmp_path))
