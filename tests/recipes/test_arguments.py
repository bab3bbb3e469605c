import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from altscale.config.arguments import PROJECT_DEFAULTS, load_recipe, parse_args, to_argv
from altscale.config.errors import ConfigError
from altscale.config.machine import Machine
from tests.recipes.machines import CPU, check

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").rglob("*.yaml")), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_recipe_parses_and_passes_the_checks(path):
    """Every key is known and every value valid; on this GPU-less machine only GPU-bound problems may remain."""
    # overwrite_output_dir: a finished `make demo` leaves a model in the recipe's output_dir, which is no recipe fault
    argv = [str(path), "--use_cpu", "true", "--overwrite_output_dir", "true"]
    machine = Machine.detect()
    try:
        check(parse_args(argv), machine)
    except ConfigError as err:
        problems = str(err).splitlines()
        assert all(GPU_BOUND.search(problem) for problem in problems), problems
        assert not machine.cuda or importlib.util.find_spec("deepspeed") is None


GPU_BOUND = re.compile(r"needs a CUDA GPU|needs the deepspeed package")


def test_the_qlora_recipe_is_accepted_on_the_cpu():
    # bitsandbytes' CPU 4-bit kernels train it (docs/compatibility.md); only its size keeps it on a GPU.
    check(parse_args([str(ROOT / "recipes/blip2/xxl-qlora.yaml"), "--overwrite_output_dir", "true",
                      "--use_cpu", "true"]), CPU)


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").rglob("*.yaml")), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_recipe_says_what_it_changes_and_how_to_run_it(path):
    head = path.read_text().splitlines()[:4]
    assert head[0].startswith(f"# {path.stem}:")
    assert any(line.startswith("# run: make ") for line in head)


def test_every_recipe_has_its_make_target():
    makefile = (ROOT / "Makefile").read_text()
    assert "RECIPES := $(basename $(notdir $(wildcard recipes/blip2/*.yaml)))" in makefile


def write(tmp_path, values: dict) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def test_command_line_overrides_the_recipe(tmp_path):
    recipe = write(tmp_path, {"per_device_train_batch_size": 4, "learning_rate": 1e-4, "precision": "32-true"})
    args = parse_args([recipe, "--per_device_train_batch_size", "8"])
    assert args.training.per_device_train_batch_size == 8
    assert args.training.learning_rate == 1e-4


def test_recipe_overrides_project_defaults_which_override_hf_defaults(tmp_path):
    args = parse_args([write(tmp_path, {"dataloader_num_workers": 0})])
    assert args.training.dataloader_num_workers == 0
    assert args.training.remove_unused_columns is PROJECT_DEFAULTS["remove_unused_columns"]


def test_unknown_yaml_key_names_the_closest_one(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'per_device_train_batch_sise'; did you mean 'per_device_train_batch_size'"):
        load_recipe(write(tmp_path, {"per_device_train_batch_sise": 4}))


def test_unknown_command_line_option_names_the_closest_one():
    with pytest.raises(ConfigError, match="unknown option 'learning_rat'; did you mean 'learning_rate'"):
        parse_args(["--learning_rat", "1e-3"])


def test_wrong_type_is_one_line_not_a_usage_dump():
    with pytest.raises(ConfigError, match="invalid int value: 'many'") as caught:
        parse_args(["--per_device_train_batch_size", "many"])
    assert "usage:" not in str(caught.value)


def test_missing_recipe_and_broken_yaml(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        parse_args([str(tmp_path / "nope.yaml")])
    bad = tmp_path / "bad.yaml"
    bad.write_text("learning_rate: [1e-3\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_args([str(bad)])
    listed = tmp_path / "list.yaml"
    listed.write_text("- learning_rate\n")
    with pytest.raises(ConfigError, match="expected `key: value` lines"):
        parse_args([str(listed)])


def test_precision_sets_the_autocast_flags():
    assert parse_args(["--precision", "32-true"]).training.bf16 is False
    mixed = parse_args(["--precision", "bf16-mixed", "--use_cpu", "true"]).training
    assert (mixed.bf16, mixed.fp16) == (True, False)
    assert parse_args(["--precision", "bf16-true"]).training.bf16 is False  # bf16 weights need no autocast


def test_unknown_precision_lists_the_known_ones():
    with pytest.raises(ConfigError, match="precision: 'bf17' is unknown; use one of 32-true, bf16-true"):
        parse_args(["--precision", "bf17"])


def test_bf16_mixed_without_a_gpu_asks_for_use_cpu(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(ConfigError, match="add it, or use precision: 32-true"):
        parse_args(["--precision", "bf16-mixed"])


def test_checks_collect_every_problem_at_once():
    args = parse_args(["--per_device_train_batch_size", "0", "--gradient_accumulation_steps", "0",
                       "--remove_unused_columns", "true", "--memory_log_steps", "0"])
    with pytest.raises(ConfigError) as caught:
        check(args, CPU)
    lines = str(caught.value).splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("per_device_train_batch_size: 0")


def test_fp16_mixed_needs_a_gpu():
    args = parse_args([])
    args.strategy.precision = "fp16-mixed"  # parse_args itself would stop at TrainingArguments' fp16 check
    with pytest.raises(ConfigError, match="fp16-mixed needs a CUDA GPU"):
        check(args, CPU)


def test_yaml_values_become_command_line_words():
    assert to_argv({"a": True, "b": [1, 2], "c": None, "d": {"x": 1}}) == ["--a", "true", "--b", "1", "2", "--d", '{"x": 1}']


def test_a_deepspeed_recipe_without_deepspeed_is_one_message(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "deepspeed" else object())
    with pytest.raises(ConfigError, match="deepspeed: ds_configs/zero2_offload.json needs the deepspeed package"):
        parse_args(["--deepspeed", "ds_configs/zero2_offload.json"])
