"""One of two gloo ranks for tests/recipes/test_sharded_optim.py: the same FSDP2 model trained twice with the same
gradients, once by torch's optimizer on the DTensors and once by its shard-local variant; writes what it saw."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from altscale.strategies.sharded_optim import shard_local_class


def model() -> torch.nn.Module:
    torch.manual_seed(0)  # both ranks, both runs: the same weights
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3), torch.nn.Linear(3, 7))
    for layer in net:
        fully_shard(layer)
    return fully_shard(net)


def train(optimizer_cls, kwargs) -> tuple[dict, torch.optim.Optimizer, torch.nn.Module]:
    net = model()
    optimizer = optimizer_cls(net.parameters(), lr=0.1, **kwargs)
    torch.manual_seed(1 + dist.get_rank())  # each rank its own data
    for _ in range(3):
        net(torch.randn(4, 6)).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: p.full_tensor() for name, p in net.named_parameters()}, optimizer, net


def main() -> None:
    dist.init_process_group("gloo")
    out = {}
    for name, cls, kwargs in [("adamw", torch.optim.AdamW, {"weight_decay": 0.1, "foreach": False}),
                              ("sgd", torch.optim.SGD, {"momentum": 0.9, "foreach": False})]:
        reference, _, _ = train(cls, kwargs)
        local_cls = shard_local_class(cls)
        result, optimizer, net = train(local_cls, kwargs)
        state = [value for per_param in optimizer.state.values() for value in per_param.values()]
        tensors = [value for value in state if isinstance(value, torch.Tensor) and value.dim() > 0]
        out[name] = {
            "class": local_cls.__name__,
            "identical": all(torch.equal(reference[key], result[key]) for key in reference),
            "changed": any(not torch.equal(result[key], model_weights) for key, model_weights in
                           ((k, p.full_tensor()) for k, p in model().named_parameters())),
            "state_keys_are_the_parameters": set(map(id, optimizer.state)) == set(map(id, net.parameters())),
            "state_tensors_are_dtensors": bool(tensors) and all(isinstance(t, DTensor) for t in tensors),
            "no_local_grads_left": all(p._local_tensor.grad is None for p in net.parameters()),
        }
    Path(sys.argv[1]).joinpath(f"rank{dist.get_rank()}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
