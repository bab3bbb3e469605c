"""The callbacks inside a real HF Trainer on CPU: snapshot steps and phases, OOM report, results record."""

import json

import pytest
import torch
from transformers import Trainer, TrainingArguments

from altscale.callbacks import build_callbacks, memory_callback, oom_report, write_run_record
from tests.callbacks.tiny import ADAMW_BYTES, FROZEN, GRAD_BYTES, PARAM_BYTES, TRAINABLE, TinyData, TinyModel

PHASES = ["before_fwd", "after_fwd", "after_bwd", "after_step"]
# max_steps=5, memory_log_steps=2: steps 0, 1, 2, 4, four phases each, then the epoch end at global step 5.
EXPECTED = [(s, p) for s in (0, 1, 2, 4) for p in PHASES] + [(5, "epoch_end")]


def _trainer(tmp_path, accumulation=1, model=None, flops_per_sample=None, report_to="none"):
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=5, per_device_train_batch_size=2,
        gradient_accumulation_steps=accumulation, learning_rate=1e-2, logging_steps=1, save_strategy="no",
        report_to=report_to, use_cpu=True, disable_tqdm=True,
    )
    callbacks = build_callbacks(memory_log_steps=2, results_file=str(tmp_path / "results.jsonl"),
                                flops_per_sample=flops_per_sample, peak_flops=1e9)
    return Trainer(model=model or TinyModel(), args=args, train_dataset=TinyData(), callbacks=callbacks)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_snapshots_at_expected_steps_and_phases(tmp_path, accumulation, capsys):
    trainer = _trainer(tmp_path, accumulation, report_to="tensorboard")
    trainer.train()
    rows = memory_callback(trainer).rows
    assert [(r["step"], r["phase"]) for r in rows] == EXPECTED
    by = {(r["step"], r["phase"]): r for r in rows}
    assert all(r["params_cpu"] == PARAM_BYTES for r in rows)
    assert by[0, "before_fwd"]["grads_cpu"] == 0 and by[0, "before_fwd"]["optim_cpu"] == 0
    assert by[0, "after_bwd"]["grads_cpu"] == GRAD_BYTES and by[0, "after_bwd"]["optim_cpu"] == 0
    assert by[0, "after_step"]["grads_cpu"] == GRAD_BYTES and by[0, "after_step"]["optim_cpu"] == ADAMW_BYTES
    assert by[1, "before_fwd"]["grads_cpu"] == 0  # Trainer's zero_grad sets grads to None
    assert by[0, "after_bwd"]["allocated_bytes"] is None  # no CUDA here
    printed = capsys.readouterr().out
    assert "[step     4 | after_step] params  0.00" in printed
    assert "effective configuration:" in printed
    logged = [e for e in trainer.state.log_history if "memory/after_step/rss_gib" in e]
    assert [e["step"] for e in logged] == [1, 2, 3, 5]  # logged at the log following each snapshot step


def test_oom_report_names_step_and_phase(tmp_path):
    trainer = _trainer(tmp_path, model=TinyModel(oom_on_call=2))  # the second forward is step 1's
    status, error = "ok", None
    try:
        trainer.train()
    except torch.cuda.OutOfMemoryError as exc:
        status, error = "oom", exc
    assert status == "oom"
    report = oom_report(memory_callback(trainer), error)
    lines = report.splitlines()
    assert lines[0] == "OOM at step 1 before_fwd (during the forward pass)"
    assert lines[1] == "torch: CUDA out of memory. Tried to allocate 2.00 GiB (injected)"
    assert lines[2] == "last breakdown (step 1 before_fwd):"
    assert lines[-1].startswith("advice: optimizer state dominates")  # 1612 B of AdamW state > 1088 B of weights
    record = write_run_record(trainer, status=status, recipe="tiny-oom", error=error)
    assert record["status"] == "oom" and record["last_phase"] == {"step": 1, "phase": "before_fwd"}
    assert record["error"].startswith("OutOfMemoryError: CUDA out of memory")
    assert record["summary"]["completed"] is False and record["summary"]["optimizer_steps"] == 1


def test_results_record_has_every_field(tmp_path):
    trainer = _trainer(tmp_path, flops_per_sample=1000.0)
    trainer.train()
    returned = write_run_record(trainer, status="ok", recipe="tiny", config={"memory": {"memory_log_steps": 2}})
    write_run_record(trainer, status="ok", recipe="tiny-again")
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 2
    record = json.loads(lines[0])
    assert record["recipe"] == returned["recipe"] == "tiny"
    assert set(record) == {
        "time", "recipe", "status", "error", "strategy", "world_size", "device_name", "versions", "git_commit",
        "config", "summary", "summary_per_rank", "ranks_recorded", "comm_buffers_per_rank", "cuda_graphs", "effective_config",
        "last_phase", "snapshots"}
    assert record["ranks_recorded"] == [0] and record["comm_buffers_per_rank"] == [None] and record["cuda_graphs"] is None  # one process: no DDP, no FSDP
    assert (record["status"], record["error"], record["world_size"], record["device_name"]) == ("ok", None, 1, "cpu")
    assert record["strategy"] == "single device"
    assert record["config"]["memory"] == {"memory_log_steps": 2}
    assert record["config"]["training_args"]["max_steps"] == 5
    assert record["versions"]["torch"] == torch.__version__
    assert [(s["step"], s["phase"]) for s in record["snapshots"]] == EXPECTED
    assert all(s["rank"] == 0 for s in record["snapshots"])

    summary = record["summary"]
    assert summary["completed"] is True and summary["optimizer_steps"] == 5
    assert summary["samples"] == 10 and summary["tokens"] == 40  # 5 steps × 2 samples × 4 unmasked tokens
    assert summary["tokens_per_s"] == pytest.approx(40 / summary["train_time_s"])
    assert summary["achieved_tflops_per_gpu"] == pytest.approx(1000.0 * 10 / summary["train_time_s"] / 1e12)
    assert summary["mfu"] == pytest.approx(1000.0 * 10 / summary["train_time_s"] / 1e9)
    assert 0 < summary["time_to_first_step_s"] and summary["peak_allocated_bytes"] is None
    assert list(summary["loss_per_epoch"]) == ["0"] and summary["final_loss"] is not None
    assert summary["train_loss"] is not None
    assert len(summary["step_times_s"]) == 5 and all(t > 0 for t in summary["step_times_s"])
    assert summary["steady_samples_per_s"] > 0  # the 8 samples of steps 2-5 over the time after step 1
    assert list(summary["startup_s"]) == ["train_begin", "first_optimizer_step"]
    assert summary["startup_s"]["train_begin"] <= summary["startup_s"]["first_optimizer_step"]
    assert summary["gpu_utilization_mean"] is None and summary["gpu_utilization_samples"] == 0  # no GPU here

    effective = record["effective_config"]
    assert effective["optimizer_class"] == "torch.optim.adamw.AdamW"
    assert (effective["trainable_params"], effective["frozen_params"]) == (TRAINABLE, FROZEN)
    assert effective["optimizer_state_dtypes"] == {"exp_avg: torch.float32": 3, "exp_avg_sq: torch.float32": 3}
    assert effective["param_dtypes"] == {"torch.float32": TRAINABLE + FROZEN}
    assert effective["global_batch_size"] == 2 and effective["gradient_checkpointing"] is False
    assert effective["master_weights"].startswith("none")


def test_unknown_status_is_refused(tmp_path):
    with pytest.raises(ValueError, match="status must be 'ok', 'oom', 'error' or 'interrupted', got 'fine'"):
        write_run_record(_trainer(tmp_path), status="fine", recipe="tiny")


def test_memory_log_steps_must_be_positive():
    with pytest.raises(ValueError, match="memory_log_steps must be at least 1, got 0"):
        build_callbacks(memory_log_steps=0)
