"""Configuration mistakes stop the run before any weight is loaded, with the fix in the message."""

import pytest

from recipes import train
from altscale.config.arguments import parse_args
from altscale.config.checks import check_compatible
from altscale.config.errors import ConfigError


def test_bf16_on_a_gpu_without_bf16_names_the_precision_and_the_alternatives(monkeypatch):
    args = parse_args(["--precision", "bf16-true", "--output_dir", "unused"])
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda *a, **k: "Tesla V100-SXM2-32GB")
    with pytest.raises(ConfigError) as err:
        check_compatible(args)
    assert str(err.value) == ("precision: bf16-true needs bf16, which this GPU (Tesla V100-SXM2-32GB) lacks; "
                              "use precision: fp16-mixed, or 32-true")
    args.strategy.precision = "32-true"
    check_compatible(args)  # no complaint once the precision fits


def test_a_folder_holding_a_model_is_not_overwritten_without_a_flag(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=f"output_dir: {tmp_path} already holds a saved model or checkpoints; "
                                          "set overwrite_output_dir: true"):
        check_compatible(parse_args(["--output_dir", str(tmp_path)]))
    check_compatible(parse_args(["--output_dir", str(tmp_path), "--overwrite_output_dir", "true"]))


def test_a_folder_holding_checkpoints_may_be_resumed_from(tmp_path):
    (tmp_path / "checkpoint-7").mkdir()
    with pytest.raises(ConfigError, match="already holds"):
        check_compatible(parse_args(["--output_dir", str(tmp_path)]))
    check_compatible(parse_args(["--output_dir", str(tmp_path), "--resume_from_checkpoint", "last"]))


def test_an_empty_or_unrelated_folder_is_fine(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    check_compatible(parse_args(["--output_dir", str(tmp_path)]))


def test_resume_needs_a_checkpoint_to_resume_from(tmp_path):
    with pytest.raises(ConfigError, match=r"resume_from_checkpoint: last but output_dir .* holds no checkpoint-\*"):
        check_compatible(parse_args(["--output_dir", str(tmp_path), "--resume_from_checkpoint", "last"]))
    with pytest.raises(ConfigError, match="resume_from_checkpoint: .*nowhere is not a folder"):
        check_compatible(parse_args(["--output_dir", str(tmp_path), "--resume_from_checkpoint", str(tmp_path / "nowhere")]))


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
    code = train.run(argv)
    err = capsys.readouterr().err
    assert code == train.EXIT_USER_ERROR
    assert err.startswith("error: ") and expected in err and "Traceback" not in err
    if case != "unknown preset":
        assert not loaded  # stopped by parse_args or check_compatible
