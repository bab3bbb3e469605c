"""log_memory_before_reporters: a reporter moved after MemoryCallback receives the memory/* values."""

import transformers.integrations as integrations
from transformers import Trainer, TrainerCallback, TrainingArguments

from altscale.callbacks import build_callbacks, log_memory_before_reporters
from tests.callbacks.tiny import TinyData, TinyModel


class Recorder(TrainerCallback):
    def __init__(self):
        self.keys = set()

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.keys |= set(logs)


def test_reporter_sees_memory_values(tmp_path, monkeypatch):
    monkeypatch.setitem(integrations.INTEGRATION_TO_CALLBACK, "tensorboard", Recorder)  # stands in for TensorBoard
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, logging_steps=1,
                             save_strategy="no", report_to="tensorboard", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=TinyModel(), args=args, train_dataset=TinyData(), callbacks=build_callbacks(memory_log_steps=1))
    log_memory_before_reporters(trainer)
    recorder = trainer.callback_handler.callbacks[-1]
    assert isinstance(recorder, Recorder)
    trainer.train()
    assert "memory/after_bwd/allocated_gib" not in recorder.keys  # CUDA figures are None on CPU: not logged
    assert {"memory/after_step/optim_cpu_gib", "memory/after_bwd/grads_cpu_gib", "loss"} <= recorder.keys


def test_console_only_runs_keep_memory_out_of_the_log_lines(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, logging_steps=1,
                             save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=TinyModel(), args=args, train_dataset=TinyData(), callbacks=build_callbacks(memory_log_steps=1))
    trainer.train()
    assert not any(key.startswith("memory/") for entry in trainer.state.log_history for key in entry)
