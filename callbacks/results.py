"""One JSON line per run in the results file, written by rank 0 after gathering every rank's snapshots.

A run that failed (OOM, error) is written by each failing rank on its own: see `write_run_record`.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from altscale.callbacks.memory import MemoryCallback, communication_buffers
from altscale.callbacks.summary import RunSummaryCallback, device_name

LIBRARIES = ("torch", "transformers", "accelerate", "peft", "deepspeed", "bitsandbytes")


def library_versions() -> dict[str, str | None]:
    """Installed versions (from package metadata, so deepspeed is not imported just to ask)."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit(path: str | Path = ".") -> str | None:
    """HEAD of the git repository holding `path`, or None outside one (or without git)."""
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def append_json_line(path: str | Path, record: dict[str, Any]) -> None:
    """Appends one line under an exclusive lock, in a single write, then fsyncs: safe with several writers."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every record in a results file, oldest first; none when the file does not exist yet."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _find(trainer: Any, kind: type) -> Any:
    return next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, kind)), None)


def _gather(local: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's `local`, in rank order; every rank must call this (it is a collective when distributed)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        gathered: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, local)
        return gathered
    return [local]


def _error_text(error: BaseException | str | None) -> str | None:
    if error is None:
        return None
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {error}"
    return str(error)


def write_run_record(trainer: Any, *, status: str, recipe: str, config: dict[str, Any] | None = None,
                     error: BaseException | str | None = None, results_file: str | Path | None = None) -> dict[str, Any]:
    """Builds the run's record on every rank, appends it to the results file on rank 0, and returns it.

    Call it on every rank (it gathers through torch.distributed when that is initialised). A failed run
    (status oom or error) does not gather: the failing rank cannot know whether the others are still blocked in
    a collective of the step it left (an OOM on one GPU), where a gather would wait for the process group's
    timeout (30 minutes); each failing rank appends its own record instead (`ranks_recorded` says whose). `config`
    holds the recipe's other argument groups as dicts; TrainingArguments.to_dict() is added as
    "training_args". `results_file` defaults to the one given to build_callbacks.
    """
    if status not in ("ok", "oom", "error", "interrupted"):
        raise ValueError(f"status must be 'ok', 'oom', 'error' or 'interrupted', got {status!r}")
    memory = _find(trainer, MemoryCallback)
    summary_cb = _find(trainer, RunSummaryCallback)
    args = trainer.args
    local = {
        "rank": args.process_index,
        "summary": summary_cb.summary() if summary_cb is not None else None,
        "snapshots": memory.rows if memory is not None else [],
        "comm_buffers": communication_buffers(getattr(trainer, "model_wrapped", None)),
    }
    # "interrupted" is safe to gather: InterruptCallback stops every rank at the same step.
    ranks = [local] if status in ("oom", "error") else _gather(local)
    effective = summary_cb.effective_config if summary_cb is not None else None
    record = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "recipe": recipe,
        "status": status,
        "error": _error_text(error),
        "strategy": effective.get("strategy") if effective else None,
        "world_size": args.world_size,
        "device_name": device_name(),
        "versions": library_versions(),
        "git_commit": git_commit(Path(__file__).resolve().parent),
        "config": {"training_args": args.to_dict(), **(config or {})},
        "summary": ranks[0]["summary"],
        "summary_per_rank": [r["summary"] for r in ranks],
        "ranks_recorded": [r["rank"] for r in ranks],
        "comm_buffers_per_rank": [r["comm_buffers"] for r in ranks],
        # What CUDA graphs captured and replayed (recipes/cuda_graphs.py); None when the recipe did not ask.
        "cuda_graphs": graphed.report() if (graphed := getattr(trainer, "graphed_steps", None)) is not None else None,
        "effective_config": effective,
        "last_phase": {"step": memory.last_step, "phase": memory.last_phase} if memory is not None else None,
        "snapshots": [row for r in ranks for row in r["snapshots"]],
    }
    if args.process_index == 0 or status in ("oom", "error"):
        path = results_file or (summary_cb.results_file if summary_cb is not None else "runs/results.jsonl")
        append_json_line(path, record)
    return record
