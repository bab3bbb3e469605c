"""Machines the checks run against (config/machine.py), described instead of patched into torch.cuda and psutil.

`check(args, machine)` is what recipes/train.py does before any weight is loaded: plan the launch from the parsed
arguments (and this process's environment, which a test's `launched` fixture sets), then check it on `machine`.
"""

from __future__ import annotations

import dataclasses
import os

from altscale.config.checks import check_compatible
from altscale.config.machine import Gpu, Machine
from altscale.strategies.launch import plan_launch

GIB = 2**30
H100 = Gpu("NVIDIA H100 80GB HBM3", 80 * GIB, True)
V100 = Gpu("Tesla V100-SXM2-32GB", 32 * GIB, False)  # before Ampere: no bf16

CPU = Machine(host_memory_bytes=64 * GIB)  # no GPU, as the machine the tests run on
# The CPU machine tests/recipes/launched.py makes with ALTSCALE_FSDP_ON_CPU=1: accelerate patched to run FSDP2 on it.
FSDP_ON_CPU = dataclasses.replace(CPU, fsdp_on_cpu=True)
GPU = Machine(gpus=(H100,), host_memory_bytes=251 * GIB)
OLD_GPU = Machine(gpus=(V100,), host_memory_bytes=251 * GIB)


def check(args, machine: Machine = CPU, environ=os.environ) -> None:
    """check_compatible on the launch this process's environment describes, as recipes/train.py calls it."""
    check_compatible(args, plan_launch(args, environ), machine)
