"""The multi-GPU table of benchmarks/results_table.py: efficiency against the one-GPU run, peaks of every rank."""

from altscale.benchmarks.tables import SCALING_HEADER, rows, scaling_rows

GIB = 2**30


def record(recipe, world, steady, peaks, model="blip2-opt-2.7b", status="ok", buffers=None, strategy="ddp"):
    return {
        "recipe": recipe, "status": status, "world_size": world, "strategy": strategy, "snapshots": [],
        "config": {"training_args": {"learning_rate": 2e-5 * world}, "model": {"model_name_or_path": model}},
        "summary": {"train_time_s": 30.0, "time_to_first_step_s": 40.0, "samples_per_s": steady * 0.8,
                    "steady_samples_per_s": steady, "peak_allocated_bytes": peaks[0]},
        "summary_per_rank": [{"peak_allocated_bytes": peak} for peak in peaks],
        "comm_buffers_per_rank": [buffers] * world,
    }


def test_efficiency_is_the_per_gpu_rate_after_step_1_over_the_one_gpu_runs():
    table = scaling_rows([
        record("opt27-bf16-1gpu", 1, 60.0, [37 * GIB], strategy="single device"),
        record("opt27-bf16-ddp4", 4, 180.0, [45 * GIB] * 4,
               buffers={"kind": "ddp", "extra_bytes": 7 * GIB}),
        record("opt27-bf16-fsdp4", 4, 216.0, [20 * GIB, 21 * GIB, 20 * GIB, 20 * GIB],
               buffers={"kind": "fsdp2", "units": 23, "largest_unit_gathered_bytes": GIB // 2}),
        record("xxl-bf16-fsdp4", 4, 50.0, [30 * GIB] * 4, model="blip2-flan-t5-xxl"),  # no one-GPU run: n/a
    ])
    column = {name: SCALING_HEADER.index(name) for name in SCALING_HEADER}
    assert [row[column["efficiency"]] for row in table] == ["n/a", "75%", "90%", "n/a"]
    assert table[2][column["peak GiB per rank"]] == "20.00 21.00 20.00 20.00"
    assert table[1][column["comm GiB"]] == "ddp buckets 7.00" and table[2][column["comm GiB"]] == "fsdp 23 units, largest 0.50"
    assert table[1][column["lr"]] == "8e-05"


def test_records_from_before_the_multi_gpu_fields_still_print():
    old = record("opt27-bf16", 1, 60.0, [37 * GIB])
    del old["comm_buffers_per_rank"]
    assert scaling_rows([old])[0][-1] == "n/a"
    assert rows([old])[0][0] == "opt27-bf16"
