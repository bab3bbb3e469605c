"""Check a whole configuration before any weight is loaded, and report every problem at once.

Each strategy checks its own rules (strategies/*.py `*_problems`); this module gathers them. The machine is one
object (config/machine.py), so every rule that depends on hardware or installed packages is testable on the CPU.
"""

from altscale.artifacts.output_dir import output_dir_problems
from altscale.config.arguments import Arguments
from altscale.config.errors import ConfigError
from altscale.config.machine import Machine
from altscale.strategies.deepspeed import deepspeed_problems
from altscale.strategies.launch import LaunchPlan, launch_problems
from altscale.strategies.precision import precision_problems

LR_SCALINGS = ("none", "linear")


def check_compatible(args: Arguments, plan: LaunchPlan, machine: Machine) -> None:
    training = args.training
    problems = []
    if training.per_device_train_batch_size <= 0:
        problems.append(f"per_device_train_batch_size: {training.per_device_train_batch_size}; use 1 or more")
    if training.gradient_accumulation_steps <= 0:
        problems.append(f"gradient_accumulation_steps: {training.gradient_accumulation_steps}; use 1 or more")
    if training.remove_unused_columns:
        problems.append("remove_unused_columns: true drops the image and text columns the collator reads; set it to false")
    if args.strategy.memory_log_steps <= 0:
        problems.append(f"memory_log_steps: {args.strategy.memory_log_steps}; use 1 or more")
    problems += precision_problems(args, machine) + data_option_problems(args)
    problems += output_dir_problems(training.output_dir, overwrite_output_dir=args.strategy.overwrite_output_dir,
                                    resume_from_checkpoint=training.resume_from_checkpoint)
    problems += model_problems(args)
    problems += strategy_problems(args)
    if training.deepspeed:
        problems += deepspeed_problems(args, plan, machine)
    problems += launch_problems(args, plan, machine)  # DDP and FSDP launches (strategies/launch.py, fsdp.py)
    problems += cuda_graph_problems(args, plan, machine)
    if problems:
        raise ConfigError("\n".join(problems))


def data_option_problems(args: Arguments) -> list[str]:
    problems = []
    if args.data.max_image_pixels <= 0:
        problems.append(f"max_image_pixels: {args.data.max_image_pixels}; use a positive pixel count such as 64000000")
    if args.data.pad_to_multiple_of <= 0:
        problems.append(f"pad_to_multiple_of: {args.data.pad_to_multiple_of}; use 1 (no rounding) or more, such as 8")
    return problems


def cuda_graph_problems(args: Arguments, plan: LaunchPlan, machine: Machine) -> list[str]:
    """What cuda_graphs (strategies/cuda_graphs.py) cannot record, or has not been verified to record, on this run."""
    strategy, training = args.strategy, args.training
    if not strategy.cuda_graphs:
        return []
    if not machine.cuda or training.use_cpu:
        return ["cuda_graphs: true needs a CUDA GPU; drop it on the CPU"]
    problems = []
    if strategy.cuda_graph_max_shapes < 1:
        problems.append(f"cuda_graph_max_shapes: {strategy.cuda_graph_max_shapes}; use 1 or more")
    if plan.strategy != "single":
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


def strategy_problems(args: Arguments) -> list[str]:
    """Combinations of memory strategies that cannot run, each with a working alternative."""
    problems = []
    strategy = args.strategy
    if strategy.fsdp_layers_per_unit < 1:
        problems.append(f"fsdp_layers_per_unit: {strategy.fsdp_layers_per_unit}; use 1 or more")
    if strategy.lr_scaling not in LR_SCALINGS:
        problems.append(f"lr_scaling: {strategy.lr_scaling!r} is unknown; use one of {', '.join(LR_SCALINGS)}")
    if strategy.load_in_4bit and not strategy.use_peft:
        problems.append("load_in_4bit: true without use_peft: 4-bit weights cannot be trained directly; "
                        "add use_peft: true (QLoRA) or drop load_in_4bit")
    # No GPU rule for QLoRA: bitsandbytes 0.50 has CPU 4-bit kernels, and it trains there (docs/compatibility.md).
    return problems
