"""Run the single-GPU experiment ladder (recipes/ladder.txt), each step in its own process, and tabulate it.

    python benchmarks/ladder.py [NAME ...] [--bench] [--results-file runs/ladder.jsonl]
    make ladder [LADDER="opt27-bf16 xxl-qlora"] [BENCH=1]

A step that runs out of memory exits with code 3 and the ladder goes on; its own process dies with it,
so a fragmented allocator cannot poison the next step. --bench stops each step after a few optimizer
steps (past step 1, where memory reaches its steady state) and skips saving the model.
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from altscale.benchmarks.tables import HEADER, aligned, rows
from altscale.callbacks.results import read_records
from altscale.config.arguments import load_recipe

LADDER_FILE = ROOT / "recipes" / "ladder.txt"
BENCH_OVERRIDES = ["--max_steps", "3", "--save_model", "false"]
EXIT_STATUS = {0: "ok", 2: "config error", 3: "oom"}


def ladder_names(path: Path = LADDER_FILE) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def step_command(name: str, *, results_file: str, bench: bool, launcher: list[str]) -> list[str]:
    recipe = ROOT / "recipes" / "blip2" / f"{name}.yaml"
    extra = BENCH_OVERRIDES if bench else []
    # A recipe's own max_steps (e.g. the ZeRO offload step) is shorter than the bench default: keep it.
    if bench and "max_steps" in load_recipe(recipe):
        extra = ["--save_model", "false"]
    return [*launcher, str(ROOT / "recipes" / "train.py"), str(recipe), "--results_file", results_file, *extra]


def run_step(command: list[str], log_path: Path, timeout_s: float) -> tuple[int, float]:
    """Run one step, its output teed to the console and to `log_path`; returns (exit code, seconds)."""
    start = time.perf_counter()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        try:
            for line in process.stdout:
                sys.stdout.write(line)
                log.write(line)
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            code = -9
    return code, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="Steps to run, in this order (default: all of recipes/ladder.txt).")
    parser.add_argument("--bench", action="store_true", help="Stop each step after 3 optimizer steps; do not save.")
    parser.add_argument("--results-file", default="runs/ladder.jsonl")
    parser.add_argument("--log-dir", default="runs/ladder-logs")
    parser.add_argument("--accelerate-config", default=None, help="Launch each step with accelerate and this config.")
    parser.add_argument("--timeout-s", type=float, default=1800, help="A step still running after this is killed.")
    args = parser.parse_args(argv)

    known = ladder_names()
    names = args.names or known
    unknown = [name for name in names if name not in known]
    if unknown:
        print(f"error: not in {LADDER_FILE.relative_to(ROOT)}: {', '.join(unknown)}; steps are: {' '.join(known)}",
              file=sys.stderr)
        return 2
    # One process on one GPU needs no launcher; accelerate's would also turn the script's exit code into 1.
    launcher = ["accelerate", "launch", "--config_file", args.accelerate_config] if args.accelerate_config else [sys.executable]
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    results = Path(args.results_file)
    results.parent.mkdir(parents=True, exist_ok=True)
    outcomes = []
    for name in names:
        command = step_command(name, results_file=args.results_file, bench=args.bench, launcher=launcher)
        print(f"\n=== {name}: {' '.join(command)}", flush=True)
        before = len(read_records(results))
        code, seconds = run_step(command, Path(args.log_dir) / f"{name}.log", args.timeout_s)
        written = [r for r in read_records(results)[before:] if r["recipe"] == name]
        outcomes.append((name, code, seconds, written[-1] if written else None))
    print_table(outcomes)
    return 0


def print_table(outcomes: list[tuple[str, int, float, dict | None]]) -> None:
    """One row per step: the record the step wrote, or its exit code when it wrote none (killed, refused)."""
    table = []
    for name, code, seconds, record in outcomes:
        if record is not None:
            table.append([*rows([record])[0], f"{seconds:.0f}"])
        else:
            status = EXIT_STATUS.get(code, f"exit {code}")
            table.append([name, status, *["n/a"] * (len(HEADER) - 2), f"{seconds:.0f}"])
    header = [*HEADER, "wall s"]
    print("\nladder (memory in GiB on rank 0 after step 1's optimizer step, or the last snapshot before an OOM):")
    print(aligned(header, table))

if __name__ == "__main__":
    sys.exit(main())
