"""Memory strategies chosen from the recipe, on the tiny model: LoRA, checkpointing, optimizers, LR scaling, checks."""

import dataclasses
import json

import pytest
import torch
from peft import PeftModel

from altscale.config.arguments import parse_args
from altscale.config.errors import ConfigError
from altscale.config.machine import Machine
from altscale.families.blip2.model import build_model
from altscale.strategies.deepspeed import deepspeed_problems
from altscale.strategies.launch import plan_launch
from recipes import train
from tests.recipes.machines import CPU, check

BASE = ["--dataloader_num_workers", "0", "--disable_tqdm", "true", "--per_device_train_batch_size", "8",
        "--max_steps", "2", "--memory_log_steps", "1", "--num_sample_captions", "0"]


@pytest.fixture(scope="module")
def photos(synthetic_photos):
    return synthetic_photos(num_train=48, num_test=8, seed=2, size=64)


def run(tmp_path, photos, *extra):
    result = train.main(["--dataset_path", photos, "--output_dir", str(tmp_path / "out"),
                         "--results_file", str(tmp_path / "results.jsonl"), *BASE, *extra])
    return result["record"]


def snapshot(record, step, phase):
    return next(r for r in record["snapshots"] if (r["step"], r["phase"]) == (step, phase))


def test_lora_trains_adapters_only_and_saves_only_the_adapter(tmp_path, photos):
    record = run(tmp_path, photos, "--use_peft", "true", "--lora_r", "4", "--gradient_checkpointing", "true")
    effective = record["effective_config"]
    assert effective["frozen_params"] == 329_856  # the whole tiny model
    adapters = effective["trainable_params"]
    assert 0 < adapters < 329_856 // 4
    after_bwd = snapshot(record, 1, "after_bwd")
    assert after_bwd["grads_cpu"] == adapters * 4  # fp32 gradients for adapter weights only
    assert snapshot(record, 1, "after_step")["optim_cpu"] == adapters * 8 + effective_state_tensors(effective) * 4
    assert effective["gradient_checkpointing"] is True
    saved = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= saved and "model.safetensors" not in saved

    base, _, _ = build_model("blip2-tiny-opt")
    model = PeftModel.from_pretrained(base, tmp_path / "out")
    trained = {n: p for n, p in model.named_parameters() if "lora_B" in n}
    assert trained and any(p.abs().sum() > 0 for p in trained.values())  # lora_B starts at zero: it was trained


def effective_state_tensors(effective) -> int:
    """One 4-byte `step` counter per adapter tensor with AdamW state."""
    return effective["optimizer_state_dtypes"]["exp_avg: torch.float32"]


def test_sgd_without_momentum_keeps_no_optimizer_state(tmp_path, photos):
    record = run(tmp_path, photos, "--optim", "sgd")
    assert record["effective_config"]["optimizer_class"] == "torch.optim.sgd.SGD"
    assert snapshot(record, 1, "after_step")["optim_cpu"] == 0


def test_gradient_accumulation_with_linear_lr_scaling_reports_asked_and_used(tmp_path, photos):
    record = run(tmp_path, photos, "--gradient_accumulation_steps", "4", "--learning_rate", "1e-4",
                 "--lr_scaling", "linear", "--lr_reference_batch_size", "16")
    adjusted = record["config"]["adjusted"]["learning_rate"]
    assert (adjusted["asked"], adjusted["used"]) == (1e-4, pytest.approx(2e-4))  # global batch 32 / 16
    assert record["config"]["training_args"]["learning_rate"] == pytest.approx(2e-4)
    assert record["effective_config"]["global_batch_size"] == 32


def test_eight_bit_adamw_runs_where_bitsandbytes_has_a_cpu_backend(tmp_path, photos):
    pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed")
    record = run(tmp_path, photos, "--optim", "adamw_bnb_8bit")
    assert record["effective_config"]["optimizer_class"].startswith("bitsandbytes.optim")


def test_4bit_weights_without_peft_are_refused():
    with pytest.raises(ConfigError, match=r"add use_peft: true \(QLoRA\)"):
        check(parse_args(["--load_in_4bit", "true"]), CPU)


def test_unknown_lr_scaling_is_refused():
    with pytest.raises(ConfigError, match="lr_scaling: 'sqrt' is unknown"):
        check(parse_args(["--lr_scaling", "sqrt"]), CPU)


def ds_problems(args, machine: Machine = CPU, world_size: int | None = None) -> list[str]:
    """deepspeed_problems of this launch on `machine`; `world_size`: the launch's process count, if not this one."""
    plan = plan_launch(args, environ={})
    if world_size is not None:
        plan = dataclasses.replace(plan, world_size=world_size)
    return deepspeed_problems(args, plan, machine)


def test_deepspeed_optimizer_section_and_an_explicit_optim_conflict(tmp_path):
    args = parse_args(["--optim", "adamw_bnb_8bit"])
    args.training.deepspeed = "ds_configs/zero2_offload.json"  # set after parsing: deepspeed need not be installed
    assert any("optim: adamw_bnb_8bit is ignored" in p for p in ds_problems(args))
    args = parse_args(["--use_peft", "true", "--load_in_4bit", "true"])
    args.training.deepspeed = "ds_configs/zero3_offload.json"
    assert any("ZeRO-3 cannot partition" in p for p in ds_problems(args))
    args.training.deepspeed = "ds_configs/nope.json"
    assert ds_problems(args) == ["deepspeed: 'ds_configs/nope.json' is not a file; use one of ds_configs/*.json"]


def test_the_default_optim_written_out_is_swapped_under_deepspeed_too():
    args = parse_args(["--optim", "adamw_torch_fused"])  # the default value, but asked for
    args.training.deepspeed = "ds_configs/zero2_offload.json"
    assert any("optim: adamw_torch_fused is ignored" in p for p in ds_problems(args))
    args = parse_args([])
    args.training.deepspeed = "ds_configs/zero2_offload.json"
    assert ds_problems(args) == []


def offload_args(model: str, config: str, *words: str):
    args = parse_args(["--model_name_or_path", model, *words])
    args.training.deepspeed = f"ds_configs/{config}.json"  # set after parsing: deepspeed need not be installed
    return args


def machine_with(gib: int, **facts) -> Machine:
    return Machine(host_memory_bytes=gib * 2**30, **facts)


def test_zero_offload_that_cannot_fit_in_host_memory_is_refused_with_the_estimate():
    """The measured cases: xxl ZeRO-3 offload was killed on 2 H200s (251 GiB) and ZeRO-2 offload on one H100
    (125 GiB); xxl ZeRO-3 ran on 4 H200s (512 GiB), opt-2.7b ZeRO-2 and ZeRO-3 offload on the H100."""
    two_h200s = machine_with(251)
    (problem,) = ds_problems(offload_args("blip2-flan-t5-xxl", "zero3_offload"), two_h200s)
    assert problem.startswith("deepspeed: ds_configs/zero3_offload.json keeps the optimizer in host memory: about "
                              "282 GiB on each machine (25 bytes a parameter, from a measured run, x 12.1 B "
                              "parameters), and this machine has 251 GiB")
    assert "use_peft: true" in problem and "host_memory_check: false" in problem
    h100 = machine_with(125)
    (problem,) = ds_problems(offload_args("blip2-flan-t5-xxl", "zero2_offload"), h100)
    assert "about 259 GiB on each machine (23 bytes a parameter" in problem  # ZeRO-2: the weights stay on the GPU
    assert ds_problems(offload_args("blip2-opt-2.7b", "zero3_offload"), h100) == []
    assert ds_problems(offload_args("blip2-opt-2.7b", "zero2_offload"), h100) == []
    assert ds_problems(offload_args("blip2-flan-t5-xxl", "zero3_offload"), machine_with(512)) == []


def test_the_host_memory_estimate_can_be_skipped_and_splits_over_machines():
    two_h200s = machine_with(251)
    assert ds_problems(offload_args("blip2-flan-t5-xxl", "zero3_offload", "--host_memory_check", "false"),
                       two_h200s) == []
    assert ds_problems(offload_args("blip2-flan-t5-xxl", "zero3_offload", "--use_peft", "true"), two_h200s) == []
    assert ds_problems(offload_args("outputs/some-folder", "zero3_offload"), two_h200s) == []  # not a preset: no count
    # 8 processes, 4 to a machine: 2 machines, 141 GiB each
    assert ds_problems(offload_args("blip2-flan-t5-xxl", "zero3_offload"), machine_with(251, local_world_size=4),
                       world_size=8) == []
    # 8 processes all on this machine: the whole 282 GiB here
    (problem,) = ds_problems(offload_args("blip2-flan-t5-xxl", "zero3_offload"), machine_with(251, local_world_size=8),
                             world_size=8)
    assert "about 282 GiB on each machine (25 bytes a parameter, from a measured run, x 12.1 B parameters)" in problem


def test_deepspeed_cpu_adam_is_no_optim_value():
    with pytest.raises(ConfigError, match="optim: deepspeed_cpu_adam is not an optimizer transformers builds"):
        parse_args(["--optim", "deepspeed_cpu_adam"])


@pytest.mark.parametrize("name", ["zero2_offload", "zero3_offload"])
def test_offload_configs_step_deepspeeds_fast_cpu_adam(name):
    config = json.loads(open(f"ds_configs/{name}.json").read())
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert config["optimizer"]["type"] == "AdamW" and config["optimizer"]["params"]["torch_adam"] is False


def test_bf16_true_under_deepspeed_turns_on_deepspeeds_bf16_mode():
    from altscale.strategies.precision import precision_flags

    training = parse_args([]).training
    training.deepspeed = "ds_configs/zero2_offload.json"
    assert precision_flags("bf16-true", training) == {"bf16": True}
    assert torch.bfloat16  # bf16 weights on the GPU, fp32 master weights inside DeepSpeed
