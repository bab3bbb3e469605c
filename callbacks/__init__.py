"""Callbacks that watch a Trainer run: memory per category, run summary, effective configuration, results.

Use from a recipe (the family counts its own FLOPs: families/<family>/flops.py):

    from altscale.callbacks import build_callbacks, log_memory_before_reporters, memory_callback, oom_report, write_run_record

    callbacks = build_callbacks(memory_log_steps=args.memory_log_steps, results_file=args.results_file,
                                flops_per_sample=family.flops_per_sample(model.config, collator, train_set))
    trainer = Trainer(..., callbacks=callbacks)
    log_memory_before_reporters(trainer)       # so TensorBoard sees the memory/* values (optional)
    status, error = "ok", None
    try:
        trainer.train()
    except torch.cuda.OutOfMemoryError as exc:
        status, error = "oom", exc
        print(oom_report(memory_callback(trainer), exc))
    write_run_record(trainer, status=status, recipe="opt27-bf16", config={"model": asdict(model_args)}, error=error)

Public API (tests/callbacks/test_api.py checks these signatures against the code):
    build_callbacks(memory_log_steps=50, results_file="runs/results.jsonl", flops_per_sample=None,
                    peak_flops=None, process_start_time=None, query_tokens_per_sample=0, startup=None,
                    graphed_run=None) -> list[TrainerCallback]
    memory_callback(trainer) -> MemoryCallback | None
    log_memory_before_reporters(trainer) -> None
    write_run_record(trainer, *, status, recipe, config=None, error=None, results_file=None) -> dict
    oom_report(memory_callback, exc=None) -> str
    memory_by_category(model, optimizer=None, grad_buffers=None) -> dict[str, int | None]   (bytes; see callbacks.memory)
    format_snapshot(row) -> str
    describe_effective_config(trainer) -> dict
    effective_config(args, model, optimizer=None) -> dict
    format_effective_config(config) -> str
    format_summary(summary) -> str
    peak_bf16_flops(device_name) -> float | None
"""

from __future__ import annotations

from transformers import TrainerCallback

from altscale.callbacks.effective_config import describe_effective_config, effective_config, format_effective_config
from altscale.callbacks.flops import peak_bf16_flops
from altscale.callbacks.memory import MemoryCallback, format_snapshot, memory_by_category, oom_report
from altscale.callbacks.results import write_run_record
from altscale.callbacks.summary import RunSummaryCallback, format_summary

__all__ = [
    "MemoryCallback", "RunSummaryCallback", "build_callbacks", "describe_effective_config",
    "effective_config", "format_effective_config", "format_snapshot", "format_summary", "log_memory_before_reporters",
    "memory_by_category", "memory_callback", "oom_report", "peak_bf16_flops", "write_run_record",
]


def build_callbacks(memory_log_steps: int = 50, results_file: str = "runs/results.jsonl",
                    flops_per_sample: float | None = None, peak_flops: float | None = None,
                    process_start_time: float | None = None, query_tokens_per_sample: int = 0,
                    startup: dict[str, float] | None = None, graphed_run=None) -> list[TrainerCallback]:
    """The memory and run-summary callbacks, wired together (the summary reads the memory callback's peak).

    `peak_flops` is per GPU; None looks the device up in callbacks.flops. `process_start_time` (time.time()
    at process start) defaults to the process creation time. `query_tokens_per_sample`: see callbacks.summary.
    `startup` ({milestone: seconds since process start}) is recorded as the summary's `startup_s`, completed
    with train_begin and first_optimizer_step. `graphed_run` (strategies.cuda_graphs.GraphedRun): under CUDA
    graphs, what the replays counted and held, which no hook or allocator counter sees; give the same one to the
    GraphedTrainer, which fills it while these callbacks read it.
    """
    memory = MemoryCallback(every=memory_log_steps, graphed_run=graphed_run)
    summary = RunSummaryCallback(flops_per_sample=flops_per_sample, peak_flops=peak_flops,
                                 process_start_time=process_start_time,
                                 query_tokens_per_sample=query_tokens_per_sample, memory=memory,
                                 results_file=results_file, startup=startup,
                                 counts=graphed_run.batches if graphed_run is not None else None)
    return [memory, summary]


def memory_callback(trainer) -> MemoryCallback | None:
    """The trainer's MemoryCallback, for oom_report."""
    return next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, MemoryCallback)), None)


def log_memory_before_reporters(trainer) -> None:
    """Moves the reporting callbacks (TensorBoard, W&B, ...) after ours.

    The Trainer puts reporters before user callbacks, and passes one `logs` dict to each in turn, so
    the memory/* values MemoryCallback adds in `on_log` reach a reporter only if it comes later.
    Uses the Trainer's public pop_callback / add_callback; reporter instances are kept as they are.
    """
    from transformers.integrations import INTEGRATION_TO_CALLBACK

    reporter_types = tuple(INTEGRATION_TO_CALLBACK.values())
    for callback in [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, reporter_types)]:
        trainer.pop_callback(callback)
        trainer.add_callback(callback)
