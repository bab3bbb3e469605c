"""The interrupt callback: a signal becomes "save and stop" at the next step end; a second one stops at once."""

import signal
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerControl, TrainerState

from altscale.callbacks.interrupt import InterruptCallback, TrainingInterrupted


def step_end(callback, save_strategy="steps", step=4):
    args = SimpleNamespace(save_strategy=save_strategy, device=torch.device("cpu"), output_dir="out")
    state, control = TrainerState(global_step=step), TrainerControl()
    callback.on_step_end(args, state, control)
    return args, control


def test_nothing_happens_without_a_signal():
    _, control = step_end(InterruptCallback())
    assert not control.should_save and not control.should_training_stop


@pytest.mark.parametrize("save_strategy, saves", [("steps", True), ("epoch", True), ("no", False)])
def test_a_signal_saves_when_checkpointing_is_on_and_stops(save_strategy, saves):
    callback = InterruptCallback()
    callback.handle(signal.SIGTERM)
    args, control = step_end(callback, save_strategy)
    assert control.should_training_stop and control.should_save is saves
    error = TrainingInterrupted(callback, args)
    assert error.exit_code == 143
    assert ("checkpoint saved to out/checkpoint-4" in str(error)) is saves


def test_handlers_are_installed_for_training_and_restored_after():
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    callback = InterruptCallback()
    callback.on_train_begin(None, None, None)
    try:
        assert signal.getsignal(signal.SIGINT) == callback.handle
        signal.raise_signal(signal.SIGINT)
        assert callback.signal_received == signal.SIGINT
    finally:
        callback.on_train_end(None, None, None)
    assert {signum: signal.getsignal(signum) for signum in before} == before


def test_a_second_signal_does_not_wait_for_the_step():
    callback = InterruptCallback()
    callback.on_train_begin(None, None, None)
    callback.handle(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        callback.handle(signal.SIGINT)  # restores Python's handler and re-raises through it
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
