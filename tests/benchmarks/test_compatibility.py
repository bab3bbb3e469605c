"""The compatibility matrix: the runner on real CPU cells, and the validator held to the committed results.

The committed JSONL files (benchmarks/results/*-compatibility*.jsonl) record, per cell, what happened when it was
trained with the validator switched off. Every recorded cell is given to today's validator again, under the facts
of the machine and launch that ran it (benchmarks/compatibility_verdicts.py), and it must refuse exactly the cells
that failed.
"""

import json
import time

import pytest

from altscale.benchmarks import compatibility as runner
from altscale.benchmarks import compatibility_matrix as matrix
from altscale.benchmarks import compatibility_doc as doc
from altscale.benchmarks.compatibility_verdicts import replay_verdict

RECORDED = doc.load(doc.default_paths())
LINES = list(RECORDED.values())


# --- the validator against the recorded results ---------------------------------------------------------------


@pytest.fixture(scope="module")
def today():
    """Every recorded line, with today's verdict on its cell."""
    return doc.with_todays_verdicts(RECORDED)


def where(line: dict) -> str:
    return f"{line['platform']} x{line['processes']} {line['key']}"


def test_the_cpu_part_of_the_matrix_is_committed():
    for (platform, processes), launches in matrix.PLAN.items():
        if platform == "cpu":
            missing = [cell.key for launch in launches for cell in matrix.planned_cells(launch, platform, processes)
                       if (platform, processes, cell.key) not in RECORDED]
            assert not missing, f"run `make compatibility`: {len(missing)} CPU cells have no line, e.g. {missing[:3]}"


def test_today_the_validator_refuses_exactly_the_cells_that_failed(today):
    wrong = [f"{where(line)}: {matrix.status_of(line)}: {line['verdict']['message'] or line['outcome']['error']}"
             for line in today.values() if matrix.status_of(line) not in ("works", "refused", "hung")]
    assert not wrong, f"{len(wrong)} cells:\n" + "\n".join(wrong[:10])


def test_where_the_runner_checked_the_replay_it_agreed():
    # The runner replays each cell it runs beside the real verdict, on the real machine (the GPU's included).
    disagree = [where(line) for line in LINES if line.get("replay_agrees") is False]
    assert not disagree, f"the replay (compatibility_verdicts.py) missed the real verdict: {disagree[:5]}"


def test_a_cell_a_machine_does_not_run_is_refused_and_failed_with_one_process(today, tmp_path):
    base = [*matrix.BASE_WORDS, "--dataset_path", str(tmp_path / "p"), "--output_dir", str(tmp_path / "o"),
            "--results_file", str(tmp_path / "r.jsonl")]
    skipped = [(cell, platform, processes) for (platform, processes), launches in matrix.PLAN.items()
               for launch in launches for cell in matrix.cells_for(launch) if matrix.unplanned(cell, platform, processes)]
    assert skipped
    unchecked = []
    for cell, platform, processes in skipped:
        one = today.get((platform, 1, cell.key))
        if one is None:  # that machine's one-process part has not run yet
            unchecked.append(cell.key)
            continue
        assert matrix.status_of(one) == "refused", (platform, cell.key)
        assert replay_verdict({**one, "processes": processes}, base)["refused"], (platform, processes, cell.key)
    assert len(unchecked) < len(skipped)


def test_the_page_is_rendered_from_the_committed_results():
    assert doc.DOC.read_text() == doc.render(doc.default_paths()), (
        "docs/compatibility.md differs from what benchmarks/compatibility_doc.py renders from benchmarks/results "
        "and today's validator: run `make compatibility-doc` (and never edit the page by hand)")


# --- the runner -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_words(tmp_path_factory):
    work = tmp_path_factory.mktemp("cells")
    runner.make_photos(work / "photos")
    return [*matrix.BASE_WORDS, "--dataset_path", str(work / "photos"), "--output_dir", str(work / "out"),
            "--results_file", str(work / "results.jsonl"), "--use_cpu", "true"]


def test_a_working_cell_and_a_refused_one_on_the_cpu(base_words):
    works = runner.run_cell(matrix.Cell("32-true", "sgd", "single", "lora", True), base_words=base_words)
    assert works["verdict"] == {"refused": False, "message": None}
    outcome = works["outcome"]
    assert outcome["status"] == "works", outcome.get("error")
    assert outcome["ran"]["optimizer_class"] == "torch.optim.sgd.SGD" and outcome["ran"]["gradient_checkpointing"]
    assert len(outcome["losses"]) == matrix.STEPS

    refused = runner.run_cell(matrix.Cell("bf16-true", "deepspeed_cpu_adam", "single", "full", False),
                              base_words=base_words)
    assert refused["verdict"]["message"].startswith("optim: deepspeed_cpu_adam is not an optimizer transformers builds")
    # With the validator off, transformers' own parser is what stops it: the error the refusal spares the user.
    assert refused["outcome"]["status"] == "failed"
    assert "invalid choice: 'deepspeed_cpu_adam'" in refused["outcome"]["error"]


def result(strategy="single device", optimizer="torch.optim.sgd.SGD", options=None, losses=(7.0, 6.9), world_size=1):
    effective = {"strategy": strategy, "optimizer_class": optimizer, "optimizer_options": options or {},
                 "world_size": world_size}
    return {"record": {"effective_config": effective, "config": {}},
            "log_history": [{"loss": loss} for loss in losses]}


def test_a_run_that_trains_something_else_than_asked_fails():
    sgd = matrix.Cell("32-true", "sgd", "zero2-offload", "full", False)
    cpu_adam = "deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam"
    assert runner.judge(sgd, result("deepspeed zero2 offload optimizer"), 1)["status"] == "works"  # SGD did step
    swapped = runner.judge(sgd, result("deepspeed zero2 offload optimizer", cpu_adam), 1)
    assert "asked for optim sgd" in swapped["error"] and "replaced without a word" in swapped["error"]
    unfused = runner.judge(matrix.Cell("32-true", "adamw_torch_fused", "single", "full", False),
                           result(optimizer="torch.optim.adamw.AdamW", options={"fused": None}), 1)
    assert unfused["status"] == "failed"
    ddp_for_fsdp = runner.judge(matrix.Cell("32-true", "sgd", "fsdp", "full", False), result("ddp", world_size=2), 2)
    assert "asked for fsdp over 2 process(es), but it ran as 'ddp'" in ddp_for_fsdp["error"]
    nan = runner.judge(matrix.Cell("32-true", "sgd", "single", "full", False), result(losses=(7.0, float("nan"))), 1)
    assert "not 2 finite ones" in nan["error"]
    assert runner.judge(matrix.Cell("32-true", "sgd", "single", "full", False), result(), 1)["status"] == "works"


def test_a_rank_that_failed_alone_makes_the_cell_fail():
    ok = {"verdict": {"refused": False, "message": None}, "outcome": {"status": "works", "error": None}}
    bad = {"verdict": {"refused": False, "message": None}, "outcome": {"status": "failed", "error": "OSError: x"}}
    assert runner.merge_ranks([ok, bad])["outcome"] == {"status": "failed", "error": "rank 1: OSError: x"}
    assert runner.merge_ranks([ok, ok])["outcome"]["status"] == "works"
    # Rank 0 timed out waiting for rank 1, which failed first: the cause comes first.
    waited = {**bad, "outcome": {"status": "failed", "error": "RuntimeError: Timed out waiting 120000ms for send"}}
    assert runner.merge_ranks([waited, bad])["outcome"]["error"] == (
        "rank 1: OSError: x | rank 0: RuntimeError: Timed out waiting 120000ms for send")
    assert runner.merge_ranks([bad, bad])["outcome"]["error"] == "OSError: x"  # both alike: no rank to name


def test_a_cell_a_launch_died_in_runs_once_more_and_fails_if_it_dies_again(tmp_path, base_words):
    work = tmp_path / "work"
    group = runner.group_dir(work, runner.where(), ["single"], "1/1")
    (group / "rank0").mkdir(parents=True)
    marker = group / "current-cell.txt"

    def resume(out, *only):
        runner.main(["--launch", "single", "--out", str(out), "--work-dir", str(work), "--only", *only, "--resume"])
        return [json.loads(line) for line in out.read_text().splitlines()]

    # Died once in ckpt-on: it goes first, then the rest (two refused cells: quick).
    marker.write_text("32-true/deepspeed_cpu_adam/single/lora/ckpt-on 1")
    lines = resume(tmp_path / "once.jsonl", "32-true/deepspeed_cpu_adam/single/lora")
    assert [(line["key"].rsplit("/", 1)[1], matrix.status_of(line)) for line in lines] == [("ckpt-on", "refused"),
                                                                              ("ckpt-off", "refused")]
    assert not marker.exists()
    assert len(resume(tmp_path / "once.jsonl", "32-true/deepspeed_cpu_adam/single/lora")) == 2  # nothing left

    # Died twice: recorded as the cell's failure, with where the rank was; not run a third time.
    marker.write_text("32-true/sgd/single/full/ckpt-off 2")
    (group / "rank0" / "hang.txt").write_text('still running after 45 s, at:\n  File "x.py", line 3, in all_reduce')
    [line] = resume(tmp_path / "twice.jsonl", "32-true/sgd/single/full/ckpt-off")
    assert matrix.status_of(line) == "failed" and line["outcome"]["error"].startswith(matrix.DIED_TWICE)
    assert "[rank0] still running after 45 s" in line["outcome"]["error"] and "in all_reduce" in line["outcome"]["error"]


def test_a_cell_that_runs_too_long_ends_the_launch_saying_where_it_was(tmp_path, monkeypatch):
    exits = []
    monkeypatch.setattr(runner.os, "_exit", exits.append)  # the real one would end pytest
    with runner.CellWatchdog(0.05, tmp_path / "hang.txt"):
        time.sleep(0.5)  # a cell that hangs
    assert exits == [matrix.EXIT_RESTART]
    assert "time.sleep(0.5)" in (tmp_path / "hang.txt").read_text()
    with runner.CellWatchdog(5, tmp_path / "hang.txt"):
        pass  # a cell that ends in time: no report, no exit
    assert exits == [matrix.EXIT_RESTART] and not (tmp_path / "hang.txt").exists()


def test_the_cells_and_the_plan():
    assert len(matrix.CELLS) == 3 * 5 * 5 * 3 * 2 == len({cell.key for cell in matrix.CELLS})
    assert {launch for launches in matrix.PLAN.values() for launch in launches} == set(matrix.LAUNCHES)
    zero = matrix.Cell("bf16-true", "deepspeed_cpu_adam", "zero3-offload", "qlora", True).words()
    assert "--optim" not in zero and zero[zero.index("--deepspeed") + 1] == "ds_configs/zero3_offload.json"
    assert matrix.Cell("32-true", "sgd", "zero2-offload", "full", False).words()[-2:] == ["--optim", "sgd"]


def test_a_planned_cell_without_a_line_reads_not_run_yet(tmp_path):
    line = next(line for line in LINES if line["platform"] == "cpu" and matrix.status_of(line) == "works")
    path = tmp_path / "one-compatibility.jsonl"
    path.write_text(json.dumps(line) + "\n")
    page = doc.render([path])
    assert "**GPU (CUDA), 1 process**: all 90 cells: not run yet." in page
    # One works, the rest of that machine's plan is not run yet (or not planned).
    assert f"| CPU | {line['processes']} | 1 | 0 | 0 | 0 | 0 |" in page


def test_a_gpu_line_replays_with_the_gpu_facts(tmp_path):
    """Before any GPU line is committed: the replay gives a GPU cell the GPU's verdict, not this CPU's."""
    line = {**LINES[0], "platform": "cuda", "processes": 1, "device": "NVIDIA H100 80GB HBM3", "bf16_supported": True,
            "versions": {**LINES[0]["versions"], "deepspeed": "0.19.8"}, "launch_env": {}}

    def verdict_for(cell, **changes):
        base = [*matrix.BASE_WORDS, "--dataset_path", str(tmp_path / "p"), "--output_dir", str(tmp_path / "o"),
                "--results_file", str(tmp_path / "r.jsonl")]
        return replay_verdict({**line, "key": cell.key, "words": cell.words(), **changes}, base)

    assert not verdict_for(matrix.Cell("bf16-mixed", "adamw_torch_fused", "single", "qlora", True))["refused"]
    zero3 = {"launch_env": {"ACCELERATE_USE_DEEPSPEED": "true",
                            "ACCELERATE_DEEPSPEED_CONFIG_FILE": "ds_configs/zero3_offload.json"}}
    assert not verdict_for(matrix.Cell("bf16-true", "deepspeed_cpu_adam", "zero3-offload", "lora", False), **zero3)[
        "refused"]
    qlora = verdict_for(matrix.Cell("bf16-true", "deepspeed_cpu_adam", "zero3-offload", "qlora", False), **zero3)
    assert qlora["message"].startswith("load_in_4bit with DeepSpeed ZeRO-3")
    sgd = verdict_for(matrix.Cell("32-true", "sgd", "zero2-offload", "full", False), processes=2)
    assert sgd["message"].startswith("optim: sgd is ignored under deepspeed")
    old_gpu = verdict_for(matrix.Cell("bf16-true", "sgd", "single", "full", False), bf16_supported=False)
    assert "needs bf16, which this GPU (NVIDIA H100 80GB HBM3) lacks" in old_gpu["message"]
