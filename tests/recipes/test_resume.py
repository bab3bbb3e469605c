"""Interrupt a run with a signal, resume it, and get the loss curve of a run that was never interrupted."""

import json
import os
import signal

import pytest

from altscale.callbacks.interrupt import InterruptCallback
from recipes import train

STEPS, STOP_AT = 12, 5  # 8 steps per epoch (64 photos, batch 8): the resumed run crosses an epoch boundary


@pytest.fixture(scope="module")
def photos(synthetic_photos):
    return synthetic_photos(num_train=64, num_test=8, seed=2, size=32)


def run_args(out, photos, *extra):
    return ["--dataset_path", photos, "--output_dir", str(out), "--results_file", str(out.parent / "results.jsonl"),
            "--dataloader_num_workers", "0", "--disable_tqdm", "true", "--per_device_train_batch_size", "8",
            "--learning_rate", "1e-3", "--warmup_steps", "3", "--max_steps", str(STEPS), "--logging_steps", "1",
            "--save_strategy", "steps", "--save_steps", "1000", "--num_sample_captions", "0", *extra]


def signal_at(step: int, signum: int):
    class SignalAtStep(InterruptCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == step:
                os.kill(os.getpid(), signum)  # a real signal, handled by the handler this callback installed
            return super().on_step_end(args, state, control, **kwargs)

    return SignalAtStep


def losses(log_history) -> dict[int, float]:
    return {entry["step"]: entry["loss"] for entry in log_history if "loss" in entry}


@pytest.mark.slow
def test_interrupted_and_resumed_run_matches_an_uninterrupted_one(tmp_path, photos, monkeypatch, capsys):
    whole = losses(train.main(run_args(tmp_path / "whole", photos))["log_history"])
    assert sorted(whole) == list(range(1, STEPS + 1))

    out = tmp_path / "cut"
    monkeypatch.setattr(train, "InterruptCallback", signal_at(STOP_AT, signal.SIGINT))
    code = train.run(run_args(out, photos))
    err = capsys.readouterr().err
    assert code == 130
    assert f"interrupted by SIGINT at step {STOP_AT}" in err and "--resume_from_checkpoint last" in err
    assert (out / f"checkpoint-{STOP_AT}" / "optimizer.pt").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert records[-1]["status"] == "interrupted"

    monkeypatch.undo()
    resumed = train.main(run_args(out, photos, "--resume_from_checkpoint", "last"))
    after = losses(resumed["log_history"])
    assert sorted(after) == list(range(1, STEPS + 1))  # the checkpoint's history, then the new steps
    assert [after[s] for s in sorted(after)] == pytest.approx([whole[s] for s in sorted(whole)], rel=1e-4)


def test_sigterm_without_checkpointing_stops_saying_nothing_was_saved(tmp_path, photos, monkeypatch, capsys):
    monkeypatch.setattr(train, "InterruptCallback", signal_at(2, signal.SIGTERM))
    out = tmp_path / "out"
    code = train.run(run_args(out, photos, "--save_strategy", "no"))
    err = capsys.readouterr().err
    assert code == 143
    assert "interrupted by SIGTERM at step 2; no checkpoint saved" in err
    assert not list(out.glob("checkpoint-*"))
