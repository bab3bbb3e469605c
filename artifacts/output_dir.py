"""The output folder: never overwritten by accident, resumed from by name, and written to atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from altscale.config.errors import ConfigError

# What a finished run leaves behind (Trainer.save_model); checkpoint-* folders are the other kind of work.
SAVED_MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
RESUME_LAST = "last"


def write_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` so that a reader (or a crash) sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on POSIX within one file system, hence the temp file beside the target
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, value) -> None:
    write_atomic(path, json.dumps(value, indent=2, default=str) + "\n")


def checkpoints(output_dir: str | Path) -> list[Path]:
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if p.is_dir())


def holds_work(output_dir: str | Path) -> bool:
    """True if `output_dir` holds a saved model or a checkpoint: work a new run would overwrite."""
    folder = Path(output_dir)
    return any((folder / name).exists() for name in SAVED_MODEL_FILES) or bool(checkpoints(folder))


def output_dir_problems(output_dir: str, *, overwrite_output_dir: bool, resume_from_checkpoint: str | None) -> list[str]:
    """Problems with where the run writes and what it resumes from, as lines for check_compatible."""
    problems = []
    if resume_from_checkpoint is None:
        if holds_work(output_dir) and not overwrite_output_dir:
            problems.append(
                f"output_dir: {output_dir} already holds a saved model or checkpoints; set overwrite_output_dir: true "
                "to replace them, resume_from_checkpoint: last to continue that run, or pick another output_dir"
            )
    elif resume_from_checkpoint == RESUME_LAST:
        if not checkpoints(output_dir):
            problems.append(
                f"resume_from_checkpoint: last but output_dir {output_dir} holds no checkpoint-* folder; "
                "drop resume_from_checkpoint to start afresh, or point output_dir at the interrupted run's folder"
            )
    elif not Path(resume_from_checkpoint).is_dir():
        problems.append(
            f"resume_from_checkpoint: {resume_from_checkpoint} is not a folder; give a checkpoint-* folder "
            "or say last for the newest one in output_dir"
        )
    return problems


def resolve_checkpoint(output_dir: str, resume_from_checkpoint: str | None) -> str | None:
    """The checkpoint folder to resume from: `last` means the newest checkpoint-* in output_dir."""
    if resume_from_checkpoint == RESUME_LAST:
        return get_last_checkpoint(output_dir)
    return resume_from_checkpoint


def remove_old_checkpoints(output_dir: str) -> list[Path]:
    """With overwrite_output_dir, drop the previous run's checkpoint-* folders.

    Left in place, a newer run's `resume_from_checkpoint: last` would pick the old run's higher-numbered
    checkpoint. The saved model files need no removal: the new run's save replaces them.
    """
    old = checkpoints(output_dir)
    for folder in old:
        shutil.rmtree(folder)
    return old


def prepare_output_dir(args) -> str | None:
    """Just before training: clear an overwritten run's checkpoints, and name the checkpoint to resume from.

    check_compatible has already refused a folder holding work unless one of the two flags is set.
    """
    training = args.training
    if training.resume_from_checkpoint is not None:
        return resolve_checkpoint(training.output_dir, training.resume_from_checkpoint)
    if args.strategy.overwrite_output_dir and training.process_index == 0:
        removed = remove_old_checkpoints(training.output_dir)
        if removed:
            print(f"overwrite_output_dir: removed {len(removed)} old checkpoint folders from {training.output_dir}")
    return None
