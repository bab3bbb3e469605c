"""Configuration mistakes stop the run before any weight is loaded, with the fix in the message."""

import importlib.util

import psutil
import pytest
import torch

from altscale.config.arguments import parse_args
from altscale.config.errors import ConfigError
from altscale.config.machine import OPTIONAL_PACKAGES, Gpu, Machine
from altscale.strategies.precision import precision_problems
from recipes import train
from tests.recipes.machines import CPU, GPU, H100, OLD_GPU, V100, check


def test_bf16_on_a_gpu_without_bf16_names_the_precision_and_the_alternatives():
    args = parse_args(["--precision", "bf16-true", "--output_dir", "unused"])
    with pytest.raises(ConfigError) as err:
        check(args, OLD_GPU)
    assert str(err.value) == ("precision: bf16-true needs bf16, which this GPU (Tesla V100-SXM2-32GB) lacks; "
                              "use precision: fp16-mixed, or 32-true")
    args.strategy.precision = "32-true"
    check(args, OLD_GPU)  # no complaint once the precision fits


def precision_args(precision: str, *words: str):
    args = parse_args(["--use_cpu", "true", *words] if precision == "bf16-mixed" else list(words))
    args.strategy.precision = precision  # parse_args would stop fp16-mixed at TrainingArguments' own GPU check
    return args


def test_precision_problems_name_the_gpu_that_lacks_bf16():
    for precision in ("bf16-true", "bf16-mixed"):
        args = precision_args(precision)
        args.training.use_cpu = False  # on the GPU: set after parsing, which wants use_cpu for bf16-mixed here
        assert precision_problems(args, OLD_GPU) == [f"precision: {precision} needs bf16, which this GPU "
                                                     "(Tesla V100-SXM2-32GB) lacks; use precision: fp16-mixed, or 32-true"]
        assert precision_problems(args, GPU) == []
    # The first GPU that lacks bf16 is named, whatever comes before it
    mixed = Machine(gpus=(H100, Gpu("Tesla T4", 16 * 2**30, False), V100))
    assert "this GPU (Tesla T4) lacks" in precision_problems(precision_args("bf16-true"), mixed)[0]
    # fp16 (with loss scaling) and fp32 run on a V100; bf16 on its host CPU (use_cpu) is not the GPU's matter
    assert precision_problems(precision_args("fp16-mixed"), OLD_GPU) == []
    assert precision_problems(precision_args("32-true"), OLD_GPU) == []
    assert precision_problems(precision_args("bf16-mixed"), OLD_GPU) == []  # use_cpu: true
    # Without any GPU: fp16-mixed is refused, bf16 is not (the CPU autocasts to bf16)
    assert precision_problems(precision_args("fp16-mixed"), CPU) == [
        "precision: fp16-mixed needs a CUDA GPU; on the CPU use 32-true or bf16-mixed with use_cpu: true"]
    assert precision_problems(precision_args("bf16-true"), CPU) == []


def test_this_machine_is_detected_as_a_machine_without_gpus():
    machine = Machine.detect(environ={})
    assert len(machine.gpus) == torch.cuda.device_count() and machine.cuda is torch.cuda.is_available()
    assert machine.gpus == () and machine.cuda is False  # the tests' machine: CPU only
    assert machine.fsdp_on_cpu is False  # only a test that patches accelerate says so (tests/recipes/launched.py)
    assert machine.host_memory_bytes == psutil.virtual_memory().total > 0
    assert machine.local_world_size is None  # not started by a launcher
    assert machine.installed == {name for name in OPTIONAL_PACKAGES if importlib.util.find_spec(name) is not None}
    assert Machine.detect(environ={"LOCAL_WORLD_SIZE": "4"}).local_world_size == 4


def test_a_folder_holding_a_model_is_not_overwritten_without_a_flag(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=f"output_dir: {tmp_path} already holds a saved model or checkpoints; "
                                          "set overwrite_output_dir: true"):
        check(parse_args(["--output_dir", str(tmp_path)]))
    check(parse_args(["--output_dir", str(tmp_path), "--overwrite_output_dir", "true"]))


def test_a_folder_holding_checkpoints_may_be_resumed_from(tmp_path):
    (tmp_path / "checkpoint-7").mkdir()
    with pytest.raises(ConfigError, match="already holds"):
        check(parse_args(["--output_dir", str(tmp_path)]))
    check(parse_args(["--output_dir", str(tmp_path), "--resume_from_checkpoint", "last"]))


def test_an_empty_or_unrelated_folder_is_fine(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    check(parse_args(["--output_dir", str(tmp_path)]))


def test_resume_needs_a_checkpoint_to_resume_from(tmp_path):
    with pytest.raises(ConfigError, match=r"resume_from_checkpoint: last but output_dir .* holds no checkpoint-\*"):
        check(parse_args(["--output_dir", str(tmp_path), "--resume_from_checkpoint", "last"]))
    with pytest.raises(ConfigError, match="resume_from_checkpoint: .*nowhere is not a folder"):
        check(parse_args(["--output_dir", str(tmp_path), "--resume_from_checkpoint", str(tmp_path / "nowhere")]))


CONFIG_MISTAKES = {
    "unknown preset": (["--model_name_or_path", "blip2-huge-opt", "--init", "random"], "is not a preset"),
    "unknown yaml key": (["RECIPE"], "unknown key 'per_device_batch_size'; did you mean"),
    "wrong type": (["--per_device_train_batch_size", "eight"], "invalid int value: 'eight'"),
    "batch size 0": (["--per_device_train_batch_size", "0"], "per_device_train_batch_size: 0; use 1 or more"),
    "accumulation -1": (["--gradient_accumulation_steps", "-1"], "gradient_accumulation_steps: -1; use 1 or more"),
    "pixel cap 0": (["--max_image_pixels", "0"], "max_image_pixels: 0; use a positive pixel count"),
    "fsdp units of 0 layers": (["--fsdp_layers_per_unit", "0"], "fsdp_layers_per_unit: 0; use 1 or more"),
    "output dir in use": (["--output_dir", "USED"], "already holds a saved model or checkpoints"),
    "resume from nothing": (["--resume_from_checkpoint", "last"], "holds no checkpoint-*"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_MISTAKES))
def test_config_mistakes_exit_2_before_any_weight_is_loaded(case, tmp_path, monkeypatch, capsys):
    loaded = []
    real_build_model = train.build_model

    def build_model(*args, **kwargs):
        loaded.append(args)
        return real_build_model(*args, **kwargs)  # an unknown preset is caught here, before weights exist

    monkeypatch.setattr(train, "build_model", build_model)
    monkeypatch.setattr(train, "build_datasets", lambda *a: pytest.fail("reached the data after a config mistake"))
    argv, expected = CONFIG_MISTAKES[case]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("per_device_batch_size: 8\n")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "model.safetensors").write_bytes(b"")
    argv = [str(recipe) if word == "RECIPE" else str(tmp_path / "used") if word == "USED" else word for word in argv]
    if "--output_dir" not in argv:
        argv += ["--output_dir", str(tmp_path / "out")]
    code = train.run(argv, CPU)
    err = capsys.readouterr().err
    assert code == train.EXIT_USER_ERROR
    assert err.startswith("error: ") and expected in err and "Traceback" not in err
    if case != "unknown preset":
        assert not loaded  # stopped by parse_args or check_compatible
