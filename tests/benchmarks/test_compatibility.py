"""The compatibility matrix: the runner on real CPU cells, and the validator held to the committed results.

The committed JSONL files (benchmarks/results/*-compatibility*.jsonl) record, per cell, the validator's verdict
and the outcome of the same cell trained without it. Here every recorded cell is given to today's validator again,
under the facts of the machine and launch that ran it, and it must refuse exactly the cells that failed.
"""

import functools
import importlib.util
import json
import os
from pathlib import Path
from unittest import mock

import pytest
from transformers import TrainingArguments

import models.build
import recipes.arguments
from benchmarks import compatibility as matrix
from benchmarks import compatibility_doc as doc
from recipes.arguments import check_deepspeed_installed, parse_args, precision_flags
from recipes.checks import check_compatible
from recipes.errors import ConfigError
from recipes.launch import launch_deepspeed_words

LINES = list(doc.load(doc.default_paths()).values())


# --- the validator against the recorded results ---------------------------------------------------------------


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """Today's verdict for every recorded line. A thousand verdicts cost 35 ms each as the scripts build them; the
    parser and the preset's config are built once here instead (both are pure: same input, same object)."""
    real_parser = recipes.arguments.Parser
    cached_parser = functools.cache(lambda groups, source, help_command: real_parser(groups, source=source,
                                                                                      help_command=help_command))
    work = tmp_path_factory.mktemp("replay")
    with mock.patch.object(recipes.arguments, "Parser", lambda groups, *, source="command line", help_command=None:
                           cached_parser(groups, source, help_command)), \
            mock.patch.object(models.build, "random_init_config", functools.cache(models.build.random_init_config)):
        return {(line["platform"], line["processes"], line["key"]): replay(line, work) for line in LINES}


def replay(line: dict, work: Path) -> dict:
    """The validator's verdict on a recorded cell, on this CPU, under the recorded facts of its machine and launch.

    What is simulated, and why it is enough: the words are parsed as on the CPU (use_cpu, and the deepspeed key held
    back, since deepspeed need not be installed here), then TrainingArguments gets the recorded machine's values
    (use_cpu off on a GPU, the deepspeed file, DeepSpeed's bf16 mode); check_compatible then runs with the recorded
    GPU facts (CUDA, bf16 support, device name), the launch's variables and its process count.
    """
    words = [*matrix.BASE_WORDS, "--dataset_path", str(work / "photos"), "--output_dir", str(work / "out"),
             "--results_file", str(work / "results.jsonl"), "--use_cpu", "true", *line["words"]]
    deepspeed = words[words.index("--deepspeed") + 1] if "--deepspeed" in words else None
    parse_words = [w for i, w in enumerate(words) if "--deepspeed" not in (w, words[i - 1] if i else None)]
    launch_env = line["launch_env"]
    # Held back with the deepspeed key: replayed by launch_deepspeed_words(words, environ=launch_env) below.
    parse_env = {k: v for k, v in launch_env.items() if not k.startswith(("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_DEEPSPEED"))}
    on_gpu = line["platform"] == "cuda"
    installed = line["versions"].get("deepspeed") is not None
    real_find_spec = importlib.util.find_spec
    with mock.patch.dict(os.environ):  # restored on exit
        for name in [name for name in os.environ if name.startswith(("ACCELERATE_", "FSDP_"))]:
            del os.environ[name]
        os.environ.update(parse_env)
        try:
            launch_deepspeed_words(words, environ=launch_env)
            with mock.patch("importlib.util.find_spec",
                            lambda name, *a: (object() if installed else None) if name == "deepspeed"
                            else real_find_spec(name, *a)):
                check_deepspeed_installed(words)
            args = parse_args(parse_words)
            args.training.deepspeed = deepspeed
            for flag in precision_flags(args.strategy.precision, args.training):  # DeepSpeed's bf16 mode
                setattr(args.training, flag, True)
            if on_gpu:
                args.training.use_cpu = False
            with mock.patch.object(TrainingArguments, "world_size", property(lambda self: line["processes"])), \
                    mock.patch("torch.cuda.is_available", lambda: on_gpu), \
                    mock.patch("torch.cuda.is_bf16_supported", lambda *a, **k: bool(line.get("bf16_supported"))), \
                    mock.patch("torch.cuda.get_device_name", lambda *a, **k: line["device"]):
                check_compatible(args)
        except ConfigError as err:
            return {"refused": True, "message": str(err)}
    return {"refused": False, "message": None}


def where(line: dict) -> str:
    return f"{line['platform']} x{line['processes']} {line['key']}"


def test_the_cpu_part_of_the_matrix_is_committed():
    recorded = {(line["platform"], line["processes"], line["key"]) for line in LINES}
    for (platform, processes), launches in matrix.PLAN.items():
        if platform == "cpu":
            missing = [cell.key for launch in launches for cell in matrix.cells_for(launch)
                       if (platform, processes, cell.key) not in recorded]
            assert not missing, f"run `make compatibility`: {len(missing)} CPU cells have no line, e.g. {missing[:3]}"


def test_when_it_ran_the_validator_refused_exactly_the_cells_that_failed():
    disagree = [f"{where(line)}: {matrix.status_of(line)}: {line['verdict']['message'] or line['outcome']['error']}"
                for line in LINES if matrix.status_of(line) not in ("works", "refused")]
    assert not disagree, "\n".join(disagree[:10])


def test_today_the_validator_refuses_exactly_the_cells_that_failed(replayed):
    wrong = []
    for line in LINES:
        now = replayed[(line["platform"], line["processes"], line["key"])]
        failed = line["outcome"]["status"] != "works"
        if now["refused"] != failed:
            said = f"refuses it: {now['message']}" if now["refused"] else "lets it through"
            wrong.append(f"{where(line)} {'failed' if failed else 'works'} but the validator {said}")
    assert not wrong, f"{len(wrong)} cells:\n" + "\n".join(wrong[:10])


def test_the_pages_messages_are_todays(replayed):
    # CPU lines only: anyone can rerun them (make compatibility); a GPU line keeps its wording until the next GPU run.
    stale = [f"{where(line)}: recorded {line['verdict']['message']!r}, today {now['message']!r}"
             for line in LINES if line["platform"] == "cpu"
             for now in [replayed[(line["platform"], line["processes"], line["key"])]]
             if now["message"] != line["verdict"]["message"]]
    assert not stale, "run `make compatibility`:\n" + "\n".join(stale[:5])


def test_the_page_is_rendered_from_the_committed_results():
    assert doc.DOC.read_text() == doc.render(doc.default_paths()), (
        "docs/compatibility.md differs from what benchmarks/compatibility_doc.py renders from benchmarks/results: "
        "run `make compatibility-doc` (and never edit the page by hand)")


# --- the runner -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_words(tmp_path_factory):
    work = tmp_path_factory.mktemp("cells")
    matrix.make_photos(work / "photos")
    return [*matrix.BASE_WORDS, "--dataset_path", str(work / "photos"), "--output_dir", str(work / "out"),
            "--results_file", str(work / "results.jsonl"), "--use_cpu", "true"]


def test_a_working_cell_and_a_refused_one_on_the_cpu(base_words):
    works = matrix.run_cell(matrix.Cell("32-true", "sgd", "single", "lora", True), base_words=base_words)
    assert works["verdict"] == {"refused": False, "message": None}
    outcome = works["outcome"]
    assert outcome["status"] == "works", outcome.get("error")
    assert outcome["ran"]["optimizer_class"] == "torch.optim.sgd.SGD" and outcome["ran"]["gradient_checkpointing"]
    assert len(outcome["losses"]) == matrix.STEPS

    refused = matrix.run_cell(matrix.Cell("bf16-true", "deepspeed_cpu_adam", "single", "full", False),
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
    assert matrix.judge(sgd, result("deepspeed zero2 offload optimizer"), 1)["status"] == "works"  # SGD did step
    swapped = matrix.judge(sgd, result("deepspeed zero2 offload optimizer", cpu_adam), 1)
    assert "asked for optim sgd" in swapped["error"] and "replaced without a word" in swapped["error"]
    unfused = matrix.judge(matrix.Cell("32-true", "adamw_torch_fused", "single", "full", False),
                           result(optimizer="torch.optim.adamw.AdamW", options={"fused": None}), 1)
    assert unfused["status"] == "failed"
    ddp_for_fsdp = matrix.judge(matrix.Cell("32-true", "sgd", "fsdp", "full", False), result("ddp", world_size=2), 2)
    assert "asked for fsdp over 2 process(es), but it ran as 'ddp'" in ddp_for_fsdp["error"]
    nan = matrix.judge(matrix.Cell("32-true", "sgd", "single", "full", False), result(losses=(7.0, float("nan"))), 1)
    assert "not 2 finite ones" in nan["error"]
    assert matrix.judge(matrix.Cell("32-true", "sgd", "single", "full", False), result(), 1)["status"] == "works"


def test_a_rank_that_failed_alone_makes_the_cell_fail():
    ok = {"verdict": {"refused": False, "message": None}, "outcome": {"status": "works", "error": None}}
    bad = {"verdict": {"refused": False, "message": None}, "outcome": {"status": "failed", "error": "OSError: x"}}
    assert matrix.merge_ranks([ok, bad])["outcome"] == {"status": "failed", "error": "rank 1: OSError: x"}
    assert matrix.merge_ranks([ok, ok])["outcome"]["status"] == "works"
    # Rank 0 timed out waiting for rank 1, which failed first: the cause comes first.
    waited = {**bad, "outcome": {"status": "failed", "error": "RuntimeError: Timed out waiting 120000ms for send"}}
    assert matrix.merge_ranks([waited, bad])["outcome"]["error"] == (
        "rank 1: OSError: x | rank 0: RuntimeError: Timed out waiting 120000ms for send")
    assert matrix.merge_ranks([bad, bad])["outcome"]["error"] == "OSError: x"  # both alike: no rank to name


def test_resume_records_the_cell_a_killed_launch_died_in(tmp_path, base_words):
    out, work = tmp_path / "m.jsonl", tmp_path / "work"
    only = ["32-true/deepspeed_cpu_adam/single/lora"]  # two refused cells: quick
    setup = matrix.where()
    group = matrix.group_dir(work, setup, ["single"], "1/1")
    group.mkdir(parents=True)
    (group / "current-cell.txt").write_text("32-true/deepspeed_cpu_adam/single/lora/ckpt-off")
    matrix.main(["--launch", "single", "--out", str(out), "--work-dir", str(work), "--only", *only, "--resume"])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["key"] for line in lines] == ["32-true/deepspeed_cpu_adam/single/lora/ckpt-off",
                                               "32-true/deepspeed_cpu_adam/single/lora/ckpt-on"]
    assert lines[0]["outcome"]["error"].startswith("the launch died during this cell")
    assert lines[0]["verdict"]["refused"] and matrix.status_of(lines[1]) == "refused"
    assert not (group / "current-cell.txt").exists()
    matrix.main(["--launch", "single", "--out", str(out), "--work-dir", str(work), "--only", *only, "--resume"])
    assert len(out.read_text().splitlines()) == 2  # nothing left to do


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
    assert f"| CPU | {line['processes']} | 1 | 0 | 0 | 0 |" in page  # one works, the rest of the plan not run yet


def test_a_gpu_line_replays_with_the_gpu_facts(tmp_path):
    """Before any GPU line is committed: the replay gives a GPU cell the GPU's verdict, not this CPU's."""
    line = {**LINES[0], "platform": "cuda", "processes": 1, "device": "NVIDIA H100 80GB HBM3", "bf16_supported": True,
            "versions": {**LINES[0]["versions"], "deepspeed": "0.19.8"}, "launch_env": {}}

    def verdict_for(cell, **changes):
        return replay({**line, "key": cell.key, "words": cell.words(), **changes}, tmp_path)

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
