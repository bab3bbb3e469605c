"""recipes/sharded_optim.py: stepping FSDP2's local shards computes what torch's optimizer computes on the DTensors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from altscale.strategies.sharded_optim import ShardLocalAdamW, ShardLocalSGD, shard_local_class
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_only_elementwise_torch_optimizers_get_a_shard_local_variant():
    assert shard_local_class(torch.optim.AdamW) is ShardLocalAdamW
    assert shard_local_class(torch.optim.SGD) is ShardLocalSGD
    assert shard_local_class(ShardLocalAdamW) is ShardLocalAdamW
    assert shard_local_class(torch.optim.Adafactor) is None  # factored second moments: rows and columns
    assert shard_local_class(torch.optim.LBFGS) is None


def test_a_shard_local_step_on_plain_tensors_is_the_parents_step():
    torch.manual_seed(0)
    weights = [torch.randn(4, 3, requires_grad=True) for _ in range(2)]
    copies = [w.detach().clone().requires_grad_() for w in weights]
    plain, local = torch.optim.AdamW(weights, lr=0.1), ShardLocalAdamW(copies, lr=0.1)
    for _ in range(2):
        grads = [torch.randn(4, 3) for _ in weights]
        for w, c, g in zip(weights, copies, grads):
            w.grad, c.grad = g.clone(), g.clone()
        plain.step()
        local.step()
    assert all(torch.equal(w, c) for w, c in zip(weights, copies))


@pytest.mark.slow
def test_two_ranks_train_the_same_weights_and_keep_dtensor_state(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nproc_per_node", "2", "--master_port", str(free_port()),
               str(ROOT / "tests" / "recipes" / "sharded_optim_worker.py"), str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for name, cls in (("adamw", "ShardLocalAdamW"), ("sgd", "ShardLocalSGD")):
            assert seen[name] == {"class": cls, "identical": True, "changed": True,
                                  "state_keys_are_the_parameters": True, "state_tensors_are_dtensors": True,
                                  "no_local_grads_left": True}
