"""Stop on SIGINT or SIGTERM at the next step end, saving a checkpoint first, so the run can resume.

This one callback steers rather than watches (STYLE habit 9): a signal handler may only set a flag,
and a step end is the one place the Trainer can still save a consistent checkpoint and stop.
"""

from __future__ import annotations

import signal
import threading

import torch
from transformers import TrainerCallback

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class InterruptCallback(TrainerCallback):
    """Turns the first SIGINT/SIGTERM into "save (if checkpointing is on) and stop"; a second one stops at once."""

    def __init__(self) -> None:
        self.signal_received: int | None = None
        self.stopped_at_step: int | None = None
        self._previous: dict[int, object] = {}

    def handle(self, signum: int, frame=None) -> None:
        if self.signal_received is not None:
            # A second signal: the user does not want to wait for the step and the save.
            self.restore_handlers()
            signal.raise_signal(signum)
            return
        self.signal_received = signum

    def install_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # Python delivers signals to the main thread only, and installs handlers only there
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self.handle)

    def restore_handlers(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def on_train_begin(self, args, state, control, **kwargs):
        self.install_handlers()

    def on_step_end(self, args, state, control, **kwargs):
        if not stop_requested(self.signal_received is not None, args.device):
            return
        self.signal_received = self.signal_received or signal.SIGTERM  # another rank got it
        self.stopped_at_step = state.global_step
        control.should_save = args.save_strategy != "no"
        control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        self.restore_handlers()


def stop_requested(local: bool, device: torch.device) -> bool:
    """True on every rank once any rank has a signal, so all ranks save and stop at the same step.

    Ranks stopping at different steps would leave the others waiting in a collective forever; one
    scalar all-reduce per step is the price.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return local
    if torch.distributed.get_world_size() == 1:
        return local
    flag = torch.tensor(int(local), device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())


class TrainingInterrupted(Exception):
    """Training stopped on a signal; the message says what was saved and how to resume."""

    def __init__(self, callback: InterruptCallback, args) -> None:
        self.signum = int(callback.signal_received)
        name = signal.Signals(self.signum).name
        step = callback.stopped_at_step
        if args.save_strategy != "no":
            saved = f"checkpoint saved to {args.output_dir}/checkpoint-{step}"
            how = ("to resume, run the same command with --resume_from_checkpoint last "
                   "(or add resume_from_checkpoint: last to the recipe)")
        else:
            saved = "no checkpoint saved (save_strategy: no), so this run's progress is lost"
            how = "to be able to resume next time, set save_strategy: steps and save_steps"
        super().__init__(f"interrupted by {name} at step {step}; {saved}; {how}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM
