"""Check a whole configuration before any weight is loaded, and report every problem at once."""

import json
import os
from pathlib import Path

import psutil
import torch

from altscale.families import parameter_count
from altscale.config.arguments import Arguments
from altscale.config.errors import ConfigError
from altscale.strategies.launch import launch_problems, read_launch
from altscale.artifacts.output_dir import output_dir_problems


def check_compatible(args: Arguments) -> None:
    problems = []
    training = args.training
    if training.per_device_train_batch_size <= 0:
        problems.append(f"per_device_train_batch_size: {training.per_device_train_batch_size}; use 1 or more")
    if training.gradient_accumulation_steps <= 0:
        problems.append(f"gradient_accumulation_steps: {training.gradient_accumulation_steps}; use 1 or more")
    if training.remove_unused_columns:
        problems.append("remove_unused_columns: true drops the image and text columns the collator reads; set it to false")
    if args.strategy.precision == "fp16-mixed" and not torch.cuda.is_available():
        problems.append("precision: fp16-mixed needs a CUDA GPU; on the CPU use 32-true or bf16-mixed with use_cpu: true")
    if args.strategy.memory_log_steps <= 0:
        problems.append(f"memory_log_steps: {args.strategy.memory_log_steps}; use 1 or more")
    problems += hardware_problems(args) + data_option_problems(args)
    problems += output_dir_problems(training.output_dir, overwrite_output_dir=args.strategy.overwrite_output_dir,
                                    resume_from_checkpoint=training.resume_from_checkpoint)
    problems += model_problems(args)
    problems += strategy_problems(args)
    problems += launch_problems(args)  # DDP, FSDP and DeepSpeed launches (recipes/launch.py)
    problems += cuda_graph_problems(args)
    if problems:
        raise ConfigError("\n".join(problems))


def hardware_problems(args: Arguments) -> list[str]:
    """Precisions the GPU at hand cannot run (GPUs before Ampere have no bf16)."""
    precision = args.strategy.precision
    on_gpu = torch.cuda.is_available() and not args.training.use_cpu
    if precision.startswith("bf16") and on_gpu and not torch.cuda.is_bf16_supported():
        return [f"precision: {precision} needs bf16, which this GPU ({torch.cuda.get_device_name()}) lacks; "
                "use precision: fp16-mixed, or 32-true"]
    return []


def data_option_problems(args: Arguments) -> list[str]:
    problems = []
    if args.data.max_image_pixels <= 0:
        problems.append(f"max_image_pixels: {args.data.max_image_pixels}; use a positive pixel count such as 64000000")
    if args.data.pad_to_multiple_of <= 0:
        problems.append(f"pad_to_multiple_of: {args.data.pad_to_multiple_of}; use 1 (no rounding) or more, such as 8")
    return problems


def cuda_available() -> bool:
    return torch.cuda.is_available()


def cuda_graph_problems(args: Arguments) -> list[str]:
    """What cuda_graphs (recipes/cuda_graphs.py) cannot record, or has not been verified to record, on this run."""
    strategy, training = args.strategy, args.training
    if not strategy.cuda_graphs:
        return []
    if not cuda_available() or training.use_cpu:
        return ["cuda_graphs: true needs a CUDA GPU; drop it on the CPU"]
    problems = []
    if strategy.cuda_graph_max_shapes < 1:
        problems.append(f"cuda_graph_max_shapes: {strategy.cuda_graph_max_shapes}; use 1 or more")
    if read_launch(training).strategy != "single":
        problems.append("cuda_graphs: true runs one process on one GPU; DDP, FSDP and DeepSpeed step outside the "
                        "graph's reach: drop cuda_graphs, or launch with accelerate_configs/single.yaml")
    if training.gradient_checkpointing:
        problems.append("cuda_graphs with gradient_checkpointing is not verified (the recompute saves and restores "
                        "the RNG state); turn one of them off")
    if strategy.load_in_4bit:
        problems.append("cuda_graphs with load_in_4bit is not verified (bitsandbytes' kernels in a graph); "
                        "drop cuda_graphs for QLoRA")
    if strategy.precision == "fp16-mixed":
        problems.append("cuda_graphs with fp16-mixed is not verified (the loss scaler); use bf16-true or bf16-mixed")
    if training.torch_empty_cache_steps:
        problems.append("torch_empty_cache_steps empties the allocator's cache inside the step, which a CUDA graph "
                        "cannot record; drop it with cuda_graphs")
    return problems


def model_problems(args: Arguments) -> list[str]:
    """A random init needs an architecture: a preset, a Hub id a preset copies, or a folder with config.json."""
    from altscale.families import random_init_config
    from altscale.models.build import resolve_init

    try:
        if resolve_init(args.model.model_name_or_path, args.model.init) == "random":
            random_init_config(args.model.model_name_or_path)  # reads a small JSON file, builds nothing
    except ConfigError as err:
        return [str(err)]
    return []


DEFAULT_OPTIM = "adamw_torch_fused"
LR_SCALINGS = ("none", "linear")


def strategy_problems(args: Arguments) -> list[str]:
    """Combinations of memory strategies that cannot run, each with a working alternative."""
    problems = []
    strategy, training = args.strategy, args.training
    if strategy.fsdp_layers_per_unit < 1:
        problems.append(f"fsdp_layers_per_unit: {strategy.fsdp_layers_per_unit}; use 1 or more")
    if strategy.lr_scaling not in LR_SCALINGS:
        problems.append(f"lr_scaling: {strategy.lr_scaling!r} is unknown; use one of {', '.join(LR_SCALINGS)}")
    if strategy.load_in_4bit and not strategy.use_peft:
        problems.append("load_in_4bit: true without use_peft: 4-bit weights cannot be trained directly; "
                        "add use_peft: true (QLoRA) or drop load_in_4bit")
    # No GPU rule for QLoRA: bitsandbytes 0.50 has CPU 4-bit kernels, and it trains there (docs/compatibility.md).
    if training.deepspeed:
        problems += deepspeed_problems(args)
    return problems


def deepspeed_problems(args: Arguments) -> list[str]:
    strategy, training = args.strategy, args.training
    path = training.deepspeed if isinstance(training.deepspeed, str) else None
    config = training.deepspeed if isinstance(training.deepspeed, dict) else None
    if path is not None:
        if not Path(path).is_file():
            return [f"deepspeed: {path!r} is not a file; use one of ds_configs/*.json"]
        config = json.loads(Path(path).read_text())
    zero = config.get("zero_optimization", {})
    problems = []
    optim = str(getattr(training.optim, "value", training.optim))
    # `optim` given at all, even as its default, is swapped: the Trainer hands DeepSpeed no optimizer of its own.
    if "optimizer" in config and ("optim" in args.given or optim != DEFAULT_OPTIM):
        problems.append(f"optim: {optim} is ignored under deepspeed: {path}, whose optimizer section steps "
                        "DeepSpeed's own AdamW; drop optim, or drop the DeepSpeed config to use it")
    if strategy.load_in_4bit and zero.get("stage") == 3:
        problems.append("load_in_4bit with DeepSpeed ZeRO-3: ZeRO-3 cannot partition bitsandbytes' packed 4-bit "
                        "weights; use ds_configs/zero2_offload.json, or QLoRA without DeepSpeed")
    return problems + host_memory_problems(args, zero, path or "the recipe's config")


# Host memory a full fine-tune takes under ZeRO offload with DeepSpeedCPUAdam, per parameter (BENCHMARKS.md): for
# blip2-flan-t5-xxl in bf16 each of 4 ranks held 72.09 GiB for its 3.02 B parameters, 25.6 bytes each: weights 2,
# gradients 6, fp32 master weights and Adam's two moments 12, pinned staging buffers the rest. Without offload_param
# the weights stay on the GPU.
OFFLOAD_BYTES_PER_PARAMETER = 25
OFFLOADED_WEIGHT_BYTES = 2
GIB = 2**30


def host_memory_problems(args: Arguments, zero: dict, config_name: str) -> list[str]:
    """A ZeRO offload run whose optimizer cannot fit in this machine's memory, refused before the kernel's OOM
    killer ends it in its first step (on 2 H200s with 251 GiB, blip2-flan-t5-xxl's ZeRO-3 offload was killed at
    224 GiB in use). LoRA trains few parameters and is not estimated; neither is a model that is not a preset."""
    offloads = {key: (zero.get(key) or {}).get("device") == "cpu" for key in ("offload_optimizer", "offload_param")}
    if not offloads["offload_optimizer"] or not args.strategy.host_memory_check or args.strategy.use_peft:
        return []
    count = parameter_count(args.model.model_name_or_path)
    if count is None:
        return []
    per_parameter = OFFLOAD_BYTES_PER_PARAMETER - (0 if offloads["offload_param"] else OFFLOADED_WEIGHT_BYTES)
    world = args.training.world_size
    machines = max(1, world // int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    need, have = count * per_parameter / machines, psutil.virtual_memory().total
    if need <= have:
        return []
    spread = f", over {machines} machines" if machines > 1 else ""
    return [f"deepspeed: {config_name} keeps the optimizer in host memory: about {need / GIB:.0f} GiB on each machine "
            f"({per_parameter} bytes a parameter, from a measured run, x {count / 1e9:.1f} B parameters{spread}), "
            f"and this machine has {have / GIB:.0f} GiB: the kernel would kill the run in its first step. Use more "
            "machines (--num_machines), FSDP over GPUs (accelerate_configs/fsdp4.yaml), LoRA (use_peft: true), or "
            "host_memory_check: false where the machine's memory grows as it is used"]
