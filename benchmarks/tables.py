"""Run records as table rows: one row per run with its step-1 memory breakdown, or the multi-GPU view.
Shared by benchmarks/results_table.py (prints a results file) and benchmarks/ladder.py (prints the ladder)."""

GIB = 2**30
CATEGORIES = ("params_gpu", "grads_gpu", "optim_gpu", "optim_cpu", "act_other_bytes", "allocated_bytes", "reserved_bytes")


def gib(value) -> str:
    return "n/a" if value is None else f"{value / GIB:.2f}"


def num(value, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def step1_after_step(record: dict) -> dict:
    """Rank 0's breakdown after step 1's optimizer update, where memory reaches its steady state;
    for a run that stopped before it (OOM), its last snapshot."""
    snapshots = [r for r in record["snapshots"] if r["rank"] == 0]
    steady = [r for r in snapshots if r["phase"] == "after_step" and r["step"] >= 1]
    if steady:
        return steady[0]
    return snapshots[-1] if snapshots else {}


def rows(records: list[dict]) -> list[list[str]]:
    table = []
    for record in records:
        summary = record.get("summary") or {}
        snap = step1_after_step(record)
        table.append([
            record["recipe"], record["status"], str(record["world_size"]),
            num(summary.get("train_time_s"), ".1f"), num(summary.get("time_to_first_step_s"), ".1f"),
            num(summary.get("samples_per_s"), ".1f"), num(summary.get("achieved_tflops_per_gpu"), ".0f"),
            num(summary.get("mfu"), ".1%"), gib(summary.get("peak_allocated_bytes")),
            *[gib(snap.get(key)) for key in CATEGORIES],
        ])
    return table


HEADER = ["recipe", "status", "GPUs", "train s", "1st step s", "samples/s", "TFLOP/s", "MFU", "peak GiB",
          "params", "grads", "optim", "optim(cpu)", "act+other", "alloc", "reserved"]


SCALING_HEADER = ["recipe", "status", "GPUs", "strategy", "lr", "train s", "1st step s", "samples/s", "after step 1",
                  "efficiency", "peak GiB per rank", "comm GiB"]


def scaling_rows(records: list[dict]) -> list[list[str]]:
    """One row per run: samples/s over the whole run and after step 1 (warm-up excluded), and the scaling
    efficiency, the after-step-1 rate per GPU over that of the last one-GPU run of the same model."""
    one_gpu = {}
    for record in records:
        if record["world_size"] == 1 and record["status"] == "ok":
            one_gpu[_model(record)] = (record.get("summary") or {}).get("steady_samples_per_s")
    table = []
    for record in records:
        summary = record.get("summary") or {}
        steady, world = summary.get("steady_samples_per_s"), record["world_size"]
        baseline = one_gpu.get(_model(record))
        efficiency = steady / world / baseline if steady and baseline and world > 1 else None
        peaks = [(s or {}).get("peak_allocated_bytes") for s in record.get("summary_per_rank") or []]
        table.append([
            record["recipe"], record["status"], str(world), str(record.get("strategy")),
            num(record["config"]["training_args"].get("learning_rate"), ".0e"),
            num(summary.get("train_time_s"), ".1f"), num(summary.get("time_to_first_step_s"), ".1f"),
            num(summary.get("samples_per_s"), ".1f"), num(steady, ".1f"), num(efficiency, ".0%"),
            " ".join(gib(peak) for peak in peaks) or "n/a", _comm(record),
        ])
    return table


def _model(record: dict) -> str | None:
    return (record["config"].get("model") or {}).get("model_name_or_path")


def _comm(record: dict) -> str:
    """Rank 0's data-parallel buffers: DDP's extra gradient buckets, or FSDP's largest all-gathered unit."""
    buffers = (record.get("comm_buffers_per_rank") or [None])[0]
    if not buffers:
        return "n/a"
    if buffers["kind"] == "ddp":
        return f"ddp buckets {gib(buffers['extra_bytes'])}"
    return f"fsdp {buffers['units']} units, largest {gib(buffers['largest_unit_gathered_bytes'])}"


def aligned(header: list[str], table: list[list[str]]) -> str:
    """Header and rows as right-aligned columns."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *table)]
    return "\n".join("  ".join(str(c).rjust(w) for c, w in zip(row, widths)) for row in [header, *table])
