"""How this process was launched, and what that means for the recipe: the one helper that asks.

One GPU, DDP, FSDP and ZeRO are launch choices (accelerate_configs/*.yaml), never code paths of the recipe.
`accelerate launch` hands its config to the processes as environment variables (ACCELERATE_USE_FSDP, FSDP_*,
ACCELERATE_USE_DEEPSPEED, ACCELERATE_DEEPSPEED_CONFIG_FILE, ACCELERATE_MIXED_PRECISION), which the Trainer's
Accelerator reads; a recipe may also say `fsdp`/`fsdp_config` or `deepspeed` (TrainingArguments keys). Both
routes end in the same plugin objects; this module reads them once (`read_launch`), refuses what cannot run
(`launch_problems`), makes the one adjustment (`route_checkpointing`), and finishes the FSDP setup that needs
the built model (`configure_fsdp`). What was read and done goes into the run record as `config.launch`.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from altscale.config.errors import ConfigError

FSDP_CONFIG = "accelerate_configs/fsdp4.yaml"
# accelerate 1.15 turns FSDP on only for accelerator backends (AcceleratorState: MULTI_GPU, MULTI_XPU, ...): with
# use_cpu the same launch silently trains plain DDP. The CPU tests lift both restrictions at once
# (tests/recipes/launched.py) to run accelerate's real FSDP2 path over gloo.
ACCELERATE_FSDP_ON_CPU = False
# transformers' optim values that step a bitsandbytes optimizer (8- or 32-bit state: small tensors take its 32-bit
# kernel either way). The compatibility matrix ran adamw_bnb_8bit under FSDP2: every cell failed in the first step.
BITSANDBYTES_OPTIMS = frozenset({
    "adamw_bnb_8bit", "adamw_8bit", "ademamix", "ademamix_8bit", "lion_8bit", "lion_32bit", "paged_adamw_32bit",
    "paged_adamw_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit", "paged_lion_32bit", "paged_lion_8bit",
    "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
})


@dataclass
class Launch:
    """What the launch asks for, as the Trainer will see it."""

    strategy: str  # single, ddp, fsdp or deepspeed
    world_size: int
    mixed_precision: str  # the accelerate config's `mixed_precision` ("no" without one)
    deepspeed: str | None = None  # the DeepSpeed config file, from the recipe or the accelerate config
    fsdp: dict[str, Any] | None = None  # the FSDP plugin's settings; configure_fsdp adds what it chose
    ddp: dict[str, Any] | None = None  # DDP's settings as configure_ddp left them

    def to_record(self) -> dict[str, Any]:
        return asdict(self)


def _env_true(name: str, environ=os.environ) -> bool:
    return environ.get(name, "false").lower() == "true"


def read_launch(training, environ=os.environ) -> Launch:
    """The launch of this process: strategy, world size, the accelerate config's precision, FSDP settings.

    FSDP settings are read from the plugin the Trainer will build (transformers' `fsdp_plugin_args` from the
    recipe's `fsdp_config`, else accelerate's FSDP_* variables), so what is checked is what will run.
    """
    fsdp_on = bool(training.fsdp) or _env_true("ACCELERATE_USE_FSDP", environ)
    deepspeed = training.deepspeed if isinstance(training.deepspeed, str) else None
    if training.deepspeed:
        strategy = "deepspeed"
    elif fsdp_on:
        strategy = "fsdp"
    else:
        strategy = "ddp" if training.world_size > 1 else "single"
    return Launch(
        strategy=strategy,
        world_size=training.world_size,
        mixed_precision=environ.get("ACCELERATE_MIXED_PRECISION", "no"),
        deepspeed=deepspeed,
        fsdp=_fsdp_settings(training, environ) if fsdp_on else None,
    )


def _fsdp_settings(training, environ) -> dict[str, Any]:
    plugin_args = training.fsdp_plugin_args
    version = int(plugin_args["fsdp_version"] if plugin_args else environ.get("FSDP_VERSION", "1"))
    if version != 2:
        return {"version": version}  # refused by launch_problems; FSDP1's plugin wants a GPU just to be built
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

    plugin = FullyShardedDataParallelPlugin(**plugin_args) if plugin_args else FullyShardedDataParallelPlugin()
    wrap = {transformer_auto_wrap_policy: "TRANSFORMER_BASED_WRAP", size_based_auto_wrap_policy: "SIZE_BASED_WRAP"}
    return {
        "version": version,
        "reshard_after_forward": plugin.reshard_after_forward,  # true: FULL_SHARD, false: SHARD_GRAD_OP
        "auto_wrap_policy": wrap.get(plugin.auto_wrap_policy, "NO_WRAP"),
        "transformer_cls_names_to_wrap": plugin.transformer_cls_names_to_wrap,
        "activation_checkpointing": bool(plugin.activation_checkpointing),
        "state_dict_type": plugin.state_dict_type.name,
        "cpu_offload": isinstance(plugin.cpu_offload, CPUOffloadPolicy),
        "cpu_ram_efficient_loading": bool(plugin.cpu_ram_efficient_loading),
    }


def implied_mixed_precision(training) -> str:
    """The accelerate `mixed_precision` that the recipe's precision sets (through its bf16/fp16 flags)."""
    return "bf16" if training.bf16 else "fp16" if training.fp16 else "no"


def launch_problems(args) -> list[str]:
    """Launches that cannot run as asked, each with the fix; checked before any weight is loaded."""
    training, launch = args.training, read_launch(args.training)
    problems = []
    implied = implied_mixed_precision(training)
    if launch.mixed_precision not in ("no", implied):
        # transformers takes ACCELERATE_MIXED_PRECISION whenever the recipe sets neither bf16 nor fp16: a yaml
        # saying bf16 would autocast a 32-true recipe, and make FSDP upcast a bf16-true model to fp32.
        problems.append(
            f"mixed_precision: {launch.mixed_precision} in the accelerate config contradicts precision: "
            f"{args.strategy.precision}; the recipe's precision decides: set mixed_precision: 'no' in the accelerate "
            "config (as accelerate_configs/*.yaml do)"
        )
    if launch.fsdp is not None:
        problems += fsdp_problems(args, launch)
    if launch.world_size == 1 and training.n_gpu > 1:
        # The Trainer wraps a single process that sees several GPUs in torch.nn.DataParallel, whose replicas then
        # meet inputs on another GPU (seen on a 4-GPU machine: "found at least two devices, cuda:3 and cuda:0").
        problems.append(
            f"one process sees {training.n_gpu} GPUs, and the Trainer would split each batch over them with "
            "torch.nn.DataParallel, which this recipe does not run; use one GPU (CUDA_VISIBLE_DEVICES=0, or "
            "accelerate_configs/single.yaml, which pins GPU 0) or all of them with one process each "
            "(accelerate_configs/ddp4.yaml)"
        )
    problems += rank0_generation_problems(args, launch)
    return problems


def rank0_generation_problems(args, launch: Launch) -> list[str]:
    """Captions written by rank 0 alone (after training, and at each evaluation) need the whole model on rank 0.

    Under FSDP or ZeRO-3 every forward all-gathers from every rank, so rank 0 would wait for ranks that have moved
    on (on the CPU test, FSDP's gather fails once rank 1 exits; over NCCL it waits for the collective timeout).
    """
    sharded = "FSDP" if launch.fsdp is not None else "ZeRO-3" if _zero_stage(launch.deepspeed) == 3 else None
    asked = {key: getattr(args.strategy, key) for key in ("num_sample_captions", "caption_metrics_samples")}
    return [f"{key}: {value} under {sharded}: rank 0 writes these captions alone, but a sharded model needs every "
            f"rank in each forward; set {key}: 0 and caption the saved model with recipes/generate.py"
            for key, value in asked.items() if sharded and value]


def _zero_stage(path: str | None) -> int | None:
    if not path or not Path(path).is_file():
        return None  # deepspeed_problems names a missing file
    return json.loads(Path(path).read_text()).get("zero_optimization", {}).get("stage")


def fsdp_problems(args, launch: Launch) -> list[str]:
    training, fsdp = args.training, launch.fsdp
    if training.deepspeed:
        return [f"fsdp and deepspeed: {training.deepspeed} both shard the model; launch with one of them "
                f"({FSDP_CONFIG}, or a DeepSpeed config with accelerate_configs/single.yaml)"]
    if fsdp["version"] != 2:
        return [f"fsdp_version: {fsdp['version']}: FSDP1 is deprecated in transformers 5.17 and its flat parameters "
                f"are not what the memory breakdown counts; set fsdp_version: 2 (as {FSDP_CONFIG} does)"]
    problems = []
    if launch.world_size < 2:
        problems.append(f"FSDP with one process (world size {launch.world_size}) shards nothing and only adds "
                        f"all-gathers; launch several processes ({FSDP_CONFIG}: 4 GPUs), or for one GPU that lacks "
                        "memory use deepspeed: ds_configs/zero3_offload.json")
    if (training.use_cpu or not torch.cuda.is_available()) and not ACCELERATE_FSDP_ON_CPU:
        problems.append("FSDP on the CPU: accelerate applies FSDP on GPUs only, so this launch would silently train "
                        "plain DDP; run it on GPUs, or launch with accelerate_configs/ddp4.yaml")
    optim = str(getattr(training.optim, "value", training.optim))
    if optim in BITSANDBYTES_OPTIMS:
        problems.append(f"optim: {optim} under FSDP: bitsandbytes' optimizer kernels take whole tensors, not FSDP2's "
                        "sharded DTensors (NotImplementedError: no sharding strategy registered, docs/compatibility.md); "
                        "use optim: adamw_torch_fused, or 8-bit Adam under accelerate_configs/ddp4.yaml")
    if fsdp["auto_wrap_policy"] == "NO_WRAP":
        problems.append(f"fsdp_auto_wrap_policy: NO_WRAP makes the whole model one unit, gathered in full on every "
                        f"GPU: nothing saved; set fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP (as {FSDP_CONFIG} does)")
    if fsdp["auto_wrap_policy"] == "SIZE_BASED_WRAP" and args.strategy.fsdp_layers_per_unit > 1:
        problems.append(f"fsdp_layers_per_unit: {args.strategy.fsdp_layers_per_unit} "
                        "groups the layers that TRANSFORMER_BASED_WRAP finds, but the launch wraps by size "
                        f"(SIZE_BASED_WRAP); set fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP (as {FSDP_CONFIG} does) "
                        "or drop the key")
    if fsdp["state_dict_type"] != "FULL_STATE_DICT" and args.strategy.save_model:
        problems.append(f"fsdp_state_dict_type: {fsdp['state_dict_type']} saves a distributed checkpoint, not a model "
                        "folder that from_pretrained and recipes/generate.py read; set fsdp_state_dict_type: "
                        "FULL_STATE_DICT (rank 0 writes model.safetensors) or save_model: false")
    return problems


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


def route_checkpointing(args, launch: Launch) -> dict:
    """Under FSDP, `gradient_checkpointing: true` becomes FSDP's activation checkpointing. Returns the report.

    transformers' checkpointing under FSDP "introduces a redundant AllGather in the backward pass" (its own warning,
    transformers issue #30404), and the Trainer refuses it beside fsdp_activation_checkpointing. FSDP's checkpoint
    wrapper recomputes each layer inside its gathered unit. The recipe keeps its one key; the switch happens here,
    and the run record shows asked and used.
    """
    training = args.training
    if launch.fsdp is None or not training.gradient_checkpointing:
        return {}
    training.gradient_checkpointing = False
    launch.fsdp["activation_checkpointing"] = True
    change = {"asked": True, "used": "false: FSDP activation checkpointing instead (fsdp_activation_checkpointing)",
              "why": "transformers' checkpointing under FSDP all-gathers every layer a second time in backward"}
    if training.process_index == 0:
        print(f"gradient_checkpointing: asked true, using FSDP's activation checkpointing ({change['why']})")
    return {"gradient_checkpointing": change}


def quant_storage(launch: Launch, dtype: torch.dtype) -> torch.dtype:
    """Storage dtype of QLoRA's packed 4-bit weights: under FSDP, the model's dtype (bf16 under bf16-true).

    FSDP2 shards floating-point parameters only: with bitsandbytes' default uint8 storage, accelerate leaves every
    4-bit weight out of fully_shard, whole on every GPU (tests/recipes/test_distributed.py checks the bf16 case).
    """
    return dtype if launch.fsdp is not None else torch.uint8


def configure_fsdp(trainer, launch: Launch, layers_per_unit: int = 1, forward_prefetch: bool = True) -> None:
    """The FSDP choices that need the built model, made on the Trainer's plugin before it wraps the model.

    - units: each tower's repeated block (models/layers.py), unless the launch named classes itself, sharded
      here `layers_per_unit` consecutive layers to a unit, each prefetching the next (recipes/fsdp_units.py);
    - activation checkpointing as read and routed, with the language model's KV cache off: FSDP's checkpoint
      wrapper re-runs a layer in backward, and a cache filled in forward would be appended to again (OPT then
      fails on a 2x-long attention mask, T5 saves a different number of tensors); transformers' own checkpointing
      switches it off per layer;
    - one module per tied embedding (`share_tied_embeddings`);
    - every rank must start from the same weights: FSDP2 shards what each rank built and broadcasts nothing;
    - an elementwise optimizer steps the local shards (`step_local_shards`).
    """
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if plugin is None or launch.fsdp is None:
        return
    from accelerate.utils.dataclasses import get_module_class_from_name

    from altscale.families.blip2.layers import layer_class_names, towers

    model = trainer.model
    if launch.fsdp["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP":
        if plugin.transformer_cls_names_to_wrap is None:
            plugin.transformer_cls_names_to_wrap = layer_class_names(model)
        unknown = [name for name in plugin.transformer_cls_names_to_wrap if get_module_class_from_name(model, name) is None]
        if unknown:
            raise ConfigError(f"fsdp_transformer_layer_cls_to_wrap: {', '.join(unknown)} not in this model, whose "
                              f"layers are {', '.join(layer_class_names(model))}; drop the key (the layers are then "
                              "read from the model)")
    launch.fsdp["transformer_cls_names_to_wrap"] = plugin.transformer_cls_names_to_wrap
    plugin.activation_checkpointing = launch.fsdp["activation_checkpointing"]
    if plugin.activation_checkpointing:
        # Every config of the language model: T5's encoder and decoder stacks hold copies of their own.
        for module in towers(model)["language"].modules():
            if hasattr(getattr(module, "config", None), "use_cache"):
                module.config.use_cache = False
    launch.fsdp["tied_embeddings_shared"] = share_tied_embeddings(towers(model)["language"])
    launch.fsdp["weights_broadcast_from_rank0"] = align_weights(model)
    if launch.fsdp["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP":  # last: it shards the weights just compared
        from altscale.strategies.fsdp_units import shard_towers

        launch.fsdp |= shard_towers(model, plugin, layers_per_unit, forward_prefetch)
    launch.fsdp["optimizer"] = step_local_shards(trainer)


def step_local_shards(trainer) -> str:
    """Has the Trainer build the shard-local variant of its optimizer (recipes/sharded_optim.py); returns its name.

    An optimizer that is not elementwise (or not torch's) keeps stepping the DTensors as they are.
    """
    from transformers import Trainer

    from altscale.strategies.sharded_optim import shard_local_class

    if trainer.optimizer_cls_and_kwargs is not None:
        optimizer_cls, kwargs = trainer.optimizer_cls_and_kwargs
    else:
        optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(trainer.args, trainer.model)
    local_cls = shard_local_class(optimizer_cls)
    if local_cls is None:
        return f"{getattr(optimizer_cls, '__name__', optimizer_cls)} on the DTensors (not elementwise)"
    trainer.optimizer_cls_and_kwargs = (local_cls, kwargs)
    return local_cls.__name__


def configure_ddp(trainer, launch: Launch) -> None:
    """DDP's gradients as views into its all-reduce buckets (torch's `gradient_as_bucket_view`), kept across steps.

    Off by default in torch and in the Trainer, which then keeps the buckets as a second copy of every gradient
    (6.98 GiB for opt-2.7b in bf16, measured) and copies each gradient into it after every backward. Views alone
    are not enough: the Trainer's `zero_grad` sets the gradients to None after each step, so the next step's
    first micro-batches (under `no_sync`) accumulate into fresh tensors beside the buckets, and the peak kept the
    copy (44.53 GiB against 37.44 on one GPU, 2 H200s). `KeepGradientViews` zeroes them in place instead.
    """
    handler = getattr(trainer.accelerator, "ddp_handler", None)
    if launch.strategy != "ddp" or handler is None:
        return
    handler.gradient_as_bucket_view = True
    trainer.add_callback(KeepGradientViews(trainer))
    launch.ddp = {"gradient_as_bucket_view": True, "zero_grad_set_to_none": False,
                  "bucket_cap_mb": handler.bucket_cap_mb, "find_unused_parameters": handler.find_unused_parameters}


class KeepGradientViews(TrainerCallback):
    """Makes the DDP model's `zero_grad` zero the gradients in place, so they stay views into DDP's buckets.

    The Trainer calls `model.zero_grad()` on the DDP wrapper after every optimizer step, with torch's default
    `set_to_none=True`; it offers no setting for it. The wrapper exists once training begins.
    """

    def __init__(self, trainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        ddp = self.trainer.model_wrapped
        if isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            ddp.zero_grad = functools.partial(type(ddp).zero_grad, ddp, set_to_none=False)


def share_tied_embeddings(language_model) -> list[str]:
    """Makes every nn.Embedding that holds the input embedding's weight that very module; returns their names.

    transformers 5 gives T5's encoder and decoder their own embed_tokens modules tied to `shared` by weight.
    accelerate puts `shared` and the tied LM head in one FSDP unit and the stacks' embed_tokens in the root unit:
    one parameter in two units, which torch 2.13 refuses ("shared with a parameter already managed by another FSDP
    group"). One module, seen from three places, is in one unit only.
    OPT has a single embed_tokens: nothing changes.
    """
    embedding = language_model.get_input_embeddings()
    names = [name for name, module in language_model.named_modules()
             if module is not embedding and isinstance(module, torch.nn.Embedding) and module.weight is embedding.weight]
    for name in names:
        language_model.set_submodule(name, embedding)
    return names


def align_weights(model) -> bool:
    """Compares every parameter's sum across ranks; if any differ, broadcasts rank 0's weights. True if it had to.

    Ranks build a random-init model from one seed, so they should agree; a stray random draw on one rank would
    otherwise train shards of different models, silently.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return False
    params = [p for p in model.parameters() if p.device.type != "meta"]
    sums = torch.stack([p.detach().double().sum() for p in params])
    low, high = sums.clone(), sums.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if torch.equal(low, high):
        return False
    with torch.no_grad():
        for p in params:
            dist.broadcast(p.data, src=0)
    return True
