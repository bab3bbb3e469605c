"""DeepSpeed ZeRO (ds_configs/*.json, as the recipe's `deepspeed` key or accelerate_configs/zero*_offload4.yaml):
what cannot run under it, checked before any weight is loaded. The Trainer and accelerate run DeepSpeed itself."""

from __future__ import annotations

from pathlib import Path

from altscale.strategies.launch import DEFAULT_OPTIM, LaunchPlan, deepspeed_settings, optim_name

# Host memory a full fine-tune takes under ZeRO offload with DeepSpeedCPUAdam, per parameter (BENCHMARKS.md): for
# blip2-flan-t5-xxl in bf16 each of 4 ranks held 72.09 GiB for its 3.02 B parameters, 25.6 bytes each: weights 2,
# gradients 6, fp32 master weights and Adam's two moments 12, pinned staging buffers the rest. Without offload_param
# the weights stay on the GPU.
OFFLOAD_BYTES_PER_PARAMETER = 25
OFFLOADED_WEIGHT_BYTES = 2
GIB = 2**30


def deepspeed_problems(args, plan: LaunchPlan, machine) -> list[str]:
    strategy, training = args.strategy, args.training
    path = training.deepspeed if isinstance(training.deepspeed, str) else None
    if path is not None and not Path(path).is_file():
        return [f"deepspeed: {path!r} is not a file; use one of ds_configs/*.json"]
    config = deepspeed_settings(training.deepspeed)
    zero = config.get("zero_optimization", {})
    problems = []
    optim = optim_name(training)
    # `optim` given at all, even as its default, is swapped: the Trainer hands DeepSpeed no optimizer of its own.
    if "optimizer" in config and ("optim" in args.given or optim != DEFAULT_OPTIM):
        problems.append(f"optim: {optim} is ignored under deepspeed: {path}, whose optimizer section steps "
                        "DeepSpeed's own AdamW; drop optim, or drop the DeepSpeed config to use it")
    if strategy.load_in_4bit and zero.get("stage") == 3:
        problems.append("load_in_4bit with DeepSpeed ZeRO-3: ZeRO-3 cannot partition bitsandbytes' packed 4-bit "
                        "weights; use ds_configs/zero2_offload.json, or QLoRA without DeepSpeed")
    return problems + host_memory_problems(args, plan, zero, path or "the recipe's config", machine)


def host_memory_problems(args, plan: LaunchPlan, zero: dict, config_name: str, machine) -> list[str]:
    """A ZeRO offload run whose optimizer cannot fit in this machine's memory, refused before the kernel's OOM
    killer ends it in its first step (on 2 H200s with 251 GiB, blip2-flan-t5-xxl's ZeRO-3 offload was killed at
    224 GiB in use). LoRA trains few parameters and is not estimated; neither is a model that is not a preset."""
    from altscale.families import parameter_count

    offloads = {key: (zero.get(key) or {}).get("device") == "cpu" for key in ("offload_optimizer", "offload_param")}
    if not offloads["offload_optimizer"] or not args.strategy.host_memory_check or args.strategy.use_peft:
        return []
    count = parameter_count(args.model.model_name_or_path)
    if count is None:
        return []
    per_parameter = OFFLOAD_BYTES_PER_PARAMETER - (0 if offloads["offload_param"] else OFFLOADED_WEIGHT_BYTES)
    world = plan.world_size
    machines = max(1, world // (machine.local_world_size or world))
    need, have = count * per_parameter / machines, machine.host_memory_bytes
    if need <= have:
        return []
    spread = f", over {machines} machines" if machines > 1 else ""
    return [f"deepspeed: {config_name} keeps the optimizer in host memory: about {need / GIB:.0f} GiB on each machine "
            f"({per_parameter} bytes a parameter, from a measured run, x {count / 1e9:.1f} B parameters{spread}), "
            f"and this machine has {have / GIB:.0f} GiB: the kernel would kill the run in its first step. Use more "
            "machines (--num_machines), FSDP over GPUs (accelerate_configs/fsdp4.yaml), LoRA (use_peft: true), or "
            "host_memory_check: false where the machine's memory grows as it is used"]
