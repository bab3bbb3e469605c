"""Precision: `precision` in a recipe, and what it means for TrainingArguments, the model's dtype and the GPU.

32-true: fp32 everywhere. bf16-true: the model is built in bf16 (weights, gradients and optimizer state), no
autocast. bf16-mixed / fp16-mixed: fp32 weights under autocast (fp16 with loss scaling).
"""

from __future__ import annotations

import torch

from altscale.config.errors import ConfigError

PRECISIONS = ("32-true", "bf16-true", "bf16-mixed", "fp16-mixed")


def precision_flags(precision: str, training) -> dict:
    """The TrainingArguments autocast flags that `precision` implies (they are parsed with the recipe's values).

    bf16-true needs no autocast: the model itself is loaded in bf16 (see `model_dtype`).
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"precision: {precision!r} is unknown; use one of {', '.join(PRECISIONS)}")
    # DeepSpeed keeps bf16 weights only in its bf16 mode (with fp32 master weights), so bf16-true turns it on.
    bf16_mode = precision == "bf16-mixed" or (precision == "bf16-true" and bool(training.deepspeed))
    wanted = {"bf16": bf16_mode, "fp16": precision == "fp16-mixed"}
    for flag, value in wanted.items():
        if getattr(training, flag) and not value:
            raise ConfigError(
                f"{flag}: true contradicts precision: {precision}; drop {flag} and say precision: "
                f"{'bf16-mixed' if flag == 'bf16' else 'fp16-mixed'} (or bf16-true for bf16 weights)"
            )
    if precision == "bf16-mixed" and not torch.cuda.is_available() and not training.use_cpu:
        raise ConfigError(
            "precision: bf16-mixed on a machine without a GPU autocasts on the CPU only with use_cpu: true; "
            "add it, or use precision: 32-true"
        )
    return {flag: True for flag, value in wanted.items() if value}


def model_dtype(precision: str) -> torch.dtype:
    return torch.bfloat16 if precision == "bf16-true" else torch.float32


def precision_problems(args, machine) -> list[str]:
    """Precisions the machine at hand cannot run: fp16-mixed without a GPU, bf16 on GPUs before Ampere."""
    precision = args.strategy.precision
    on_gpu = machine.cuda and not args.training.use_cpu
    if precision == "fp16-mixed" and not machine.cuda:
        return ["precision: fp16-mixed needs a CUDA GPU; on the CPU use 32-true or bf16-mixed with use_cpu: true"]
    lacking = [gpu.name for gpu in machine.gpus if not gpu.bf16]
    if precision.startswith("bf16") and on_gpu and lacking:
        return [f"precision: {precision} needs bf16, which this GPU ({lacking[0]}) lacks; "
                "use precision: fp16-mixed, or 32-true"]
    return []
