"""How fast the GPUs of one machine talk to each other: all_reduce, all_gather and reduce_scatter bandwidth.

    torchrun --nproc_per_node 4 benchmarks/nccl_bandwidth.py --out $OUT/nccl.jsonl        (one process per GPU)
    torchrun --nproc_per_node 2 benchmarks/nccl_bandwidth.py --backend gloo --sizes_mb 1 2  (CPU, as the test runs it)

Tells whether DDP/FSDP scaling is bound by communication: DDP all-reduces every gradient once per optimizer
step; FSDP all-gathers the parameters and reduce-scatters the gradients. Each op runs --warmup untimed times,
then --iters timed ones on bf16 tensors; its time is the slowest rank's mean. Rank 0 prints a table and appends
one JSON line per (op, size), then one with the machine's environment (P2P matrix, `nvidia-smi topo -m`,
torch and NCCL versions, the NCCL_* variables as set), to --out.

Bandwidths follow the conventions of nccl-tests (doc/PERFORMANCE.md in NVIDIA/nccl-tests), so the numbers
compare with theirs and with the hardware's link speed. With S the size of the full tensor in bytes (the one
all-reduced; for all_gather the gathered output, for reduce_scatter the input before it is scattered), t the
time of one op and n the number of ranks:

    algbw = S / t
    busbw = algbw * 2(n-1)/n   for all_reduce      (each byte crosses a link once to reduce, once to broadcast)
    busbw = algbw * (n-1)/n    for all_gather and reduce_scatter

busbw does not depend on n for a ring-like algorithm, so it is the number to hold against the link's peak.
Sizes are in MiB (2**20 bytes), bandwidths in GB/s (1e9 bytes/s), as nccl-tests prints them.
"""

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import torch
import torch.distributed as dist

OPS = ("all_reduce", "all_gather", "reduce_scatter")
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n}
# blip2-opt-2.7b's 3,744,761,856 parameters (README, models table) x 2 bytes: what DDP all-reduces per step in bf16.
OPT27_BF16_GRAD_GB = 7.49


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="nccl", choices=["nccl", "gloo"], help="gloo runs on CPU tensors.")
    parser.add_argument("--sizes_mb", type=int, nargs="+", default=[64, 256, 1024, 4096],
                        help="Full tensor sizes in MiB (the gathered one for all_gather and reduce_scatter).")
    parser.add_argument("--warmup", type=int, default=3, help="Untimed ops first (NCCL sets up its channels here).")
    parser.add_argument("--iters", type=int, default=5, help="Timed ops per (op, size).")
    parser.add_argument("--grad_gb", type=float, default=OPT27_BF16_GRAD_GB,
                        help="Gradient bytes (GB, 1e9) for the all-reduce time estimate; default: blip2-opt-2.7b in bf16.")
    parser.add_argument("--out", default="runs/nccl_bandwidth.jsonl")
    args = parser.parse_args()
    if args.backend == "nccl" and not torch.cuda.is_available():
        parser.error("--backend nccl needs CUDA GPUs, and none is visible; on CPU use --backend gloo")
    if min(args.sizes_mb) <= 0 or args.iters <= 0 or args.warmup < 0:
        parser.error("--sizes_mb and --iters must be positive, --warmup zero or more")
    return args


def build_op(name: str, numel: int, world_size: int, device: torch.device):
    """A no-argument function running one `name` collective on a full bf16 tensor of `numel` elements."""
    full = torch.zeros(numel, dtype=torch.bfloat16, device=device)  # zeros: repeated sums stay finite
    shard = torch.zeros(numel // world_size, dtype=torch.bfloat16, device=device)
    # torch 2.13 renamed the tensor forms *_single and deprecates the old names; the device machine has torch 2.11.
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if name == "all_reduce":
        return lambda: dist.all_reduce(full)
    if name == "all_gather":
        return lambda: all_gather(full, shard)
    return lambda: reduce_scatter(shard, full)


def time_op(run, warmup: int, iters: int, device: torch.device) -> float:
    """Seconds per op: the mean over `iters`, on the slowest rank (the collective is done when the last one is)."""
    for _ in range(warmup):
        run()
    if device.type == "cuda":
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            run()
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000 / iters
    else:
        dist.barrier()
        start_s = time.perf_counter()
        for _ in range(iters):
            run()
        dist.barrier()  # gloo returns when this rank's part is done, not the others'
        seconds = (time.perf_counter() - start_s) / iters
    slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.item()


def measure(name: str, size_mb: int, args: argparse.Namespace, device: torch.device) -> dict:
    world_size = dist.get_world_size()
    numel = size_mb * 2**20 // 2 // world_size * world_size  # bf16, cut to equal shards
    size_bytes = numel * 2
    run = build_op(name, numel, world_size, device)
    seconds = time_op(run, args.warmup, args.iters, device)
    algbw = size_bytes / seconds / 1e9
    return {"bench": "nccl_bandwidth", "record": "op", "op": name, "size_mb": size_mb, "size_bytes": size_bytes,
            "dtype": "bfloat16", "backend": args.backend, "world_size": world_size, "warmup": args.warmup,
            "iters": args.iters, "time_ms": seconds * 1000, "algbw_gbps": algbw,
            "busbw_gbps": algbw * BUS_FACTOR[name](world_size)}


def topology() -> str | None:
    """`nvidia-smi topo -m` (NVLink/PCIe path between each GPU pair), or None where it cannot be read."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        result = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout if result.returncode == 0 else None


def environment(args: argparse.Namespace) -> dict:
    on_gpu = torch.cuda.is_available() and args.backend == "nccl"
    count = torch.cuda.device_count() if on_gpu else 0
    nccl = torch.cuda.nccl.version() if on_gpu else None
    return {"bench": "nccl_bandwidth", "record": "environment", "backend": args.backend,
            "world_size": dist.get_world_size(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "torch": torch.__version__, "nccl": ".".join(map(str, nccl)) if nccl else None,
            "devices": [torch.cuda.get_device_name(i) for i in range(count)],
            # p2p[i][j]: GPU i can read GPU j's memory directly (NVLink or PCIe P2P) instead of through the host.
            "p2p": [[i == j or torch.cuda.can_device_access_peer(i, j) for j in range(count)] for i in range(count)],
            "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")},
            "topo": topology() if on_gpu else None}


def grad_allreduce_estimate(rows: list[dict], grad_gb: float) -> dict:
    """The time one all-reduce of `grad_gb` GB would take at the largest measured size's all_reduce busbw."""
    largest = max((r for r in rows if r["op"] == "all_reduce"), key=lambda r: r["size_mb"])
    # t = S * 2(n-1)/n / busbw. Optimistic for DDP, which sends gradients in buckets of 25 MB, where busbw is lower.
    seconds = grad_gb * BUS_FACTOR["all_reduce"](largest["world_size"]) / largest["busbw_gbps"]
    return {"grad_gb": grad_gb, "at_size_mb": largest["size_mb"], "at_busbw_gbps": largest["busbw_gbps"],
            "world_size": largest["world_size"], "time_ms": seconds * 1000}


def report(rows: list[dict], env: dict) -> None:
    print(f"{'op':<15}{'size MB':>9}{'ms':>11}{'algbw GB/s':>12}{'busbw GB/s':>12}")
    for r in rows:
        print(f"{r['op']:<15}{r['size_mb']:>9}{r['time_ms']:>11.3f}{r['algbw_gbps']:>12.2f}{r['busbw_gbps']:>12.2f}")
    grad = env["grad_allreduce"]
    print(f"one all-reduce of {grad['grad_gb']} GB of gradients at the {grad['at_size_mb']} MB busbw "
          f"({grad['at_busbw_gbps']:.1f} GB/s, {grad['world_size']} ranks): {grad['time_ms']:.1f} ms, "
          "to compare with a step time")
    print(f"torch {env['torch']}, NCCL {env['nccl']}, NCCL_* set: {env['nccl_env'] or 'none'}")


def main() -> None:
    args = parse_args()
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rows = [measure(name, size_mb, args, device) for name in OPS for size_mb in args.sizes_mb]
    if dist.get_rank() == 0:
        env = {**environment(args), "grad_allreduce": grad_allreduce_estimate(rows, args.grad_gb)}
        report(rows, env)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        # One writer (rank 0), so a plain append does; callbacks.results.append_json_line would import transformers.
        with open(args.out, "a") as f:
            f.writelines(json.dumps(record) + "\n" for record in [*rows, env])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
