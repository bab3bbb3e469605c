"""How this process was launched, and every decision that follows from it, made once: the `LaunchPlan`.

One GPU, DDP, FSDP and ZeRO are launch choices (accelerate_configs/*.yaml), never code paths of the recipe.
`accelerate launch` hands its config to the processes as environment variables (ACCELERATE_USE_FSDP, FSDP_*,
ACCELERATE_USE_DEEPSPEED, ACCELERATE_DEEPSPEED_CONFIG_FILE, ACCELERATE_MIXED_PRECISION), which the Trainer's
Accelerator reads; a recipe may also say `fsdp`/`fsdp_config` or `deepspeed` (TrainingArguments keys). Both routes
end in the same plugin objects. `plan_launch` reads them once, before the model loads, and decides how FSDP wraps,
whose activation checkpointing runs, the precision and what the optimizer really is. The plan is frozen and passed
explicitly: the strategies' `configure_*` steps read it and return what they did, for the run record.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from altscale.config.errors import ConfigError

FSDP_CONFIG = "accelerate_configs/fsdp4.yaml"
DEFAULT_OPTIM = "adamw_torch_fused"
# transformers' optim values that step a bitsandbytes optimizer (8- or 32-bit state: small tensors take its 32-bit
# kernel either way). The compatibility matrix ran adamw_bnb_8bit under FSDP2: every cell failed in the first step.
BITSANDBYTES_OPTIMS = frozenset({
    "adamw_bnb_8bit", "adamw_8bit", "ademamix", "ademamix_8bit", "lion_8bit", "lion_32bit", "paged_adamw_32bit",
    "paged_adamw_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit", "paged_lion_32bit", "paged_lion_8bit",
    "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
})


@dataclass(frozen=True)
class FsdpPlan:
    """The FSDP plugin's settings as the Trainer will build them, and how this recipe shards with them."""

    version: int
    reshard_after_forward: bool | None = None  # true: FULL_SHARD, false: SHARD_GRAD_OP
    auto_wrap_policy: str | None = None  # TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP
    transformer_cls_names_to_wrap: tuple[str, ...] | None = None  # None: the family names the layers
    activation_checkpointing: bool = False  # FSDP's checkpoint wrapper (the recipe's gradient_checkpointing, routed)
    state_dict_type: str | None = None
    cpu_offload: bool = False
    cpu_ram_efficient_loading: bool = False

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
        if record["transformer_cls_names_to_wrap"] is not None:
            record["transformer_cls_names_to_wrap"] = list(record["transformer_cls_names_to_wrap"])
        return record if self.version == 2 else {"version": self.version}


@dataclass(frozen=True)
class LaunchPlan:
    """What this process will run, decided before the model loads."""

    strategy: str  # single, ddp, fsdp or deepspeed
    world_size: int
    mixed_precision: str  # the accelerate config's `mixed_precision` ("no" without one)
    precision: str  # the recipe's: 32-true, bf16-true, bf16-mixed or fp16-mixed
    deepspeed: str | None = None  # the DeepSpeed config file, from the recipe or the accelerate config
    zero_stage: int | None = None
    fsdp: FsdpPlan | None = None
    checkpointing: str = "none"  # whose activation checkpointing runs: none, transformers or fsdp
    optimizer: str = DEFAULT_OPTIM  # what steps the weights: the `optim` name, or who replaces it and why

    @property
    def sharded(self) -> str | None:
        """'FSDP' or 'ZeRO-3' when every forward needs every rank (the model is split across them)."""
        return "FSDP" if self.fsdp is not None else "ZeRO-3" if self.zero_stage == 3 else None

    def quant_storage(self, dtype: torch.dtype) -> torch.dtype:
        """Storage dtype of QLoRA's packed 4-bit weights: under FSDP, the model's dtype (bf16 under bf16-true).

        FSDP2 shards floating-point parameters only: with bitsandbytes' default uint8 storage, accelerate leaves every
        4-bit weight out of fully_shard, whole on every GPU (tests/recipes/test_distributed.py checks the bf16 case).
        """
        return dtype if self.fsdp is not None else torch.uint8

    def to_record(self, done: dict[str, dict] | None = None) -> dict[str, Any]:
        """The run record's `config.launch`: what was read, plus what the configure steps did (`done`)."""
        done = done or {}
        fsdp = None if self.fsdp is None else self.fsdp.to_record() | done.get("fsdp", {})
        return {"strategy": self.strategy, "world_size": self.world_size, "mixed_precision": self.mixed_precision,
                "deepspeed": self.deepspeed, "fsdp": fsdp, "ddp": done.get("ddp")}


def _env_true(name: str, environ) -> bool:
    return environ.get(name, "false").lower() == "true"


def plan_launch(args, environ=os.environ) -> LaunchPlan:
    """The launch of this process and what follows from it: strategy, world size, FSDP settings, checkpointing,
    optimizer. FSDP settings are read from the plugin the Trainer will build (transformers' `fsdp_plugin_args` from
    the recipe's `fsdp_config`, else accelerate's FSDP_* variables), so what is checked is what will run.
    """
    training = args.training
    fsdp_on = bool(training.fsdp) or _env_true("ACCELERATE_USE_FSDP", environ)
    deepspeed = training.deepspeed if isinstance(training.deepspeed, str) else None
    if training.deepspeed:
        strategy = "deepspeed"
    elif fsdp_on:
        strategy = "fsdp"
    else:
        strategy = "ddp" if training.world_size > 1 else "single"
    checkpointing = "none"
    if training.gradient_checkpointing:
        # transformers' checkpointing under FSDP "introduces a redundant AllGather in the backward pass" (its own
        # warning, transformers issue #30404), and the Trainer refuses it beside fsdp_activation_checkpointing.
        # FSDP's checkpoint wrapper recomputes each layer inside its gathered unit (config/adjust.py records it).
        checkpointing = "fsdp" if fsdp_on else "transformers"
    fsdp = read_fsdp(training, environ, activation_checkpointing=checkpointing == "fsdp") if fsdp_on else None
    zero = deepspeed_settings(training.deepspeed)
    return LaunchPlan(
        strategy=strategy,
        world_size=training.world_size,
        mixed_precision=environ.get("ACCELERATE_MIXED_PRECISION", "no"),
        precision=args.strategy.precision,
        deepspeed=deepspeed,
        zero_stage=zero.get("zero_optimization", {}).get("stage") if zero else None,
        fsdp=fsdp,
        checkpointing=checkpointing,
        optimizer=effective_optimizer(training, zero, fsdp),
    )


def read_fsdp(training, environ, activation_checkpointing: bool) -> FsdpPlan:
    plugin_args = training.fsdp_plugin_args
    version = int(plugin_args["fsdp_version"] if plugin_args else environ.get("FSDP_VERSION", "1"))
    if version != 2:
        return FsdpPlan(version=version)  # refused by fsdp_problems; FSDP1's plugin wants a GPU just to be built
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

    plugin = FullyShardedDataParallelPlugin(**plugin_args) if plugin_args else FullyShardedDataParallelPlugin()
    wrap = {transformer_auto_wrap_policy: "TRANSFORMER_BASED_WRAP", size_based_auto_wrap_policy: "SIZE_BASED_WRAP"}
    names = plugin.transformer_cls_names_to_wrap
    return FsdpPlan(
        version=version,
        reshard_after_forward=plugin.reshard_after_forward,
        auto_wrap_policy=wrap.get(plugin.auto_wrap_policy, "NO_WRAP"),
        transformer_cls_names_to_wrap=tuple(names) if names is not None else None,
        activation_checkpointing=activation_checkpointing or bool(plugin.activation_checkpointing),
        state_dict_type=plugin.state_dict_type.name,
        cpu_offload=isinstance(plugin.cpu_offload, CPUOffloadPolicy),
        cpu_ram_efficient_loading=bool(plugin.cpu_ram_efficient_loading),
    )


def deepspeed_settings(deepspeed) -> dict | None:
    """The DeepSpeed config as a dict (the recipe's file or inline dict); None without one or if the file is
    missing (strategies/deepspeed.py names a missing file)."""
    if isinstance(deepspeed, dict):
        return deepspeed
    if not deepspeed or not Path(deepspeed).is_file():
        return None
    return json.loads(Path(deepspeed).read_text())


def optim_name(training) -> str:
    return str(getattr(training.optim, "value", training.optim))


def effective_optimizer(training, zero: dict | None, fsdp: FsdpPlan | None) -> str:
    """What will step the weights. accelerate hands DeepSpeed the optimizer, and DeepSpeed replaces it with its own
    when its config has an optimizer section, or with its CPU Adam when the optimizer is offloaded; under FSDP an
    elementwise torch optimizer steps each rank's local shards (strategies/fsdp.py step_local_shards)."""
    optim = optim_name(training)
    if zero is not None:
        offloaded = (zero.get("zero_optimization", {}).get("offload_optimizer") or {}).get("device") == "cpu"
        if "optimizer" in zero:
            kind = zero["optimizer"].get("type", "?")
            return f"DeepSpeed {kind} from the config's optimizer section" + (" (CPU Adam: offloaded)" if offloaded else "")
        return "DeepSpeedCPUAdam (the ZeRO config offloads the optimizer)" if offloaded else optim
    if fsdp is not None and fsdp.version == 2 and optim not in BITSANDBYTES_OPTIMS:
        from transformers import Trainer

        from altscale.strategies.sharded_optim import shard_local_class

        local = shard_local_class(Trainer.get_optimizer_cls_and_kwargs(training)[0])
        if local is not None:
            return local.__name__  # the same elementwise update, on each rank's local shards
        return f"{optim} on the DTensors (not elementwise)"
    return optim


def implied_mixed_precision(training) -> str:
    """The accelerate `mixed_precision` that the recipe's precision sets (through its bf16/fp16 flags)."""
    return "bf16" if training.bf16 else "fp16" if training.fp16 else "no"


def launch_deepspeed_words(words: list[str], environ=os.environ) -> list[str]:
    """The accelerate config's DeepSpeed file as the recipe's `deepspeed` key, so that both launches take the
    Trainer's one DeepSpeed path (its "auto" values, precision_flags' bf16 mode, the checks of deepspeed_problems).
    """
    if not _env_true("ACCELERATE_USE_DEEPSPEED", environ):
        return []
    launched = environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
    if launched == "none":
        raise ConfigError("accelerate config: distributed_type: DEEPSPEED without a deepspeed_config_file; name one of "
                          "ds_configs/*.json there (as accelerate_configs/zero3_offload4.yaml does)")
    asked = last_value(words, "--deepspeed")
    if asked is None:
        return ["--deepspeed", launched]
    if Path(asked).resolve() != Path(launched).resolve():
        raise ConfigError(f"deepspeed: {asked} in the recipe, but the accelerate config names {launched}; keep one: "
                          "drop the recipe's deepspeed key, or launch with accelerate_configs/single.yaml")
    return []


def last_value(words: list[str], flag: str) -> str | None:
    """The value after the last `flag` in command-line words (the one argparse keeps), or None."""
    if flag not in words:
        return None
    at = len(words) - 1 - words[::-1].index(flag)
    return words[at + 1] if at + 1 < len(words) else None


def launch_problems(args, plan: LaunchPlan, machine) -> list[str]:
    """Launches that cannot run as asked, each with the fix; checked before any weight is loaded."""
    from altscale.strategies.fsdp import fsdp_problems

    training = args.training
    problems = []
    implied = implied_mixed_precision(training)
    if plan.mixed_precision not in ("no", implied):
        # transformers takes ACCELERATE_MIXED_PRECISION whenever the recipe sets neither bf16 nor fp16: a yaml
        # saying bf16 would autocast a 32-true recipe, and make FSDP upcast a bf16-true model to fp32.
        problems.append(
            f"mixed_precision: {plan.mixed_precision} in the accelerate config contradicts precision: "
            f"{args.strategy.precision}; the recipe's precision decides: set mixed_precision: 'no' in the accelerate "
            "config (as accelerate_configs/*.yaml do)"
        )
    if plan.fsdp is not None:
        problems += fsdp_problems(args, plan, machine)
    visible = 0 if training.use_cpu else len(machine.gpus)  # what the Trainer's n_gpu will count
    if plan.world_size == 1 and visible > 1:
        # The Trainer wraps a single process that sees several GPUs in torch.nn.DataParallel, whose replicas then
        # meet inputs on another GPU (seen on a 4-GPU machine: "found at least two devices, cuda:3 and cuda:0").
        problems.append(
            f"one process sees {visible} GPUs, and the Trainer would split each batch over them with "
            "torch.nn.DataParallel, which this recipe does not run; use one GPU (CUDA_VISIBLE_DEVICES=0, or "
            "accelerate_configs/single.yaml, which pins GPU 0) or all of them with one process each "
            "(accelerate_configs/ddp4.yaml)"
        )
    problems += rank0_generation_problems(args, plan)
    return problems


def rank0_generation_problems(args, plan: LaunchPlan) -> list[str]:
    """Captions written by rank 0 alone (after training, and at each evaluation) need the whole model on rank 0.

    Under FSDP or ZeRO-3 every forward all-gathers from every rank, so rank 0 would wait for ranks that have moved
    on (on the CPU test, FSDP's gather fails once rank 1 exits; over NCCL it waits for the collective timeout).
    """
    asked = {key: getattr(args.strategy, key) for key in ("num_sample_captions", "caption_metrics_samples")}
    return [f"{key}: {value} under {plan.sharded}: rank 0 writes these captions alone, but a sharded model needs every "
            f"rank in each forward; set {key}: 0 and caption the saved model with recipes/generate.py"
            for key, value in asked.items() if plan.sharded and value]
