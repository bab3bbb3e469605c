"""The machine a run is checked against: its GPUs, host memory, processes per machine and installed packages.

`check_compatible` reads the machine only through this object (`Machine.detect()` in a real run), so a test
describes a machine instead of patching torch.cuda, psutil and os.environ.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field

# Packages whose presence a check asks about.
OPTIONAL_PACKAGES = ("deepspeed", "bitsandbytes", "torchvision")


@dataclass(frozen=True)
class Gpu:
    name: str
    total_bytes: int
    bf16: bool


@dataclass(frozen=True)
class Machine:
    gpus: tuple[Gpu, ...] = ()
    host_memory_bytes: int = 0
    # Processes a launcher started on this machine (its LOCAL_WORLD_SIZE); None outside a launcher.
    local_world_size: int | None = None
    installed: frozenset[str] = field(default_factory=frozenset)
    # accelerate 1.15 turns FSDP on only for accelerator backends (AcceleratorState: MULTI_GPU, MULTI_XPU, ...): with
    # use_cpu the same launch silently trains plain DDP. The CPU tests patch accelerate to run its real FSDP2 path
    # over gloo (tests/recipes/launched.py) and describe such a machine with this flag.
    fsdp_on_cpu: bool = False

    @property
    def cuda(self) -> bool:
        return bool(self.gpus)

    @classmethod
    def detect(cls, environ=os.environ) -> Machine:
        import psutil
        import torch

        gpus = ()
        if torch.cuda.is_available():
            # Properties only: no tensor is made, so no process opens a CUDA context on a GPU that is not its own
            # before accelerate sets its device. bf16 tensor cores came with compute capability 8.0 (Ampere).
            properties = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
            gpus = tuple(Gpu(name=p.name, total_bytes=p.total_memory, bf16=p.major >= 8) for p in properties)
        local = environ.get("LOCAL_WORLD_SIZE")
        return cls(
            gpus=gpus,
            host_memory_bytes=psutil.virtual_memory().total,
            local_world_size=int(local) if local else None,
            installed=frozenset(name for name in OPTIONAL_PACKAGES if importlib.util.find_spec(name) is not None),
        )
