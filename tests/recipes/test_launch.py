"""Launch files and what the recipe does with them (strategies/launch.py, fsdp.py, config/adjust.py): one process
each, no distributed run.

A launch's environment comes from accelerate's own launcher code for the repo's yaml files, so these tests see
exactly the FSDP_* / ACCELERATE_* variables that `accelerate launch --config_file ...` hands the processes.
The runs with several processes are in test_distributed.py.
"""

import dataclasses
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from transformers import Blip2ForConditionalGeneration, TrainingArguments

import altscale.strategies.launch
from altscale.config.adjust import adjust_training_args
from altscale.config.arguments import parse_args
from altscale.config.errors import ConfigError
from altscale.config.machine import Machine
from altscale.families import family_for, random_init_config
from altscale.families.blip2.layers import layer_class_names
from altscale.families.blip2.model import build_model
from altscale.models.build import build_quantization_config
from altscale.strategies.fsdp import configure_fsdp, share_tied_embeddings
from altscale.strategies.launch import FsdpPlan, LaunchPlan, launch_deepspeed_words, launch_problems, plan_launch
from recipes import train
from tests.ports import free_port
from tests.recipes.machines import CPU, FSDP_ON_CPU, H100, check

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "accelerate_configs"


def launch_env(config: str, *flags: str) -> dict[str, str]:
    """The ACCELERATE_* and FSDP_* variables `accelerate launch --config_file <config> <flags>` gives each process.

    Goes through accelerate's own launcher steps (`_validate_launch_command`, then the env preparation of the
    launcher it would pick), without starting anything.
    """
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

    args = launch_command_parser().parse_args(["--config_file", str(CONFIGS / config), *flags, "recipes/train.py"])
    args, defaults, mixed_precision_from_file = _validate_launch_command(args)
    if args.use_deepspeed:
        # as launch_command does before deepspeed_launcher (which itself needs deepspeed installed)
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mixed_precision_from_file else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        env = prepare_deepspeed_cmd_env(args)[1]
    elif args.use_fsdp or args.multi_gpu:
        env = prepare_multi_gpu_env(args)
    else:
        env = prepare_simple_launcher_cmd_env(args)[1]
    return {key: value for key, value in env.items() if key.startswith(("ACCELERATE_", "FSDP_"))}


@pytest.fixture
def launched(monkeypatch):
    """Sets a yaml's launch variables in this process, as if it had been started by `accelerate launch`, and
    returns the machine to check the launch on."""

    def set_env(config: str, *flags: str, processes: int = 4, fsdp_on_cpu: bool = True) -> Machine:
        for key, value in launch_env(config, *flags).items():
            monkeypatch.setenv(key, value)
        # The world size a launch would have, without starting a process group here.
        monkeypatch.setattr(TrainingArguments, "world_size", property(lambda self: processes))
        # This machine has no GPU: lift the CPU refusal (as launched.py does) unless the test is about it.
        return FSDP_ON_CPU if fsdp_on_cpu else CPU

    return set_env


def problems(args, machine: Machine = CPU) -> list[str]:
    """launch_problems of the launch this process's environment describes, planned from `args` as they are now."""
    return launch_problems(args, plan_launch(args), machine)


# ------------------------------------------------------------------ the launch files


def test_every_accelerate_config_loads_and_leaves_precision_to_the_recipe():
    from accelerate.commands.config.config_args import load_config_from_file

    for path in sorted(CONFIGS.glob("*.yaml")):
        config = load_config_from_file(str(path))
        raw = yaml.safe_load(path.read_text())
        assert path.read_text().startswith(f"# {path.stem}:"), path
        if config.distributed_type == "DEEPSPEED":
            # accelerate refuses a mixed_precision key beside a deepspeed_config_file
            assert "mixed_precision" not in raw, path
            assert (ROOT / config.deepspeed_config["deepspeed_config_file"]).is_file(), path
        else:
            assert raw["mixed_precision"] == "no", path


def test_fsdp4_shards_fully_with_fsdp2_layer_units_and_a_full_state_dict():
    env = launch_env("fsdp4.yaml")
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["FSDP_RESHARD_AFTER_FORWARD"] == "true"  # FULL_SHARD
    assert env["FSDP_AUTO_WRAP_POLICY"] == "TRANSFORMER_BASED_WRAP"
    assert "FSDP_TRANSFORMER_CLS_TO_WRAP" not in env  # read from the built model, per family
    assert env["FSDP_STATE_DICT_TYPE"] == "FULL_STATE_DICT" and env["FSDP_ACTIVATION_CHECKPOINTING"] == "false"
    assert env["ACCELERATE_MIXED_PRECISION"] == "no"


def test_the_deepspeed_configs_name_the_repos_ds_files():
    assert launch_env("zero2_offload4.yaml")["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == "ds_configs/zero2_offload.json"
    env = launch_env("zero3_offload4.yaml")
    assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == "ds_configs/zero3_offload.json"
    assert env["ACCELERATE_DEEPSPEED_ZERO3_INIT"] == "true" and env["ACCELERATE_MIXED_PRECISION"] == "no"


def test_the_two_machine_example_needs_the_main_machines_address():
    config = yaml.safe_load((CONFIGS / "ddp8-2machines.yaml").read_text())
    assert (config["num_machines"], config["num_processes"], config["main_process_ip"]) == (2, 8, None)
    env = launch_env("ddp8-2machines.yaml", "--machine_rank", "1", "--main_process_ip", "10.0.0.1")
    assert env["ACCELERATE_MIXED_PRECISION"] == "no"


@pytest.mark.parametrize("name, config", [("opt27-bf16-ddp4", "ddp4"), ("opt27-bf16-fsdp4", "fsdp4"),
                                          ("xxl-bf16-fsdp4", "fsdp4"), ("xxl-bf16-zero3-offload4", "zero3_offload4"),
                                          ("opt27-bf16-1gpu", "single")])
def test_a_multi_gpu_make_target_launches_with_the_config_its_name_ends_in(name, config):
    dry_run = subprocess.run(["make", "-n", name], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert f"--config_file accelerate_configs/{config}.yaml" in dry_run
    other = subprocess.run(["make", "-n", name, "ACCELERATE_CONFIG=accelerate_configs/ddp4.yaml"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout
    assert "--config_file accelerate_configs/ddp4.yaml" in other  # the command line still decides


# ------------------------------------------------------------------ what is read, and the adjustments


def test_a_plain_process_is_a_single_device_launch():
    plan = plan_launch(parse_args([]), environ={})
    assert (plan.strategy, plan.world_size, plan.mixed_precision, plan.fsdp) == ("single", 1, "no", None)
    assert (plan.checkpointing, plan.optimizer, plan.deepspeed, plan.zero_stage, plan.sharded) == (
        "none", "adamw_torch_fused", None, None, None)


def test_the_fsdp_launch_is_read_from_accelerates_variables(launched):
    launched("fsdp4.yaml")
    plan = plan_launch(parse_args([]))
    assert (plan.strategy, plan.world_size) == ("fsdp", 4)
    assert plan.fsdp == FsdpPlan(version=2, reshard_after_forward=True, auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                 transformer_cls_names_to_wrap=None, activation_checkpointing=False,
                                 state_dict_type="FULL_STATE_DICT", cpu_offload=False, cpu_ram_efficient_loading=False)
    assert plan.fsdp.to_record() == {
        "version": 2, "reshard_after_forward": True, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_cls_names_to_wrap": None, "activation_checkpointing": False, "state_dict_type": "FULL_STATE_DICT",
        "cpu_offload": False, "cpu_ram_efficient_loading": False}
    assert plan.sharded == "FSDP"


def test_under_fsdp_gradient_checkpointing_becomes_fsdps_activation_checkpointing(launched, capsys):
    launched("fsdp4.yaml")
    args = parse_args(["--gradient_checkpointing", "true"])
    plan = plan_launch(args)
    assert plan.checkpointing == "fsdp" and plan.fsdp.activation_checkpointing is True
    trainer_args, adjusted = adjust_training_args(args, plan)
    assert args.training.gradient_checkpointing is False and trainer_args.gradient_checkpointing is False
    assert adjusted["gradient_checkpointing"]["asked"] is True
    assert "using FSDP's activation checkpointing" in capsys.readouterr().out


def test_without_fsdp_gradient_checkpointing_stays(launched):
    launched("ddp4.yaml")
    args = parse_args(["--gradient_checkpointing", "true"])
    plan = plan_launch(args)
    assert (plan.strategy, plan.checkpointing, plan.fsdp) == ("ddp", "transformers", None)
    assert adjust_training_args(args, plan)[1] == {}
    assert args.training.gradient_checkpointing is True


@pytest.mark.parametrize("config, checkpointing, expected", [
    ("fsdp4.yaml", "true", "fsdp"), ("fsdp4.yaml", "false", "none"), ("ddp4.yaml", "true", "transformers"),
    ("ddp4.yaml", "false", "none"), ("single.yaml", "true", "transformers"), ("single.yaml", "false", "none")])
def test_the_plan_says_whose_activation_checkpointing_runs(launched, config, checkpointing, expected):
    launched(config, processes=1 if config == "single.yaml" else 4)
    plan = plan_launch(parse_args(["--gradient_checkpointing", checkpointing]))
    assert plan.checkpointing == expected
    if plan.fsdp is not None:  # FSDP's checkpoint wrapper is planned exactly when it is the one that runs
        assert plan.fsdp.activation_checkpointing is (expected == "fsdp")


def zero_plan(deepspeed, *words: str) -> LaunchPlan:
    args = parse_args(list(words))
    args.training.deepspeed = deepspeed  # set after parsing: deepspeed need not be installed
    return plan_launch(args, environ={})


def test_under_zero_offload_deepspeed_steps_its_own_optimizer_and_the_plan_says_so():
    plan = zero_plan("ds_configs/zero2_offload.json", "--optim", "sgd")
    assert (plan.strategy, plan.deepspeed, plan.zero_stage, plan.sharded) == (
        "deepspeed", "ds_configs/zero2_offload.json", 2, None)
    assert plan.optimizer == "DeepSpeed AdamW from the config's optimizer section (CPU Adam: offloaded)"
    zero3 = zero_plan("ds_configs/zero3_offload.json")
    assert (zero3.zero_stage, zero3.sharded) == (3, "ZeRO-3")
    assert zero3.optimizer == "DeepSpeed AdamW from the config's optimizer section (CPU Adam: offloaded)"
    # Without an optimizer section, an offloaded optimizer is DeepSpeed's CPU Adam; kept on the GPU, it is `optim`'s.
    offload = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    assert zero_plan(offload, "--optim", "sgd").optimizer == "DeepSpeedCPUAdam (the ZeRO config offloads the optimizer)"
    assert zero_plan({"zero_optimization": {"stage": 2}}, "--optim", "sgd").optimizer == "sgd"


def test_under_fsdp_an_elementwise_torch_optimizer_steps_the_local_shards(launched):
    launched("fsdp4.yaml")
    assert plan_launch(parse_args(["--optim", "adamw_torch_fused"])).optimizer == "ShardLocalAdamW"
    assert plan_launch(parse_args(["--optim", "sgd"])).optimizer == "ShardLocalSGD"
    # bitsandbytes' optimizers are not replaced: fsdp_problems refuses them
    assert plan_launch(parse_args(["--optim", "paged_adamw_8bit"])).optimizer == "paged_adamw_8bit"


def test_under_ddp_and_one_device_the_optimizer_is_the_recipes_optim(launched):
    assert plan_launch(parse_args(["--optim", "sgd"]), environ={}).optimizer == "sgd"
    launched("ddp4.yaml")
    plan = plan_launch(parse_args([]))
    assert (plan.strategy, plan.optimizer) == ("ddp", "adamw_torch_fused")
    assert plan_launch(parse_args(["--optim", "adamw_bnb_8bit"])).optimizer == "adamw_bnb_8bit"


def test_the_plan_is_frozen(launched):
    launched("fsdp4.yaml")
    plan = plan_launch(parse_args([]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.strategy = "ddp"
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.fsdp.activation_checkpointing = True
    # What the configure steps did goes into the record beside the plan, not into the plan
    record = plan.to_record({"fsdp": {"layer_units": 6}, "ddp": None})
    assert record["fsdp"]["layer_units"] == 6 and record["fsdp"]["version"] == 2 and "layer_units" not in vars(plan.fsdp)
    assert (record["strategy"], record["world_size"], record["ddp"]) == ("fsdp", 4, None)


def test_the_labs_ddp_recipe_scales_2e5_to_8e5_on_four_gpus(launched, capsys):
    launched("ddp4.yaml", processes=4)
    args = parse_args([str(ROOT / "recipes/blip2/opt27-bf16-ddp4.yaml")])
    adjusted = adjust_training_args(args, plan_launch(args))[1]["learning_rate"]
    assert (adjusted["asked"], args.training.learning_rate) == (2e-5, pytest.approx(8e-5))
    assert capsys.readouterr().out.count("learning_rate: asked 2e-05, using 8e-05") == 1


def test_the_one_gpu_baseline_keeps_2e5():
    args = parse_args([str(ROOT / "recipes/blip2/opt27-bf16-1gpu.yaml")])
    adjust_training_args(args, plan_launch(args, environ={}))
    assert args.training.learning_rate == pytest.approx(2e-5)


def test_each_adjustment_is_recorded_with_asked_used_and_why(launched, capsys):
    launched("fsdp4.yaml", processes=2)
    args = parse_args(["--gradient_checkpointing", "true", "--learning_rate", "1e-4", "--lr_scaling", "linear",
                       "--lr_reference_batch_size", "4", "--per_device_train_batch_size", "4", "--push_to_hub", "true",
                       "--hub_model_id", "me/x"])
    trainer_args, changes = adjust_training_args(args, plan_launch(args))
    assert sorted(changes) == ["gradient_checkpointing", "learning_rate", "push_to_hub"]
    assert all(set(change) == {"asked", "used", "why"} and change["why"] for change in changes.values())
    assert (changes["learning_rate"]["asked"], changes["learning_rate"]["used"]) == (1e-4, pytest.approx(2e-4))
    assert "global batch 8" in changes["learning_rate"]["why"]  # 4 per process x 2 processes, against 4
    assert changes["gradient_checkpointing"]["asked"] is True and changes["push_to_hub"]["asked"] is True
    # The Trainer's copy does not push; the recipe's args keep the user's push_to_hub, for publish_run
    assert trainer_args is not args.training and trainer_args.push_to_hub is False and args.training.push_to_hub is True
    assert trainer_args.learning_rate == args.training.learning_rate == pytest.approx(2e-4)
    assert trainer_args.gradient_checkpointing is args.training.gradient_checkpointing is False
    out = capsys.readouterr().out
    assert out.count("learning_rate: asked 0.0001, using 0.0002") == 1 and out.count("gradient_checkpointing:") == 1


def test_nothing_to_adjust_leaves_the_recipes_args_as_the_trainers():
    args = parse_args(["--gradient_checkpointing", "true"])
    trainer_args, changes = adjust_training_args(args, plan_launch(args, environ={}))
    assert changes == {} and trainer_args is args.training and args.training.gradient_checkpointing is True


def test_a_deepspeed_launch_hands_its_file_to_the_recipes_deepspeed_key(launched):
    launched("zero3_offload4.yaml")
    assert launch_deepspeed_words(["--output_dir", "x"]) == ["--deepspeed", "ds_configs/zero3_offload.json"]
    assert launch_deepspeed_words(["--deepspeed", "ds_configs/zero3_offload.json"]) == []  # the same file: fine


def test_qlora_under_fsdp_stores_its_4bit_weights_in_the_models_dtype(launched):
    assert plan_launch(parse_args([]), environ={}).quant_storage(torch.bfloat16) == torch.uint8
    launched("fsdp4.yaml")
    assert plan_launch(parse_args([])).quant_storage(torch.bfloat16) == torch.bfloat16
    config = build_quantization_config(True, True, compute_dtype=torch.bfloat16, quant_storage=torch.bfloat16)
    assert config.bnb_4bit_quant_storage == torch.bfloat16


# ------------------------------------------------------------------ the layers FSDP shards, per family


@pytest.mark.parametrize("preset, language_layer", [("blip2-tiny-opt", "OPTDecoderLayer"), ("blip2-tiny-t5", "T5Block"),
                                                    ("blip2-opt-2.7b", "OPTDecoderLayer"),
                                                    ("blip2-flan-t5-xxl", "T5Block")])
def test_the_units_are_each_towers_layer_class(preset, language_layer):
    with torch.device("meta"):  # the published sizes, without their memory
        model = Blip2ForConditionalGeneration._from_config(random_init_config(preset))
    assert layer_class_names(model) == ["Blip2EncoderLayer", "Blip2QFormerLayer", language_layer]


def test_accelerates_fallback_the_models_no_split_modules_does_not_fit_blip2():
    """Why models/layers.py exists: if transformers fixes _no_split_modules, this fails and the fallback may do."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

    model, _, _ = build_model("blip2-tiny-opt")
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="TRANSFORMER_BASED_WRAP")
    with pytest.raises(ValueError, match="Could not find the transformer layer class Blip2TextEmbeddings"):
        fsdp2_prepare_auto_wrap_policy(plugin, model)


def test_t5s_tied_embedding_modules_become_one_module():
    model, _, _ = build_model("blip2-tiny-t5")
    language = model.language_model
    assert language.encoder.embed_tokens is not language.shared  # transformers 5: separate modules, one weight
    assert share_tied_embeddings(language) == ["encoder.embed_tokens", "decoder.embed_tokens"]
    assert language.encoder.embed_tokens is language.shared and language.decoder.embed_tokens is language.shared
    opt, _, _ = build_model("blip2-tiny-opt")
    assert share_tied_embeddings(opt.language_model) == []


def fsdp_trainer(model, args=None, **plugin_args):
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="TRANSFORMER_BASED_WRAP", **plugin_args)
    return SimpleNamespace(model=model, args=args, optimizer_cls_and_kwargs=None,
                           accelerator=SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin)))


@pytest.fixture
def one_rank_group():
    """A process group of this process alone: fully_shard needs one, as every FSDP launch has."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_configure_fsdp_shards_each_towers_layers_and_turns_the_kv_cache_off_for_checkpointing(launched,
                                                                                              one_rank_group):
    from torch.distributed.fsdp import FSDPModule

    from altscale.strategies.sharded_optim import ShardLocalAdamW

    launched("fsdp4.yaml")
    args = parse_args(["--gradient_checkpointing", "true", "--use_cpu", "true"])
    plan = plan_launch(args)
    trainer_args, _ = adjust_training_args(args, plan)
    model, _, _ = build_model("blip2-tiny-t5")
    trainer = fsdp_trainer(model, trainer_args)
    done = configure_fsdp(trainer, plan, family_for("blip2-tiny-t5"), layers_per_unit=2)
    plugin = trainer.accelerator.state.fsdp_plugin
    assert done["transformer_cls_names_to_wrap"] == ["Blip2EncoderLayer", "Blip2QFormerLayer", "T5Block"]
    # The layers are checkpointed and sharded here, two to a unit: vision, Q-Former, T5 encoder, T5 decoder
    assert {key: done[key] for key in ("layer_units", "layers_per_unit", "checkpointed_layers")} == {
        "layer_units": 4, "layers_per_unit": 2, "checkpointed_layers": 8}
    wrappers = [m for m in model.modules() if type(m).__name__.endswith("CheckpointWrapper")]
    assert len(wrappers) == 8 and all(isinstance(m, FSDPModule) for m in wrappers)
    assert len({id(m._get_fsdp_state()) for m in wrappers}) == 4
    # ... so accelerate, which shards the rest, neither wraps nor checkpoints them again
    assert plugin.auto_wrap_policy is None and plugin.activation_checkpointing is False
    assert done["optimizer"] == "ShardLocalAdamW" and trainer.optimizer_cls_and_kwargs[0] is ShardLocalAdamW
    # T5's stacks carry their own copies of the config: every one must stop caching
    configs = {id(m.config): m.config for m in model.language_model.modules() if hasattr(m, "config")}
    assert len(configs) >= 3 and all(config.use_cache is False for config in configs.values())
    assert done["weights_broadcast_from_rank0"] is False  # one process: nothing to compare
    # The plan itself is left as planned: what was done is returned, for the record
    assert plan.fsdp.transformer_cls_names_to_wrap is None and plan.to_record({"fsdp": done})["fsdp"]["layer_units"] == 4


def test_configure_fsdp_does_nothing_without_fsdp():
    plan = plan_launch(parse_args([]), environ={})
    model, _, _ = build_model("blip2-tiny-opt")
    assert configure_fsdp(fsdp_trainer(model), plan, family_for("blip2-tiny-opt")) == {}


def test_a_layer_class_the_model_lacks_is_one_message(launched):
    launched("fsdp4.yaml", "--fsdp_transformer_layer_cls_to_wrap", "T5Block")
    plan = plan_launch(parse_args([]))
    assert plan.fsdp.transformer_cls_names_to_wrap == ("T5Block",)
    model, _, _ = build_model("blip2-tiny-opt")
    with pytest.raises(ConfigError, match="fsdp_transformer_layer_cls_to_wrap: T5Block not in this model, whose "
                                          "layers are Blip2EncoderLayer, Blip2QFormerLayer, OPTDecoderLayer"):
        configure_fsdp(fsdp_trainer(model, transformer_cls_names_to_wrap=["T5Block"]), plan,
                       family_for("blip2-tiny-opt"))


# ------------------------------------------------------------------ every refusal, from its launch


LAUNCH_MISTAKES = {
    "yaml precision": (("ddp4.yaml", "--mixed_precision", "bf16"), {}, [],
                       "mixed_precision: bf16 in the accelerate config contradicts precision: 32-true"),
    "fsdp, one process": (("fsdp4.yaml",), {"processes": 1}, [], "FSDP with one process (world size 1) shards nothing"),
    "fsdp on the cpu": (("fsdp4.yaml",), {"fsdp_on_cpu": False}, ["--use_cpu", "true"],
                        "FSDP on the CPU: accelerate applies FSDP on GPUs only"),
    "fsdp1": (("fsdp4.yaml", "--fsdp_version", "1"), {}, [], "fsdp_version: 1: FSDP1 is deprecated"),
    "fsdp, no wrap": (("fsdp4.yaml", "--fsdp_auto_wrap_policy", "NO_WRAP"), {}, [],
                      "fsdp_auto_wrap_policy: NO_WRAP makes the whole model one unit"),
    "fsdp, grouped by size": (("fsdp4.yaml", "--fsdp_auto_wrap_policy", "SIZE_BASED_WRAP"), {},
                              ["--fsdp_layers_per_unit", "4"],
                              "fsdp_layers_per_unit: 4 groups the layers that TRANSFORMER_BASED_WRAP finds"),
    "fsdp, sharded save": (("fsdp4.yaml", "--fsdp_state_dict_type", "SHARDED_STATE_DICT"), {}, [],
                           "fsdp_state_dict_type: SHARDED_STATE_DICT saves a distributed checkpoint"),
    "fsdp, rank-0 captions": (("fsdp4.yaml",), {}, ["--num_sample_captions", "8"],
                              "num_sample_captions: 8 under FSDP: rank 0 writes these captions alone"),
    "fsdp, caption metrics": (("fsdp4.yaml",), {}, ["--num_sample_captions", "0", "--caption_metrics_samples", "4"],
                              "caption_metrics_samples: 4 under FSDP: rank 0 writes these captions alone"),
}


@pytest.mark.parametrize("case", sorted(LAUNCH_MISTAKES))
def test_launch_mistakes_exit_2_before_any_weight_is_loaded(case, launched, tmp_path, monkeypatch, capsys):
    launch, options, argv, expected = LAUNCH_MISTAKES[case]
    machine = launched(*launch, **options)
    monkeypatch.setattr(train, "build_model", lambda *a, **k: pytest.fail("built a model after a launch mistake"))
    code = train.run(["--output_dir", str(tmp_path / "out"), "--num_sample_captions", "0", *argv], machine)
    err = capsys.readouterr().err
    assert code == train.EXIT_USER_ERROR and err.startswith("error: ") and expected in err, err


def test_a_sharded_save_is_fine_when_nothing_is_saved(launched):
    machine = launched("fsdp4.yaml", "--fsdp_state_dict_type", "SHARDED_STATE_DICT")
    assert problems(parse_args(["--save_model", "false", "--num_sample_captions", "0"]), machine) == []


def test_fsdp_on_gpus_is_fine_and_fsdp_with_use_cpu_is_refused_there_too(launched):
    launched("fsdp4.yaml", fsdp_on_cpu=False)
    gpus = Machine(gpus=(H100,) * 4)
    assert problems(parse_args(["--num_sample_captions", "0"]), gpus) == []
    (problem,) = problems(parse_args(["--num_sample_captions", "0", "--use_cpu", "true"]), gpus)
    assert problem.startswith("FSDP on the CPU: accelerate applies FSDP on GPUs only")


def test_fsdp_beside_a_deepspeed_config_is_refused(launched):
    machine = launched("fsdp4.yaml")
    args = parse_args(["--num_sample_captions", "0"])
    args.training.deepspeed = "ds_configs/zero2_offload.json"  # set after parsing: deepspeed need not be installed
    assert problems(args, machine) == [
        "fsdp and deepspeed: ds_configs/zero2_offload.json both shard the model; launch with one of them "
        "(accelerate_configs/fsdp4.yaml, or a DeepSpeed config with accelerate_configs/single.yaml)"]


def test_a_yaml_precision_that_agrees_with_the_recipe_is_fine(launched):
    machine = launched("ddp4.yaml", "--mixed_precision", "bf16")
    assert problems(parse_args(["--precision", "bf16-mixed", "--use_cpu", "true"]), machine) == []


def test_a_deepspeed_launch_without_deepspeed_installed_names_the_launch_files_config(launched, monkeypatch):
    launched("zero3_offload4.yaml")
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "deepspeed" else object())
    with pytest.raises(ConfigError, match="deepspeed: ds_configs/zero3_offload.json needs the deepspeed package"):
        parse_args([])


def test_a_deepspeed_launch_and_another_file_in_the_recipe_conflict(launched):
    launched("zero3_offload4.yaml")
    with pytest.raises(ConfigError, match="deepspeed: ds_configs/zero2_offload.json in the recipe, but the accelerate "
                                          "config names ds_configs/zero3_offload.json"):
        launch_deepspeed_words(["--deepspeed", "ds_configs/zero2_offload.json"])


def test_a_deepspeed_launch_without_a_file_is_refused(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.delenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", raising=False)
    with pytest.raises(ConfigError, match="distributed_type: DEEPSPEED without a deepspeed_config_file"):
        launch_deepspeed_words([])


def test_every_recipe_still_passes_under_its_own_launch(launched):
    machine = launched("fsdp4.yaml")
    for name in ("opt27-bf16-fsdp4", "xxl-bf16-fsdp4"):
        check(parse_args([str(ROOT / f"recipes/blip2/{name}.yaml"), "--overwrite_output_dir", "true"]), machine)


def test_under_zero3_rank0_captions_are_refused_too():
    args = parse_args([])
    args.training.deepspeed = "ds_configs/zero3_offload.json"  # set after parsing: deepspeed need not be installed
    assert [p.split(":")[0] for p in problems(args)] == ["num_sample_captions"]  # its default is 8
    args.training.deepspeed = "ds_configs/zero2_offload.json"  # ZeRO-2 keeps every weight on every rank
    assert problems(args) == []


def test_one_process_seeing_several_gpus_is_refused_before_the_trainer_picks_dataparallel(tmp_path):
    # seen on a 4-GPU machine: a plain one-process run got torch.nn.DataParallel and crashed mid-forward.
    # The machine's GPUs are those this process sees (CUDA_VISIBLE_DEVICES applied), which the Trainer's n_gpu counts.
    args = parse_args(["recipes/blip2/tiny-opt-demo.yaml", "--output_dir", str(tmp_path / "out")])
    plan = plan_launch(args, environ={})
    found = launch_problems(args, plan, Machine(gpus=(H100,) * 4))
    assert any("one process sees 4 GPUs" in p and "CUDA_VISIBLE_DEVICES=0" in p for p in found)
    assert not any("GPUs" in p for p in launch_problems(args, plan, Machine(gpus=(H100,))))
    on_cpu = parse_args(["recipes/blip2/tiny-opt-demo.yaml", "--output_dir", str(tmp_path / "out"), "--use_cpu", "true"])
    assert not any("GPUs" in p for p in launch_problems(on_cpu, plan_launch(on_cpu, environ={}), Machine(gpus=(H100,) * 4)))


def test_single_yaml_pins_one_gpu():
    env = launch_env("single.yaml")
    assert yaml.safe_load((CONFIGS / "single.yaml").read_text())["gpu_ids"] == "0"
    assert env["ACCELERATE_USE_CPU"] == "False"
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    args = launch_command_parser().parse_args(["--config_file", str(CONFIGS / "single.yaml"), "recipes/train.py"])
    assert _validate_launch_command(args)[0].gpu_ids == "0"  # what the launcher turns into CUDA_VISIBLE_DEVICES


def test_a_bitsandbytes_optimizer_under_fsdp_is_refused(launched):
    machine = launched("fsdp4.yaml")
    found = problems(parse_args(["--optim", "paged_adamw_8bit", "--num_sample_captions", "0"]), machine)
    assert found == ["optim: paged_adamw_8bit under FSDP: bitsandbytes' optimizer kernels take whole tensors, not "
                        "FSDP2's sharded DTensors (NotImplementedError: no sharding strategy registered, "
                        "docs/compatibility.md); use optim: adamw_torch_fused, or 8-bit Adam under "
                        "accelerate_configs/ddp4.yaml"]


def test_the_bitsandbytes_optimizers_are_those_transformers_builds_with_bitsandbytes():
    from transformers.trainer_optimizer import _BITSANDBYTES_OPTIMIZERS

    assert altscale.strategies.launch.BITSANDBYTES_OPTIMS == {name.value for name in _BITSANDBYTES_OPTIMIZERS}
