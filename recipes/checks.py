"""Check a whole configuration before any weight is loaded, and report every problem at once."""

import torch

from recipes.arguments import Arguments
from recipes.errors import ConfigError


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
    if problems:
        raise ConfigError("\n".join(problems))
