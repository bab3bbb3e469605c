"""Exact byte counts of memory_by_category on CPU."""

import pytest
import torch
from torch import nn

from altscale.callbacks.memory import format_snapshot, memory_by_category, oom_advice
from tests.callbacks.tiny import ADAMW_BYTES, GRAD_BYTES, PARAM_BYTES, TRAINABLE, TinyModel, VOCAB


def _step(model, optimizer):
    ids = torch.randint(0, VOCAB, (2, 6))
    model(ids, labels=ids)["loss"].backward()
    optimizer.step()


def test_params_count_tied_weight_once():
    row = memory_by_category(TinyModel())
    assert row["params_cpu"] == PARAM_BYTES == 1088
    assert (row["params_gpu"], row["grads_cpu"], row["optim_cpu"]) == (0, 0, 0)


def test_views_of_one_flat_buffer_count_once():
    flat = torch.zeros(100)
    module = nn.Module()
    module.a = nn.Parameter(flat[:50])
    module.b = nn.Parameter(flat[50:])
    assert memory_by_category(module)["params_cpu"] == 400


def test_adamw_state_two_fp32_moments_plus_step_tensors():
    model = TinyModel()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    _step(model, optimizer)
    row = memory_by_category(model, optimizer)
    assert row["grads_cpu"] == GRAD_BYTES == 800
    assert row["optim_cpu"] == ADAMW_BYTES == 1612


def test_sgd_without_momentum_has_no_state():
    model = TinyModel()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    _step(model, optimizer)
    assert memory_by_category(model, optimizer)["optim_cpu"] == 0


def test_bf16_params_count_two_bytes():
    row = memory_by_category(TinyModel().to(torch.bfloat16))
    assert row["params_cpu"] == PARAM_BYTES // 2 == 544


def test_lora_grads_and_state_only_for_adapters():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(TinyModel(), peft.LoraConfig(r=2, target_modules=["hidden"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    _step(model, optimizer)
    row = memory_by_category(model, optimizer)
    adapter = 2 * 8 + 8 * 2  # lora_A (2×8) and lora_B (8×2)
    assert row["params_cpu"] == PARAM_BYTES + adapter * 4 == 1216
    assert row["grads_cpu"] == adapter * 4 == 128
    assert row["optim_cpu"] == 2 * adapter * 4 + 2 * 4 == 264  # 2 moments + 2 step scalars


def _bnb():
    bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed")
    return bnb


def test_bnb_8bit_adam_about_two_bytes_per_param():
    bnb = _bnb()
    module = nn.Module()
    module.a = nn.Parameter(torch.randn(64, 128))  # 8192 elements: above bnb's 4096 threshold for 8-bit state
    module.b = nn.Parameter(torch.randn(64, 128))
    optimizer = bnb.optim.AdamW8bit(module.parameters())
    try:
        (module.a.sum() + module.b.sum()).backward()
        optimizer.step()
    except (RuntimeError, NotImplementedError) as exc:
        pytest.skip(f"bitsandbytes 8-bit Adam does not run on this CPU: {exc}")
    row = memory_by_category(module, optimizer)
    # per param: state1 + state2 uint8 (2 × 8192) + absmax1/2 fp32 per 256-block (2 × 32 × 4);
    # the two 256-entry fp32 qmaps are shared by all params, so counted once (2 × 1024).
    assert row["optim_cpu"] == 2 * (2 * 8192 + 2 * 32 * 4) + 2 * 1024 == 35328
    assert 2.0 < row["optim_cpu"] / (2 * 8192) < 2.2


def test_bnb_4bit_weight_counted_packed_with_quant_state():
    bnb = _bnb()
    try:
        layer = bnb.nn.Linear4bit(128, 64, bias=False, quant_type="nf4", compress_statistics=True).to("cpu")
    except (RuntimeError, NotImplementedError) as exc:
        pytest.skip(f"bitsandbytes cannot quantize to 4 bits on this CPU: {exc}")
    # 8192 weights packed two per byte; absmax per 64-block quantized to uint8 (128 B) with its own fp32
    # absmax (1 block: 4 B), 256-entry fp32 code (1024 B) and fp32 offset (4 B); the 16-entry nf4 code (64 B).
    assert memory_by_category(layer)["params_cpu"] == 4096 + 128 + 4 + 1024 + 4 + 64 == 5320


def test_cpu_run_prints_na_for_cuda_figures():
    row = {"step": 1, "phase": "after_bwd", **memory_by_category(TinyModel())}
    line = format_snapshot(row)
    assert line.startswith("[step     1 | after_bwd ] params  0.00 | grads  0.00 | optim  0.00 | act+other   n/a")
    assert "alloc   n/a (peak   n/a) | reserved   n/a" in line and line.endswith("| GiB")


@pytest.mark.parametrize("row, words", [
    ({"params_gpu": 1, "grads_gpu": 1, "optim_gpu": 9, "act_other_bytes": 2}, "optimizer state dominates"),
    ({"params_gpu": 1, "grads_gpu": 1, "optim_gpu": 1, "act_other_bytes": 9}, "activations dominate"),
    ({"params_gpu": 9, "grads_gpu": 1, "optim_gpu": 1, "act_other_bytes": 2}, "weights dominate"),
    ({"params_gpu": 1, "grads_gpu": 9, "optim_gpu": 1, "act_other_bytes": 2}, "gradients dominate"),
    ({"params_gpu": 0, "params_cpu": 1, "optim_cpu": 5, "act_other_bytes": None}, "optimizer state dominates"),
    (None, "failed before the first measurement"),
])
def test_oom_advice_follows_the_largest_category(row, words):
    assert words in oom_advice(row)
