"""The collective bandwidth benchmark, run for real by torchrun: 2 gloo processes on CPU, tiny sizes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from altscale.benchmarks import nccl_bandwidth
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_two_gloo_ranks_write_every_op_and_size_with_the_nccl_tests_bus_factor(tmp_path):
    out = tmp_path / "nccl.jsonl"
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nproc_per_node", "2", "--master_port", str(free_port()),
               str(ROOT / "benchmarks" / "nccl_bandwidth.py"), "--backend", "gloo", "--sizes_mb", "1", "2",
               "--iters", "2", "--out", str(out)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]

    records = [json.loads(line) for line in out.read_text().splitlines()]
    ops = [r for r in records if r["record"] == "op"]
    assert sorted((r["op"], r["size_mb"]) for r in ops) == sorted((op, size) for op in nccl_bandwidth.OPS for size in (1, 2))
    for r in ops:
        assert r["world_size"] == 2 and r["time_ms"] > 0 and r["algbw_gbps"] > 0 and r["busbw_gbps"] > 0
        # nccl-tests: all_reduce moves 2(n-1)/n of the tensor over each link, the other two (n-1)/n.
        expected = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5}[r["op"]]
        assert abs(r["busbw_gbps"] / r["algbw_gbps"] - expected) < 1e-9
    (env,) = [r for r in records if r["record"] == "environment"]
    assert env["world_size"] == 2 and env["torch"] and env["grad_allreduce"]["time_ms"] > 0
    assert "busbw GB/s" in result.stdout and "one all-reduce of 7.49 GB" in result.stdout


def test_nccl_without_a_gpu_and_a_zero_size_are_refused_with_the_fix(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for words, message in ((["--backend", "nccl"], "on CPU use --backend gloo"),
                           (["--backend", "gloo", "--sizes_mb", "0"], "--sizes_mb and --iters must be positive")):
        monkeypatch.setattr(sys, "argv", ["nccl_bandwidth.py", *words])
        with pytest.raises(SystemExit):
            nccl_bandwidth.parse_args()
        assert message in capsys.readouterr().err
