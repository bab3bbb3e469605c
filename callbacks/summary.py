"""Run summary: training time, throughput, MFU, peak memory, losses; and the effective configuration.

No per-step host syncs: samples and tokens are summed on the device by a forward pre-hook (or, for steps
that run no hook, by the trainer into the `BatchCounts` handed to the callback) and read once at the end;
losses come from `state.log_history`, which the Trainer fills anyway. CUDA is synchronised twice (first
optimizer step, end of training) so that those two timestamps are not early.

Tokens are the non-padding positions the language model processes: the sum of `attention_mask`, plus
`query_tokens_per_sample` per sample. With transformers 5.17's Blip2Processor (num_query_tokens set,
as in the Salesforce checkpoints) `input_ids` already hold the 32 `<image>` placeholders, so the
attention mask already counts the query positions and the default 0 is right; pass 32 only for a
collator that leaves them out.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import psutil
import torch
from transformers import TrainerCallback

from altscale.callbacks.effective_config import effective_config, format_effective_config
from altscale.callbacks.flops import peak_bf16_flops
from altscale.callbacks.gpu_utilization import UtilizationSampler


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def loss_per_epoch(log_history: list[dict[str, Any]]) -> dict[int, float]:
    """Mean of the logged training losses whose logging window ended in each epoch (0-based)."""
    buckets: dict[int, list[float]] = {}
    for entry in log_history:
        if "loss" in entry and "epoch" in entry:
            epoch = max(math.ceil(entry["epoch"] - 1e-9) - 1, 0)
            buckets.setdefault(epoch, []).append(entry["loss"])
    return {epoch: sum(v) / len(v) for epoch, v in sorted(buckets.items())}


class BatchCounts:
    """Samples and tokens of the training micro-batches counted so far; tokens stay on the device (no sync).

    Tokens here leave out `query_tokens_per_sample`: the summary adds those per sample when it reads them.
    """

    def __init__(self) -> None:
        self.samples = 0
        self.tokens: Any = 0

    def add(self, kwargs: dict[str, Any], args: tuple = ()) -> None:
        """One micro-batch, as the model's forward receives it (`args`: its positional arguments)."""
        mask = kwargs.get("attention_mask")
        ids = kwargs.get("input_ids", args[0] if args else None)
        batch = next((t for t in (ids, mask, kwargs.get("pixel_values")) if isinstance(t, torch.Tensor)), None)
        if batch is None:
            return
        self.samples += batch.shape[0]
        if isinstance(mask, torch.Tensor):
            self.tokens = self.tokens + mask.sum()  # stays on the device: no sync
        elif isinstance(ids, torch.Tensor):
            self.tokens = self.tokens + ids.numel()


class RunSummaryCallback(TrainerCallback):
    """Times the training loop, counts samples and tokens, and records the effective configuration.

    `process_start_time` (seconds since the epoch) marks the start for time-to-first-step; by default
    the process's creation time from psutil. `flops_per_sample` (training FLOPs, see callbacks.flops)
    gives TFLOP/s and MFU; `peak_flops` (per GPU) defaults to the table in callbacks.flops by device name.
    `counts`: filled by the trainer when its steps run no forward hook (CUDA graph replays: strategies/cuda_graphs.py);
    the callback then only reads it. Without it, the callback's forward pre-hook counts into its own.
    """

    def __init__(self, flops_per_sample: float | None = None, peak_flops: float | None = None,
                 process_start_time: float | None = None, query_tokens_per_sample: int = 0,
                 memory: Any = None, results_file: str = "runs/results.jsonl", print_rank0: bool = True,
                 startup: dict[str, float] | None = None, utilization: UtilizationSampler | None = None,
                 counts: BatchCounts | None = None) -> None:
        self.flops_per_sample = flops_per_sample
        self.peak_flops = peak_flops
        self.process_start_time = process_start_time or psutil.Process(os.getpid()).create_time()
        self.query_tokens_per_sample = query_tokens_per_sample
        self.memory = memory
        self.results_file = results_file
        self.print_rank0 = print_rank0
        self.effective_config: dict[str, Any] | None = None
        self.train_begin_s: float | None = None
        self.train_end_s: float | None = None
        self.time_to_first_step_s: float | None = None
        # Seconds from process start at each named point before training, filled by the recipe (see startup_s).
        self.startup = startup if startup is not None else {}
        self.utilization = utilization if utilization is not None else UtilizationSampler()
        self._step_ends: list[float] = []
        self._first_step_end: float | None = None
        self._samples_in_first_step = 0
        self._counts_forward = counts is None  # else the trainer counts every micro-batch, replayed ones too
        self.counts = counts if counts is not None else BatchCounts()
        self._hook = None
        self._args = self._state = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self._args, self._state = args, state
        self.effective_config = effective_config(args, model, optimizer)
        if self._hook is not None:
            self._hook.remove()
        self._hook = model.register_forward_pre_hook(self._count, with_kwargs=True)
        self.startup["train_begin"] = time.time() - self.process_start_time
        self.utilization.start()
        self.train_begin_s = time.perf_counter()

    def _count(self, module, args, kwargs) -> None:
        if module.training and self._counts_forward:
            self.counts.add(kwargs, args)

    def on_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        if self.time_to_first_step_s is not None:
            return
        _sync()
        self._first_step_end = time.perf_counter()
        self._samples_in_first_step = self.counts.samples
        self.time_to_first_step_s = time.time() - self.process_start_time
        self.startup["first_optimizer_step"] = self.time_to_first_step_s
        self.effective_config = effective_config(args, model, optimizer)  # optimizer states exist now
        if self.print_rank0 and args.process_index == 0:
            print(format_effective_config(self.effective_config), flush=True)

    def on_step_end(self, args, state, control, **kwargs):
        # Host time, no sync: once the launch queue is full the host runs at the GPU's pace, so the
        # differences are step times (the first steps' are early by the queue's depth).
        self._step_ends.append(time.perf_counter())

    def on_train_end(self, args, state, control, **kwargs):
        _sync()
        self.train_end_s = time.perf_counter()
        self.utilization.stop()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def summary(self) -> dict[str, Any]:
        """This rank's summary; after an OOM the clock stops now and `completed` is False."""
        args, state = self._args, self._state
        completed = self.train_end_s is not None
        end = self.train_end_s if completed else time.perf_counter()
        train_time_s = end - self.train_begin_s if self.train_begin_s is not None else None
        world = args.world_size if args is not None else 1
        samples, tokens = self.counts.samples, self.counts.tokens
        tokens = (int(tokens.item()) if isinstance(tokens, torch.Tensor) else int(tokens)) \
            + samples * self.query_tokens_per_sample
        # Every rank sees equally sized batches (DistributedSampler pads), so global = local × world size.
        samples_global, tokens_global = samples * world, tokens * world
        rate = (lambda n: n / train_time_s) if train_time_s else (lambda n: None)
        # After the first optimizer step: without start-up, worker spin-up and CUDA warm-up.
        steady_time_s = end - self._first_step_end if self._first_step_end is not None else None
        steady_samples = (samples - self._samples_in_first_step) * world
        step_ends = [self.train_begin_s, *self._step_ends] if self.train_begin_s is not None else []
        peak = self.peak_flops if self.peak_flops is not None else peak_bf16_flops(
            device_name() if torch.cuda.is_available() else None)
        achieved = None
        if self.flops_per_sample is not None and train_time_s:
            achieved = self.flops_per_sample * samples_global / train_time_s / world
        log_history = state.log_history if state is not None else []
        losses = [e["loss"] for e in log_history if "loss" in e]
        train_loss = next((e["train_loss"] for e in reversed(log_history) if "train_loss" in e), None)
        peak_bytes = None
        if self.memory is not None:
            peak_bytes = self.memory.peak_allocated_bytes()
        elif torch.cuda.is_available() and torch.cuda.is_initialized():
            peak_bytes = torch.cuda.max_memory_allocated()
        return {
            "completed": completed,
            "train_time_s": train_time_s,
            "time_to_first_step_s": self.time_to_first_step_s,
            "optimizer_steps": state.global_step if state is not None else 0,
            "samples": samples_global,
            "tokens": tokens_global,
            "samples_per_s": rate(samples_global),
            "steady_samples_per_s": steady_samples / steady_time_s if steady_time_s and steady_samples else None,
            "step_times_s": [round(b - a, 4) for a, b in zip(step_ends, step_ends[1:])],
            "startup_s": {name: round(value, 2) for name, value in self.startup.items()},
            "gpu_utilization_mean": self.utilization.mean,
            "gpu_utilization_samples": len(self.utilization.samples),
            "tokens_per_s": rate(tokens_global),
            "flops_per_sample": self.flops_per_sample,
            "achieved_tflops_per_gpu": achieved / 1e12 if achieved is not None else None,
            "peak_tflops_per_gpu": peak / 1e12 if peak is not None else None,
            "mfu": achieved / peak if achieved is not None and peak else None,
            "peak_allocated_bytes": peak_bytes,
            "rss_bytes": psutil.Process(os.getpid()).memory_info().rss,
            "loss_per_epoch": loss_per_epoch(log_history),
            "final_loss": losses[-1] if losses else None,
            "train_loss": train_loss,
        }


def format_summary(summary: dict[str, Any]) -> str:
    def num(value: Any, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    return (
        f"train {num(summary['train_time_s'], '.1f')} s | first step at {num(summary['time_to_first_step_s'], '.1f')} s"
        f" | {num(summary['samples_per_s'], '.2f')} samples/s ({num(summary.get('steady_samples_per_s'), '.2f')} after step 1)"
        f" | {num(summary['tokens_per_s'], '.0f')} tokens/s"
        f" | {num(summary['achieved_tflops_per_gpu'], '.1f')} TFLOP/s per GPU | MFU {num(summary['mfu'], '.1%')}"
        f" | peak {num(None if summary['peak_allocated_bytes'] is None else summary['peak_allocated_bytes'] / 2**30, '.2f')} GiB"
        f" | GPU busy {num(summary.get('gpu_utilization_mean'), '.0f')} %"
        f" | final loss {num(summary['final_loss'], '.4f')}"
    )
