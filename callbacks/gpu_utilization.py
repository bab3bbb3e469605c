"""GPU utilisation sampled once a second in a background thread, to show whether the input pipeline starves the GPU.

Utilisation is what nvidia-smi reports: the percentage of the last sample period in which a kernel ran. The
reader is `torch.cuda.utilization` (needs the NVML bindings) or, without them, one `nvidia-smi` query per sample.
Sampling happens off the training thread and never touches the CUDA stream, so it costs the loop nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from typing import Callable

import torch

Reader = Callable[[], float]


def _nvml_reader(device: int) -> Reader | None:
    try:
        torch.cuda.utilization(device)
    except Exception:  # no pynvml / amdsmi in this environment
        return None
    return lambda: float(torch.cuda.utilization(device))


def _nvidia_smi_reader(device: int) -> Reader | None:
    if shutil.which("nvidia-smi") is None:
        return None
    # By UUID, because CUDA_VISIBLE_DEVICES may renumber the GPUs this process sees.
    gpu = f"GPU-{torch.cuda.get_device_properties(device).uuid}"
    command = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", gpu]

    def read() -> float:
        return float(subprocess.run(command, capture_output=True, text=True, check=True, timeout=5).stdout.strip())

    try:
        read()
    except (subprocess.SubprocessError, ValueError, OSError):
        return None
    return read


def default_reader() -> Reader | None:
    """A reader for this process's current CUDA device, or None where there is none."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    device = torch.cuda.current_device()
    return _nvml_reader(device) or _nvidia_smi_reader(device)


class UtilizationSampler:
    """`start()`, then `stop()` returns the samples (percent) taken in between."""

    def __init__(self, read: Reader | None = None, interval_s: float = 1.0) -> None:
        self.read = read
        self.interval_s = interval_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.read is None:
            self.read = default_reader()
        if self.read is None or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-utilization", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.samples.append(self.read())
            except Exception:  # a failing reader ends sampling, never the run
                return
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> list[float]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
            self._thread = None
        return self.samples

    @property
    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None
