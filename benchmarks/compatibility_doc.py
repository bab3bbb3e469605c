"""Render docs/compatibility.md from the compatibility matrix's JSONL files (benchmarks/compatibility.py).

    python benchmarks/compatibility_doc.py [FILE.jsonl ...] [--out docs/compatibility.md]

Default input: every benchmarks/results/*-compatibility*.jsonl (CPU and GPU runs merged); a later line for the
same cell, platform and process count replaces an earlier one. What happened to a cell comes from its line; what
the validator says is today's verdict, replayed on the line's recorded facts (compatibility_verdicts.py), so the
page follows the checks without a new GPU run. A cell the plan gives a machine but no line records reads "not run
yet". The output depends on the lines and the code only (no clock), so a test can check the page is up to date.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from altscale.benchmarks.compatibility_matrix import (
    ADAPTERS, BASE_WORDS, CHECKPOINTING, DEEPSPEED_CONFIGS, LAUNCHES, OPTIMIZERS, PLAN, PRECISIONS, Cell, cells_for,
    planned_cells, status_of, unplanned)
from altscale.benchmarks.compatibility_verdicts import memoized_validator, replay_verdict
from altscale.callbacks.results import read_records

RESULTS_GLOB = "benchmarks/results/*-compatibility*.jsonl"
DOC = ROOT / "docs" / "compatibility.md"
PLATFORM_NAMES = {"cpu": "CPU", "cuda": "GPU (CUDA)"}
RUN_COMMANDS = {
    ("cpu", 1): "make compatibility", ("cpu", 2): "make compatibility",
    ("cuda", 1): "bash benchmarks/gpu_compatibility.sh single", ("cuda", 2): "bash benchmarks/gpu_compatibility.sh multi",
}
LAUNCH_NOTES = {
    "single": "one process, no launcher: `python recipes/train.py recipe.yaml`",
    "ddp": "`accelerate launch --config_file accelerate_configs/ddp4.yaml --num_processes 2`; on the CPU with "
           "`use_cpu: true`, over gloo",
    "fsdp": "`accelerate launch --config_file accelerate_configs/fsdp4.yaml --num_processes 2`; on the CPU with "
            "`use_cpu: true`",
    "zero2-offload": "`accelerate launch --config_file accelerate_configs/zero2_offload4.yaml --num_processes 1` or "
                     f"`2`, the recipe naming the same `deepspeed: {DEEPSPEED_CONFIGS['zero2-offload']}`; on the CPU "
                     "one plain process",
    "zero3-offload": "`accelerate launch --config_file accelerate_configs/zero3_offload4.yaml --num_processes 1` or "
                     f"`2`, the recipe naming the same `deepspeed: {DEEPSPEED_CONFIGS['zero3-offload']}`; on the CPU "
                     "one plain process",
}
ADAPTER_NAMES = {"full": "full", "lora": "LoRA", "qlora": "QLoRA"}
DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.uint8": "uint8 (4-bit)"}
SETUP = tuple[str, int]  # (platform, processes)


def load(paths: list[Path]) -> dict[tuple[str, int, str], dict]:
    """The last line per (platform, processes, cell key), files in the order given and lines in file order."""
    latest = {}
    for path in paths:
        for line in read_records(path):
            latest[(line["platform"], line["processes"], line["key"])] = line
    return latest


def with_todays_verdicts(lines: dict) -> dict:
    """Each line with today's verdict on its cell as `verdict` (the one recorded when it ran: `verdict_recorded`)."""
    with tempfile.TemporaryDirectory() as work, memoized_validator():
        base = [*BASE_WORDS, "--dataset_path", f"{work}/photos", "--output_dir", f"{work}/out", "--results_file",
                f"{work}/results.jsonl"]
        return {key: {**line, "verdict_recorded": line["verdict"], "verdict": replay_verdict(line, base)}
                for key, line in lines.items()}


def code_book(lines: dict) -> dict[tuple[str, str], str]:
    """A short code per distinct reason: R (refused, by message), F (failed, by error), W (refused but works),
    H (the launch died once in the cell)."""
    prefixes = {"refused": "R", "failed": "F", "refused-but-works": "W", "hung": "H"}
    codes: dict[tuple[str, str], str] = {}
    counters: Counter = Counter()
    for line in sorted(lines.values(), key=lambda line: (line["platform"], line["processes"], line["key"])):
        status = status_of(line)
        if status == "works":
            continue
        reason = reason_of(line)
        if (status, reason) not in codes:
            counters[status] += 1
            codes[(status, reason)] = f"{prefixes[status]}{counters[status]}"
    return codes


def reason_of(line: dict) -> str:
    if line["verdict"]["refused"] and status_of(line) != "hung":
        return line["verdict"]["message"]
    return first_line(line["outcome"]["error"])


def first_line(text: str | None, limit: int = 300) -> str:
    lines = (text or "").strip().splitlines()
    text = lines[0] if lines else ""
    return text if len(text) <= limit else text[:limit] + " …"


def entry(line: dict | None, codes: dict) -> str:
    if line is None:
        return "not run yet"
    status = status_of(line)
    if status == "works":
        return "works"
    code = codes[(status, reason_of(line))]
    return code if status == "refused" else f"**{code}**"  # bold: the validator and the run disagree


# --- sections -----------------------------------------------------------------------------------------------


def header(lines: dict, paths: list[Path]) -> list[str]:
    times = sorted(line["time"] for line in lines.values())
    when = f"{times[0][:10]} to {times[-1][:10]}" if times and times[0][:10] != times[-1][:10] else (
        times[0][:10] if times else "no runs yet")
    return [
        "# Compatibility matrix",
        "",
        "Which combinations of precision, optimizer, launch, adapter and activation checkpointing train, measured by "
        "training each one: the tiny BLIP-2 (`blip2-tiny-opt`, 64-px synthetic photos, batch 2 per process) for two "
        "optimizer steps, on a CPU machine and on a GPU machine (see where each part ran). "
        f"Runs of {when}; generated by `python benchmarks/compatibility_doc.py` from "
        + ", ".join(f"`{shown(path)}`" for path in paths)
        + " — do not edit by hand (a test renders the files again and compares).",
        "",
        "Each cell was trained with the validator (`parse_args` + `check_compatible`, what `recipes/train.py` does "
        "before loading a weight) switched off, so a refusal is shown beside the error it spares you. The verdicts "
        "are today's validator's, replayed on each cell's recorded machine and launch "
        "(`benchmarks/compatibility_verdicts.py`; the runner checks that replay against the real verdict as it "
        "runs, `replay_agrees` in the lines):",
        "",
        "- works: two optimizer steps, finite losses, and the launch and the optimizer that ran are the ones "
        "asked for.",
        "- R1, R2, …: refused by the validator with that message (listed below), and the run without the validator "
        "failed too.",
        "- **F1**, … (bold): the validator let it through and the run failed: a gap in the validator.",
        "- **W1**, … (bold): refused, yet the run without the validator worked: the validator is too strict.",
        "- **H1**, … (bold): the launch died in this cell once, in a run from before a cell got a second try: "
        "inconclusive until the next run of that part.",
        "- not run yet: the machine this cell is planned on has not recorded it; —: not planned (the reason is "
        "under the table).",
        "",
        "A run \"fails\" when it raises, logs a non-finite loss, or trains under another launch or steps another "
        "optimizer than the one asked for (accelerate runs FSDP as DDP on the CPU, DeepSpeed replaces `optim`, both "
        "without a word). `tests/benchmarks/test_compatibility.py` holds the validator "
        "to these results: it refuses exactly the cells marked R, and a change to it that would refuse a working "
        "cell, or let a failing one through, fails the tests.",
        "",
    ]


def shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def axes() -> list[str]:
    def keys(cell: Cell) -> list[str]:
        words = cell.words()
        return [f"`{words[i][2:]}: {words[i + 1]}`" for i in range(0, len(words), 2)]

    full = keys(Cell("32-true", "sgd", "single", "full", False))
    rows = ["## The axes", "", "| axis | value | recipe keys |", "| --- | --- | --- |"]
    rows += [f"| precision | {p} | `precision: {p}` |" for p in PRECISIONS]
    for optim in OPTIMIZERS:
        if optim == "deepspeed_cpu_adam":
            rows.append("| optimizer | deepspeed_cpu_adam | under a ZeRO launch: no `optim` (the config's optimizer "
                        "section builds DeepSpeedCPUAdam); elsewhere `optim: deepspeed_cpu_adam` |")
        else:
            rows.append(f"| optimizer | {optim} | `optim: {optim}` |")
    rows += [f"| launch | {launch} | {LAUNCH_NOTES[launch]} |" for launch in LAUNCHES]
    for adapter in ADAPTERS:
        added = [key for key in keys(Cell("32-true", "sgd", "single", adapter, False)) if key not in full]
        rows.append(f"| adapter | {ADAPTER_NAMES[adapter]} | {', '.join(added) or '(none)'} |")
    rows += ["| checkpointing | ckpt | `gradient_checkpointing: true` (off: `false`) |", ""]
    rows += ["Every cell also sets `model_name_or_path: blip2-tiny-opt`, `max_steps: 2`, "
             "`per_device_train_batch_size: 2`, `eval_size: 0`, `save_model: false` (and `use_cpu: true` on the "
             "CPU): `BASE_WORDS` in `benchmarks/compatibility.py`.", ""]
    return rows


def where(lines: dict) -> list[str]:
    rows = ["## Where each part ran", "",
            "| machine | processes | device | runs | cells recorded | versions | commit | run with |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (platform, processes), launches in PLAN.items():
        mine = [line for (p, n, _), line in lines.items() if (p, n) == (platform, processes)]
        planned = sum(len(planned_cells(launch, platform, processes)) for launch in launches)
        if not mine:
            rows.append(f"| {PLATFORM_NAMES[platform]} | {processes} | — | not run yet | 0 of {planned} | — | — | "
                        f"`{RUN_COMMANDS[(platform, processes)]}` |")
            continue
        devices = ", ".join(sorted({line["device"] for line in mine}))
        times = sorted(line["time"] for line in mine)
        versions = sorted({version_text(line) for line in mine})
        commits = ", ".join(sorted({(line.get("git_commit") or "?")[:7] + ("+" if line.get("git_dirty") else "")
                                    for line in mine}))
        rows.append(f"| {PLATFORM_NAMES[platform]} | {processes} | {devices} | {times[0][:16]} to {times[-1][11:16]} "
                    f"| {len(mine)} of {planned} | {'; '.join(versions)} | {commits} | `{RUN_COMMANDS[(platform, processes)]}` |")
    if any(line.get("git_dirty") for line in lines.values()):
        rows += ["", "A commit marked `+` had uncommitted changes to tracked files when the cells ran."]
    commands = sorted({(line["platform"], line["processes"], line["command"]) for line in lines.values()})
    if commands:
        rows += ["", "The runner's own command lines, as recorded (under `accelerate launch` for 2 processes):", ""]
        rows += [f"- {PLATFORM_NAMES[p]}, {n} process{'es' if n > 1 else ''}: `{c}`" for p, n, c in commands]
    return rows + [""]


def version_text(line: dict) -> str:
    names = ("torch", "transformers", "accelerate", "peft", "bitsandbytes", "deepspeed")
    versions = line.get("versions") or {}
    return ", ".join(f"{name} {versions.get(name) or '—'}" for name in names) + f", python {line.get('python', '?')}"


def counts(lines: dict) -> list[str]:
    statuses = ("works", "refused", "failed", "refused-but-works", "hung", "not run yet", "not planned")
    rows = ["## Counts", "", "| machine | processes | " + " | ".join(statuses) + " |",
            "| --- | --- | " + " | ".join("---" for _ in statuses) + " |"]
    for (platform, processes), launches in PLAN.items():
        tally = Counter()
        for launch in launches:
            for cell in cells_for(launch):
                line = lines.get((platform, processes, cell.key))
                if unplanned(cell, platform, processes):
                    tally["not planned"] += 1
                else:
                    tally[status_of(line) if line else "not run yet"] += 1
        rows.append(f"| {PLATFORM_NAMES[platform]} | {processes} | " + " | ".join(str(tally[s]) for s in statuses) + " |")
    return rows + [""]


def launch_tables(lines: dict, codes: dict) -> list[str]:
    columns = [(adapter, ckpt) for adapter in ADAPTERS for ckpt in CHECKPOINTING]
    names = [ADAPTER_NAMES[a] + (" + ckpt" if c else "") for a, c in columns]
    rows = []
    for launch in LAUNCHES:
        rows += [f"## {launch}", "", LAUNCH_NOTES[launch][0].upper() + LAUNCH_NOTES[launch][1:] + ".", ""]
        for (platform, processes), launches in PLAN.items():
            if launch not in launches:
                continue
            title = f"{PLATFORM_NAMES[platform]}, {processes} process{'es' if processes > 1 else ''}"
            why_not = {unplanned(cell, platform, processes) for cell in cells_for(launch)} - {None}
            table = {(cell.precision, cell.optimizer, cell.adapter, cell.checkpointing):
                     "—" if unplanned(cell, platform, processes) else entry(lines.get((platform, processes, cell.key)), codes)
                     for cell in cells_for(launch)}
            if len(set(table.values())) == 1:
                what = "not planned: " + next(iter(why_not)) if why_not else next(iter(table.values()))
                rows += [f"**{title}**: all {len(table)} cells: {what}.", ""]
                continue
            rows += [f"**{title}**", "", "| precision | optimizer | " + " | ".join(names) + " |",
                     "| --- | --- | " + " | ".join("---" for _ in names) + " |"]
            for precision in PRECISIONS:
                for optim in OPTIMIZERS:
                    rows.append(f"| {precision} | {optim} | "
                                + " | ".join(table[(precision, optim, a, c)] for a, c in columns) + " |")
            rows += [""] + [f"—: not planned: {reason}." for reason in sorted(why_not)] + ([""] if why_not else [])
    return rows


def reasons(lines: dict, codes: dict) -> list[str]:
    rows = ["## Why: the messages and the errors", ""]
    if not codes:
        return rows + ["Every recorded cell works.", ""]
    by_code = defaultdict(list)
    for line in lines.values():
        status = status_of(line)
        if status != "works":
            by_code[codes[(status, reason_of(line))]].append(line)
    for (status, reason), code in sorted(codes.items(), key=lambda item: (item[1][0], int(item[1][1:]))):
        mine = by_code[code]
        where_ = ", ".join(f"{PLATFORM_NAMES[p]} x{n}: {k}" for (p, n), k in
                           sorted(Counter((line["platform"], line["processes"]) for line in mine).items()))
        if status == "failed":
            rows.append(f"- **{code}** — failed, not refused ({where_}): `{reason}`")
        elif status == "hung":
            rows.append(f"- **{code}** — the launch died in this cell once; the next run of its part tries it again "
                        f"({where_}): `{first_line(reason, 600)}`")
        else:
            label = "refused" if status == "refused" else "refused, but the run without the validator worked"
            problems = "` and `".join(reason.splitlines())  # the validator reports every problem, one per line
            rows.append(f"- **{code}** — {label} ({where_}): `{problems}`")
        errors = Counter((first_line(line["outcome"].get("error")), line["outcome"].get("origin")) for line in mine
                         if line["outcome"]["status"] != "works")
        if status not in ("failed", "hung"):
            for (error, origin), n in sorted(errors.items(), key=lambda item: -item[1]):
                at = f" (raised at `{origin}`)" if origin else ""
                rows.append(f"  - without the validator, {n} cell{'s' if n > 1 else ''}: `{error}`{at}")
        else:
            origins = sorted({origin for (_, origin) in errors if origin})
            if origins:
                rows.append(f"  - raised at {', '.join(f'`{o}`' for o in origins)}")
    return rows + [""]


def what_ran(lines: dict) -> list[str]:
    """What the working cells really ran, by launch, precision and adapter (optimizer and checkpointing merged)."""
    rows = ["## What really ran", "",
            "From each working cell's effective configuration (read from the live model and optimizer after the "
            "first step; `callbacks/effective_config.py`). Where the optimizers or checkpointing of one row differ, "
            "the values are joined by `/`.", ""]
    groups: dict[tuple, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for (platform, processes, _), line in lines.items():
        if status_of(line) != "works":
            continue
        cell, ran = line["cell"], line["outcome"]["ran"]
        key = (platform, processes, LAUNCHES.index(cell["launch"]), PRECISIONS.index(cell["precision"]),
               ADAPTERS.index(cell["adapter"]))
        for column, value in describe(ran).items():
            groups[key][column].add(value)
    if not groups:
        return rows + ["No cell has worked yet.", ""]
    columns = ("strategy", "weights", "trainable", "grads", "autocast", "master weights", "optimizers",
               "changed by the recipe")
    rows += ["| machine | launch | precision | adapter | " + " | ".join(columns) + " |",
             "| --- | --- | --- | --- | " + " | ".join("---" for _ in columns) + " |"]
    for key in sorted(groups):
        platform, processes, launch, precision, adapter = key
        values = groups[key]
        rows.append(f"| {PLATFORM_NAMES[platform]} x{processes} | {LAUNCHES[launch]} | {PRECISIONS[precision]} | "
                    f"{ADAPTER_NAMES[ADAPTERS[adapter]]} | " + " | ".join(" / ".join(sorted(values[c])) for c in columns)
                    + " |")
    return rows + [""]


def describe(ran: dict) -> dict[str, str]:
    def dtypes(counts_by_dtype) -> str:
        if not isinstance(counts_by_dtype, dict):
            return "—"
        ordered = sorted(counts_by_dtype.items(), key=lambda item: -item[1])
        return ", ".join(DTYPES.get(dtype.split(" ")[0], dtype) for dtype, _ in ordered)

    strategy = ran.get("strategy") or "?"
    mixed = "bf16" if ran.get("bf16") else "fp16" if ran.get("fp16") else None
    if mixed and strategy.startswith("deepspeed"):
        autocast = f"DeepSpeed {mixed} mode"
    else:
        autocast = f"{mixed} autocast" if mixed else "none"
    master = ran.get("master_weights")
    master = f"{DTYPES.get(master['dtype'], master['dtype'])} on {master['device']}" if isinstance(master, dict) else "none"
    optimizer = (ran.get("optimizer_class") or "?").rsplit(".", 1)[-1]
    options = ran.get("optimizer_options") or {}
    if options.get("fused"):
        optimizer += " (fused)"
    if options.get("optim_bits") == 8:
        optimizer += " (8-bit)"
    trainable = ran.get("trainable_params")
    adjusted = "; ".join(f"{key}: {change['used']}" for key, change in sorted((ran.get("adjusted") or {}).items()))
    return {"strategy": strategy, "weights": dtypes(ran.get("param_dtypes")), "changed by the recipe": adjusted or "—",
            "trainable": f"{trainable:,}" if isinstance(trainable, int) else "?",
            "grads": dtypes(ran.get("grad_dtypes")), "autocast": autocast, "master weights": master,
            "optimizers": optimizer}


def render(paths: list[Path]) -> str:
    lines = with_todays_verdicts(load(paths))
    codes = code_book(lines)
    parts = [header(lines, paths), where(lines), counts(lines), axes(), launch_tables(lines, codes),
             reasons(lines, codes), what_ran(lines)]
    return "\n".join(row for part in parts for row in part).rstrip() + "\n"


def default_paths() -> list[Path]:
    return sorted(ROOT.glob(RESULTS_GLOB))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help=f"JSONL files (default: {RESULTS_GLOB}).")
    parser.add_argument("--out", type=Path, default=DOC)
    args = parser.parse_args(argv)
    paths = args.files or default_paths()
    args.out.write_text(render(paths))
    print(f"wrote {args.out} from {len(paths)} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
