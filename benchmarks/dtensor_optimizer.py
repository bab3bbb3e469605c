"""Host time of one optimizer step and one gradient clip over FSDP2's sharded parameters (DTensors).

    torchrun --nproc_per_node 2 benchmarks/dtensor_optimizer.py [--tensors 1247] [--out results.jsonl]

BLIP-2 opt-2.7b has 1,247 parameter tensors. On 2 H200s (torch 2.11) the profile of an FSDP2 step showed AdamW's
step taking ~370 ms of host time, running per-tensor lerp_/sqrt/addcdiv_ instead of one fused kernel: this script
times the variants on a model with the same number of tensors (all evenly sharded), each step synchronised,
median of several:
    fused / foreach / for-loop  torch.optim.AdamW on the DTensor parameters, as the Trainer builds it
    local-shards                AdamW (fused) stepping each DTensor's local shard (recipes/sharded_optim.py)
and clip_grad_norm_ on the DTensors against the same norm computed from the local shards plus one all-reduce.
It also prints the five most frequent operators inside a fused step (the fused kernel, or what replaced it).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist



def build(tensors: int, device: torch.device) -> torch.nn.Module:
    """Linear layers (weight + bias: two tensors each) in FSDP2 units of 16 tensors, sharded over the world."""
    from torch.distributed.fsdp import fully_shard

    layers = [torch.nn.Linear(512, 512, device=device, dtype=torch.bfloat16) for _ in range(tensors // 2)]
    model = torch.nn.Sequential(*layers)
    for start in range(0, len(layers), 8):
        fully_shard(layers[start:start + 8])
    fully_shard(model)
    return model


def fill_grads(model: torch.nn.Module) -> None:
    for p in model.parameters():
        p.grad = torch.randn_like(p)


def timed(fn, repeats: int = 7) -> float:
    """Median host milliseconds of fn() followed by a device sync (the sync is part of the work measured)."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[1:])


def local_grad_norm(params, norm_type: float = 2.0) -> torch.Tensor:
    """The norm of all gradients of dim-0-sharded DTensor parameters, from the local shards plus one all-reduce."""
    local = torch.nn.utils.get_total_norm([p.grad._local_tensor for p in params if p.grad is not None], norm_type)
    powered = local.float().pow(norm_type)
    dist.all_reduce(powered)
    return powered.pow(1.0 / norm_type)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=1247)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    from altscale.strategies.sharded_optim import ShardLocalAdamW

    results = {"world_size": dist.get_world_size(), "tensors": args.tensors, "torch": torch.__version__}
    for name, kwargs in {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False},
                         "local-shards": {"fused": True}}.items():
        model = build(args.tensors, device)
        cls = ShardLocalAdamW if name == "local-shards" else torch.optim.AdamW
        optimizer = cls(model.parameters(), lr=1e-5, **kwargs)
        fill_grads(model)
        optimizer.step()  # creates the state
        results[f"adamw_{name}_ms"] = timed(optimizer.step)
        if name == "fused":
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
                optimizer.step()
            counts = sorted(profile.key_averages(), key=lambda e: -e.count)[:5]
            results["fused_step_top_ops"] = {e.key: e.count for e in counts}
    params = list(model.parameters())
    results["clip_dtensor_ms"] = timed(lambda: torch.nn.utils.clip_grad_norm_(params, 1.0))
    results["clip_local_ms"] = timed(lambda: local_grad_norm(params))
    dtensor_norm = torch.nn.utils.get_total_norm([p.grad for p in params]).full_tensor()
    results["norms_agree"] = bool(torch.allclose(dtensor_norm.float(), local_grad_norm(params).float(), rtol=1e-3))
    if rank == 0:
        print(json.dumps(results, indent=1))
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(results) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
