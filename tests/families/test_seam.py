"""The task-family seam: the engine finds a model's family in one place, and a new family is a new folder."""

import dataclasses
import json
import sys

import pytest
from transformers import Blip2Config

import altscale.families as families
from altscale.config.errors import ConfigError
from altscale.families import Family, family_for, family_names, family_of_model, family_of_type, random_init_config
from altscale.families.blip2 import FAMILY as BLIP2


def test_presets_hub_ids_and_saved_folders_find_their_family_offline(tmp_path):
    assert family_for("blip2-tiny-t5") is BLIP2
    assert family_for("Salesforce/blip2-opt-2.7b") is BLIP2  # a Hub id a preset copies: no network needed
    random_init_config("blip2-tiny-opt").save_pretrained(tmp_path)
    assert family_for(str(tmp_path)) is BLIP2


def test_a_model_type_no_family_trains_is_one_message_naming_the_known_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ConfigError, match=r"model_type 'gpt2' belongs to no task family; altscale trains blip-2 \(blip2\)"):
        family_for(str(tmp_path))
    with pytest.raises(ConfigError, match="has no config.json"):
        family_for(str(tmp_path / ".."))


def test_a_built_model_and_its_lora_wrapper_name_the_same_family():
    from peft import LoraConfig, get_peft_model

    model, _, _ = BLIP2.build_model("blip2-tiny-opt")
    assert family_of_model(model) is BLIP2
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=BLIP2.default_lora_targets(model.config)))
    assert family_of_model(wrapped) is BLIP2


def test_the_blip2_family_fills_every_field_with_a_real_builder():
    assert BLIP2.model_types == (Blip2Config.model_type,)
    for field in dataclasses.fields(Family):
        value = getattr(BLIP2, field.name)
        assert value not in (None, "", ()), field.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        BLIP2.name = "other"


def test_a_new_family_is_a_new_folder_found_by_its_name(tmp_path, monkeypatch):
    """No registry to edit: a package under families/ that sets FAMILY is found, and its model_type routes to it."""
    package = tmp_path / "toy"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from altscale.families import Family\n"
        "def _unused(*args, **kwargs):\n    raise AssertionError('not called in this test')\n"
        "FAMILY = Family(name='toy', model_types=('toy-lm',), config_class=dict, model_class=object,\n"
        "                build_model=_unused, build_collator=_unused, flops_per_sample=_unused,\n"
        "                default_lora_targets=_unused, layer_class_names=_unused, language_model=_unused,\n"
        "                show_samples=_unused)\n")
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "altscale.families.toy", raising=False)
    assert family_names() == ["blip2", "toy"]
    assert family_of_type("toy-lm", "model").name == "toy"
    assert family_of_type("blip-2", "model") is BLIP2
    sys.modules.pop("altscale.families.toy", None)


def test_the_family_counts_a_presets_parameters_without_building_it():
    assert families.parameter_count("blip2-tiny-opt") == 329_856
    assert families.parameter_count("not-a-preset") is None
