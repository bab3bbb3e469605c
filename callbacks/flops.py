"""The peak dense bf16 FLOP/s of known GPUs: the MFU's denominator. Each family counts its own model FLOPs
(families/<family>/flops.py), which the run summary divides by time and by this peak."""

from __future__ import annotations

# Dense bf16 tensor-core peak without sparsity, from NVIDIA's data sheets. Matched in order against
# torch.cuda.get_device_name(), so the PCIe H100 is tested before the generic H100 entry.
PEAK_BF16_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100", 989.4e12),  # SXM5 / HBM3
    ("H200", 989.4e12),
    ("A100", 312e12),
)


def peak_bf16_flops(device_name: str | None) -> float | None:
    """Peak dense bf16 FLOP/s of a GPU by its name; None for unknown devices and for CPU."""
    if not device_name:
        return None
    for key, flops in PEAK_BF16_FLOPS:
        if key.lower() in device_name.lower():
            return flops
    return None
