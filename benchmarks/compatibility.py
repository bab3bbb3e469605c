"""The compatibility matrix (docs/compatibility.md): every strategy combination, run for two optimizer steps.

    python benchmarks/compatibility.py --launch single zero2-offload zero3-offload --out runs/compat.jsonl
    accelerate launch --num_processes 2 --config_file accelerate_configs/ddp4.yaml \\
        benchmarks/compatibility.py --launch ddp --out runs/compat.jsonl
    make compatibility                                  # the CPU cells, then docs/compatibility.md
    bash benchmarks/gpu_compatibility.sh single|multi   # the GPU cells, on the device machine

On a machine without a GPU the cells set use_cpu: true, and 2 processes train over gloo (accelerate launch's own
--cpu flag would start one process only).

A cell is precision x optimizer x launch x adapter x checkpointing (CELLS below). For each, this asks the
validator (parse_args + check_compatible, as recipes/train.py does) and then trains the tiny model for two steps
with the validator switched off, so the matrix shows both what the validator says and what really happens: a
refused cell carries its message *and* the error it saved the user from, and a test
(tests/benchmarks/test_compatibility.py) holds the validator to refusing exactly the cells that fail.

Starting Python costs ~10 s and a cell ~1 s, so one process loops over a launch's cells through
recipes.train.main, resetting the global state a run leaves behind; a distributed launch's processes loop over
the same cells in step. Each cell appends one JSON line as soon as it is done (benchmarks/compatibility_doc.py
renders the lines).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gc
import json
import logging
import math
import os
import platform
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import altscale.patches.bitsandbytes  # noqa: F401  (first: it quiets a bitsandbytes import-time warning)

import torch

from altscale.callbacks.results import append_json_line, git_commit, library_versions, read_records
from altscale.benchmarks.compatibility_matrix import (  # the matrix itself, shared with compatibility_doc.py
    BASE_WORDS, COLLECTIVE_TIMEOUT_S, DEEPSPEED_CONFIGS, DIED_TWICE, EXIT_RESTART, EXPECTED_OPTIMIZER,
    EXPECTED_STRATEGY, LAUNCHES, MATRIX_VERSION, NUM_PHOTOS, RAN_KEYS, RENDEZVOUS_TIMEOUT_S, STEPS, Cell,
    planned_cells, status_of)
from altscale.benchmarks.compatibility_verdicts import replay_verdict, validator_off, verdict
from recipes import train

# --- one cell -----------------------------------------------------------------------------------------------


def judge(cell: Cell, result: dict, processes: int) -> dict:
    """works, or failed with why, from what recipes.train.main returned: STEPS finite losses, and the launch and
    optimizer asked for, in the effective configuration (accelerate and DeepSpeed replace both without a word)."""
    record = result["record"]
    ran = {key: (record.get("effective_config") or {}).get(key) for key in RAN_KEYS}
    ran["adjusted"] = (record.get("config") or {}).get("adjusted") or {}  # values the recipe changed, with why
    losses = [entry["loss"] for entry in result["log_history"] if "loss" in entry]
    failed = {"status": "failed", "ran": ran, "losses": losses, "origin": None}
    if len(losses) != STEPS or not all(math.isfinite(loss) for loss in losses):
        return {**failed, "error": f"training ran but logged losses {losses}, not {STEPS} finite ones"}
    strategy = ran.get("strategy") or ""
    if not strategy.startswith(EXPECTED_STRATEGY[cell.launch]) or ran.get("world_size") != processes:
        return {**failed, "error": f"asked for {cell.launch} over {processes} process(es), but it ran as {strategy!r} "
                                   f"over {ran.get('world_size')}: the launch was replaced without a word"}
    expected_class, expected_options = EXPECTED_OPTIMIZER[cell.optimizer]
    options = ran.get("optimizer_options") or {}
    if ran["optimizer_class"] != expected_class or any(options.get(k) != v for k, v in expected_options.items()):
        return {**failed, "error": f"asked for optim {cell.optimizer} ({expected_class}), but "
                                   f"{ran['optimizer_class']} {options} stepped: the optimizer was replaced without a word"}
    return {"status": "works", "error": None, "ran": ran, "losses": losses}


def error_text(err: BaseException, limit: int = 2000) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    return text if len(text) <= limit else text[:limit] + " …"


def error_origin(err: BaseException) -> str | None:
    """Where the exception was raised: the innermost frame, as a path inside the repo or site-packages."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return None
    frame = frames[-1]
    path = frame.filename.split("site-packages/")[-1].replace(str(ROOT) + "/", "")
    return f"{path}:{frame.lineno} in {frame.name}"


def run_cell(cell: Cell, *, base_words: list[str], processes: int = 1, log_path: Path | None = None) -> dict:
    """The validator's verdict and the outcome of a two-step run without it; nothing raised escapes."""
    words = [*base_words, *cell.words()]
    start = time.perf_counter()
    environ = dict(os.environ)
    log = open(log_path, "w") if log_path else open(os.devnull, "w")
    try:
        with log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), library_logs_to(log):
            said = verdict(words)
            with validator_off():  # outside the try: a check that cannot be switched off stops the matrix
                try:
                    outcome = judge(cell, train.main(words), processes)
                except Exception as err:  # noqa: BLE001  (every failure is a result here, not a crash of the matrix)
                    outcome = {"status": "failed", "error": error_text(err), "origin": error_origin(err)}
                    print(traceback.format_exc())
    finally:
        reset_global_state(environ)
    if said["refused"] and outcome.get("error") == f"ConfigError: {said['message']}":
        # The run "without the validator" stopped where the validator did: a check VALIDATOR does not switch off
        # (add it there), unless transformers' own parser refuses the words, which then needs no check of ours.
        raise RuntimeError(f"{cell.key}: the run without the validator stopped with its message: {said['message']}")
    return {"verdict": said, "outcome": {**outcome, "seconds": round(time.perf_counter() - start, 2)}}


@contextlib.contextmanager
def library_logs_to(stream):
    """transformers' log handler keeps the stderr it was made with, which redirect_stderr does not reach."""
    handlers = [h for h in logging.getLogger("transformers").handlers if isinstance(h, logging.StreamHandler)]
    previous = [h.setStream(stream) for h in handlers]
    try:
        yield
    finally:
        for handler, old in zip(handlers, previous):
            handler.setStream(old)


def reset_global_state(environ: dict) -> None:
    """What one run leaves behind that would change the next: accelerate's singletons, transformers' DeepSpeed
    config (it decides whether models are built partitioned), environment variables, cached CUDA memory."""
    from accelerate.state import AcceleratorState, GradientState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    unset_hf_deepspeed_config()
    os.environ.clear()
    os.environ.update(environ)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


# --- where it runs ------------------------------------------------------------------------------------------


def where() -> dict:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    on_gpu = torch.cuda.is_available()
    return {
        "platform": "cuda" if on_gpu else "cpu",
        "device": torch.cuda.get_device_name() if on_gpu else f"cpu ({platform.machine()}, {os.cpu_count()} cores)",
        "processes": world,
        "bf16_supported": torch.cuda.is_bf16_supported() if on_gpu else None,
        # What accelerate launch handed the processes (its config, as variables): the validator reads some of it.
        "launch_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("ACCELERATE_", "FSDP_"))},
    }


def check_launch(launch: str, processes: int) -> None:
    """The cells must run under the launch they name: ddp/fsdp under accelerate with 2+ processes, FSDP's env set."""
    fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if launch in ("ddp", "fsdp") and processes < 2:
        raise SystemExit(f"--launch {launch} needs accelerate launch with --num_processes 2 (or more)")
    if (launch == "fsdp") != fsdp:
        raise SystemExit(f"--launch {launch} under ACCELERATE_USE_FSDP={fsdp}: launch FSDP cells, and only them, "
                         "with an FSDP accelerate config (accelerate_configs/fsdp4.yaml)")
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true" and launch not in DEEPSPEED_CONFIGS:
        raise SystemExit(f"--launch {launch} under a DeepSpeed accelerate config: launch only ZeRO cells with it")
    if launch == "single" and (processes != 1 or "LOCAL_RANK" in os.environ):
        raise SystemExit("--launch single runs in a plain process (python benchmarks/compatibility.py): under a "
                         "launcher, even with one process, accelerate sets up torch.distributed")


class Ranks:
    """The processes of one launch, kept in step: each rank's outcome of a cell, gathered on every rank.

    The gathering has a gloo group of its own, so that it works whatever backend training uses, and a short
    timeout: ranks that both finished a cell arrive within moments of each other, while a rank that failed alone
    would otherwise wait for partners stuck in a collective it left (see main).
    """

    def __init__(self) -> None:
        self.group = None
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            import torch.distributed as dist

            if not dist.is_initialized():
                # As accelerate would (nccl or gloo, ddp_timeout), but before the first cell, which may fail before
                # TrainingArguments sets it up; accelerate and DeepSpeed then find it initialised and keep it.
                backend = "nccl" if torch.cuda.is_available() else "gloo"
                if torch.cuda.is_available():
                    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
                dist.init_process_group(backend=backend, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
            self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=RENDEZVOUS_TIMEOUT_S))
        self.rank = int(os.environ.get("RANK", "0"))

    def gather(self, value: dict) -> list[dict]:
        if self.group is None:
            return [value]
        import torch.distributed as dist

        values: list = [None] * dist.get_world_size()
        dist.all_gather_object(values, value, group=self.group)
        return values

    def barrier(self) -> None:
        if self.group is not None:
            import torch.distributed as dist

            dist.barrier(group=self.group)

    def healthy(self) -> bool:
        """Whether training's process group still works on every rank. After a collective timed out, gloo closes
        its connections and every later cell would fail the same way (NCCL kills the process itself)."""
        if self.group is None:
            return True
        import torch.distributed as dist

        try:
            dist.all_reduce(torch.ones(1, device="cuda" if torch.cuda.is_available() else "cpu"))
            ok = True
        except Exception:  # noqa: BLE001  (any failure of the probe means the group is unusable)
            ok = False
        return all(value["ok"] for value in self.gather({"ok": ok}))


def merge_ranks(per_rank: list[dict]) -> dict:
    """One line per cell: rank 0's result; failed if any rank failed, with every distinct error, the ranks that
    only timed out waiting for the one that failed first listed last (theirs is the symptom, not the cause)."""
    merged = dict(per_rank[0])
    failed = [(rank, r["outcome"]) for rank, r in enumerate(per_rank) if r["outcome"]["status"] != "works"]
    errors = {outcome["error"] for _, outcome in failed}
    if len(errors) > 1 or (failed and merged["outcome"]["status"] == "works"):
        failed.sort(key=lambda item: "timed out" in str(item[1]["error"]).lower())
        merged["outcome"] = {**failed[0][1], "error": " | ".join(
            f"rank {rank}: {outcome['error']}" for rank, outcome in failed)}
    verdicts = {r["verdict"]["message"] for r in per_rank}
    if len(verdicts) > 1:  # the validator must not depend on the rank; say so rather than pick one
        merged["verdict"] = {"refused": True, "message": "ranks disagree: " + " | ".join(map(str, verdicts))}
    return merged


# --- the loop -----------------------------------------------------------------------------------------------


def make_photos(path: Path) -> None:
    """The cells' photos, written once; a lock, because the GPU script starts several launches side by side."""
    from altscale.data.synthetic import make_synthetic_dataset

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / "photos.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path / "dataset_dict.json").is_file():
            make_synthetic_dataset(path, num_train=NUM_PHOTOS, num_test=2, seed=0, size=64)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launch", nargs="+", required=True, choices=LAUNCHES,
                        help="Launches whose cells to run; distributed ones one at a time, under accelerate launch.")
    parser.add_argument("--out", required=True, help="JSONL file each cell's line is appended to (rank 0 writes).")
    parser.add_argument("--work-dir", default="runs/compatibility", help="Photos, per-cell logs and scratch output.")
    parser.add_argument("--only", nargs="*", default=None, help="Run only cells whose key contains one of these.")
    parser.add_argument("--shard", default="1/1", help="i/n: run every n-th cell from the i-th (1-based), so that n "
                        "launches side by side share a launch's cells (the GPU script).")
    parser.add_argument("--cell-timeout-s", type=float, default=120,
                        help="A cell still running after this ends the launch (a hang); see --resume.")
    parser.add_argument("--resume", action="store_true",
                        help="Skip the cells --out holds for this machine and process count. The cell a launch died "
                             "in is run once more; dying in it twice is recorded as its failure, with where each "
                             "rank was.")
    args = parser.parse_args(argv)

    shard, shards = (int(part) for part in args.shard.split("/"))
    ranks = Ranks()
    setup = where()
    for launch in args.launch:
        check_launch(launch, setup["processes"])
    work = Path(args.work_dir)
    photos = work / "photos"
    if ranks.rank == 0:
        make_photos(photos)
    ranks.barrier()
    group_work = group_dir(work, setup, args.launch, args.shard)
    rank_work = group_work / f"rank{ranks.rank}"
    (rank_work / "logs").mkdir(parents=True, exist_ok=True)
    base_words = [*BASE_WORDS, "--dataset_path", str(photos), "--output_dir", str(rank_work / "out"),
                  "--results_file", str(rank_work / "results.jsonl")]
    if setup["platform"] == "cpu":
        base_words += ["--use_cpu", "true"]
    context = {"matrix_version": MATRIX_VERSION, "command": " ".join(sys.argv), "versions": library_versions(),
               "git_commit": git_commit(ROOT), "git_dirty": git_dirty(), "python": platform.python_version()}

    def write(cell: Cell, merged: dict) -> dict:
        line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cell": asdict(cell), "key": cell.key,
                "words": cell.words(), **setup, **merged, **context}
        append_json_line(args.out, line)
        return line

    cells = [cell for launch in args.launch for cell in planned_cells(launch, setup["platform"], setup["processes"])
             if args.only is None or any(part in cell.key for part in args.only)][shard - 1::shards]
    marker = group_work / "current-cell.txt"  # "<key> <attempt>": the cell in progress, what a dead launch was doing
    attempts = {}
    if args.resume:
        done = done_keys(Path(args.out), setup)
        died_in, died_attempt = marker.read_text().split() if marker.is_file() else (None, "0")
        cell = next((cell for cell in cells if cell.key == died_in and died_in not in done), None)
        alone = [json.loads(path.read_text()) for path in sorted(group_work.glob("rank*/failed-alone.json"))]
        alone = [result for result in alone if result["key"] == died_in]
        ranks.barrier()  # every rank has read the files before rank 0 removes them
        if ranks.rank == 0:
            for path in group_work.glob("rank*/failed-alone.json"):
                path.unlink()
        if cell is not None and alone:  # a rank failed alone: its error is the cell's, no second try needed
            if ranks.rank == 0:
                error = " | ".join(f"rank {result['rank']}: {result['outcome']['error']}" for result in alone)
                write(cell, {"verdict": alone[0]["verdict"], "replay_agrees": alone[0]["replay_agrees"], "outcome": {
                    **alone[0]["outcome"], "error": f"{error} (the other ranks, left waiting in a collective, "
                                                    "were stopped)"}})
            done.add(cell.key)
        elif cell is not None and int(died_attempt) >= 2:  # on every rank, so that all skip it and stay in step
            said = verdict([*base_words, *cell.words()])
            if ranks.rank == 0:
                write(cell, {"verdict": said, "outcome": {
                    "status": "failed", "seconds": None, "origin": None,
                    "error": f"{DIED_TWICE} (a hang: no progress for {args.cell_timeout_s:g} s, or a crash); "
                             + where_it_died(group_work, cell)}})
            done.add(cell.key)
        elif cell is not None:
            attempts[cell.key] = 2  # once more, first: a one-off (a slow start, a race) should not fail the cell
            cells.remove(cell)
            cells.insert(0, cell)
        cells = [cell for cell in cells if cell.key not in done]
    for number, cell in enumerate(cells, 1):
        if ranks.rank == 0:
            marker.write_text(f"{cell.key} {attempts.get(cell.key, 1)}")
        with CellWatchdog(args.cell_timeout_s, rank_work / "hang.txt"):
            result = run_cell(cell, base_words=base_words, processes=setup["processes"],
                              log_path=rank_work / "logs" / log_name(cell))
        # The replay the page and the tests rely on, checked here on the machine that knows the real verdict.
        replayed = replay_verdict({**setup, "words": cell.words(), "versions": context["versions"]}, base_words)
        result["replay_agrees"] = replayed == result["verdict"]
        try:
            merged = merge_ranks(ranks.gather(result))
        except Exception:  # noqa: BLE001  (the others did not come: stuck in a collective this rank left by failing)
            # Ending this process makes the launcher stop them at once, instead of after NCCL's timeout; the next
            # launch (--resume) writes the line from this file.
            (rank_work / "failed-alone.json").write_text(json.dumps({"key": cell.key, "rank": ranks.rank, **result},
                                                                    default=str))
            os._exit(EXIT_RESTART)
        if ranks.rank == 0:
            line = write(cell, merged)
            print(f"[{number}/{len(cells)}] {setup['platform']} x{setup['processes']} {cell.key}: "
                  f"{status_of(line)} ({merged['outcome']['seconds']} s)", flush=True)
        if not ranks.healthy():
            if ranks.rank == 0:
                marker.unlink(missing_ok=True)
                print("the launch's process group broke in this cell: a new launch with --resume goes on from the "
                      "next", file=sys.stderr)
            return EXIT_RESTART
    if ranks.rank == 0:
        marker.unlink(missing_ok=True)
    return 0


class CellWatchdog:
    """Ends the process when a cell runs past `limit_s`, having written where its main thread was.

    A collective whose partner is gone, or a deadlock, would otherwise hold the launch until NCCL's watchdog takes
    the process down (the collective timeout, then as long again to dump its traces): minutes, where the GPU parts
    have a few in all. The launcher then stops every rank, and the next launch (--resume) runs the cell once more.
    """

    def __init__(self, limit_s: float, report: Path) -> None:
        self.limit_s, self.report = limit_s, report
        self.main_thread = threading.get_ident()
        self.timer: threading.Timer | None = None

    def __enter__(self):
        self.report.unlink(missing_ok=True)
        self.timer = threading.Timer(self.limit_s, self.fire)
        self.timer.daemon = True
        self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.timer.cancel()

    def fire(self) -> None:
        frame = sys._current_frames().get(self.main_thread)
        stack = "".join(traceback.format_stack(frame)[-4:]) if frame is not None else "(no stack)\n"
        self.report.write_text(f"still running after {self.limit_s:g} s, at:\n{stack}")
        os._exit(EXIT_RESTART)


def where_it_died(group_work: Path, cell: Cell) -> str:
    """Each rank's last stack (from CellWatchdog) or, without one (a crash), the end of its log."""
    parts = []
    for rank_dir in sorted(group_work.glob("rank*")):
        hang = rank_dir / "hang.txt"
        log = rank_dir / "logs" / log_name(cell)
        if hang.is_file():
            text = hang.read_text().strip().splitlines()
        else:
            text = [line for line in (log.read_text(errors="replace") if log.is_file() else "").splitlines()
                    if line.strip()][-5:] or ["(no log)"]
        parts.append(f"[{rank_dir.name}] " + " | ".join(line.strip() for line in text))
    return " ".join(parts)


def group_dir(work: Path, setup: dict, launches: list[str], shard: str) -> Path:
    """One folder per launch group, shard and rank: the GPU script runs several at once."""
    return work / f"{setup['platform']}-x{setup['processes']}-{'+'.join(launches)}-{shard.replace('/', 'of')}"


def git_dirty() -> bool | None:
    """Whether tracked files differ from git_commit: the run then tested code no commit holds. The matrix's own
    outputs do not count: `make compatibility` rewrites them while it runs."""
    try:
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                 ":!benchmarks/results", ":!docs/compatibility.md"], cwd=ROOT,
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(status.stdout.strip()) if status.returncode == 0 else None


def log_name(cell: Cell) -> str:
    return cell.key.replace("/", "_") + ".log"


def done_keys(path: Path, setup: dict) -> set[str]:
    return {r["key"] for r in read_records(path)
            if (r["platform"], r["processes"]) == (setup["platform"], setup["processes"])}


if __name__ == "__main__":
    sys.exit(main())
