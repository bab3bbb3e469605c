"""Two processes on the CPU over gloo, started as a user starts them: `accelerate launch` with the repo's yaml files.

accelerate 1.15 runs `accelerate launch --cpu --num_processes 2` as ONE process (its simple launcher), so these
launch the multi-GPU configs with `--num_processes 2` and the recipe's `use_cpu: true`, which makes each process
join a gloo group. Each process runs recipes/train.py through tests/recipes/launched.py, which also dumps its
parameters and batches. About 10 s per launch with the tiny model.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.ports import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ACCELERATE = str(Path(sys.executable).parent / "accelerate")
WRAPPED = "_checkpoint_wrapped_module."  # the name part FSDP's activation checkpointing adds to a layer


@pytest.fixture(scope="module")
def photos(synthetic_photos):
    return synthetic_photos(num_train=48, num_test=8, seed=2, size=64)


def train_words(photos: str, tmp_path: Path, *extra: str) -> list[str]:
    return ["--dataset_path", photos, "--output_dir", str(tmp_path / "out"), "--results_file",
            str(tmp_path / "results.jsonl"), "--use_cpu", "true", "--max_steps", "2", "--per_device_train_batch_size",
            "4", "--dataloader_num_workers", "0", "--memory_log_steps", "1", "--num_sample_captions", "0",
            "--disable_tqdm", "true", "--eval_size", "0", "--logging_steps", "1", *extra]


def launch(config: str, tmp_path: Path, words: list[str], *flags: str, env: dict | None = None):
    command = [ACCELERATE, "launch", "--config_file", f"accelerate_configs/{config}", "--num_processes", "2", *flags,
               "tests/recipes/launched.py", str(tmp_path / "dump"), *words]
    # launched.py imports the recipe script as `recipes.train`: the repo root goes on the processes' import path
    # (a script's own folder, tests/recipes, is all Python adds; recipes/ is not installed)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": path, **(env or {})})


def finish(process, timeout: float = 240) -> str:
    out, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, out[-4000:]
    return out


def ranks(tmp_path: Path) -> list[dict]:
    return [torch.load(tmp_path / "dump" / f"rank{rank}.pt") for rank in (0, 1)]


def the_record(tmp_path: Path) -> dict:
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 1, "rank 0 alone appends a finished run's record"
    return json.loads(lines[0])


def test_ddp_both_ranks_train_on_their_own_data_and_end_with_the_same_weights(photos, tmp_path):
    # ddp_find_unused_parameters: false as in recipes/blip2/opt27-bf16-ddp4.yaml: DDP then fails at the second step
    # if any parameter went without a gradient in the first
    words = train_words(photos, tmp_path, "--learning_rate", "1e-4", "--lr_scaling", "linear",
                        "--lr_reference_batch_size", "4", "--ddp_find_unused_parameters", "false")
    out = finish(launch("ddp4.yaml", tmp_path, words, "--main_process_port", str(free_port())))
    rank0, rank1 = ranks(tmp_path)
    assert rank0["code"] == rank1["code"] == 0
    assert rank0["batches"][0] != rank1["batches"][0]  # the sampler split the data
    assert rank0["before"].keys() == rank0["after"].keys() == rank1["after"].keys()
    assert any(not torch.equal(rank0["before"][n], rank0["after"][n]) for n in rank0["after"])  # it trained
    # Different batches, identical weights after two optimizer steps: the gradients were averaged.
    assert all(torch.equal(rank0["after"][n], rank1["after"][n]) for n in rank0["after"])

    record = the_record(tmp_path)
    assert (record["status"], record["strategy"], record["world_size"], record["ranks_recorded"]) == ("ok", "ddp", 2, [0, 1])
    per_rank = {rank: [s for s in record["snapshots"] if s["rank"] == rank] for rank in (0, 1)}
    assert len(per_rank[0]) == len(per_rank[1]) > 0  # the memory callback measured on both ranks
    assert [(s["step"], s["phase"]) for s in per_rank[0]] == [(s["step"], s["phase"]) for s in per_rank[1]]
    assert sum(line.startswith("[step") for line in out.splitlines()) == len(per_rank[0])  # printed by rank 0 only
    assert [s["samples"] for s in record["summary_per_rank"]] == [16, 16]  # 2 steps x 4 per rank x 2 ranks
    # lr_scaling: global batch 4 x 2 processes = 8 against a reference of 4, reported once
    assert record["config"]["adjusted"]["learning_rate"]["used"] == pytest.approx(2e-4)
    assert out.count("learning_rate: asked 0.0001, using 0.0002") == 1
    assert record["config"]["launch"]["strategy"] == "ddp"
    # DDP's gradient buckets hold every gradient, and the gradients are views into them: no second copy
    # (strategies/ddp.py configure_ddp), as DDP itself reports
    trainable_bytes = sum(t.numel() * t.element_size() for t in rank0["after"].values())
    ddp = record["config"]["launch"]["ddp"]
    assert ddp["gradient_as_bucket_view"] is True and ddp["zero_grad_set_to_none"] is False
    for buffers in record["comm_buffers_per_rank"]:
        assert buffers["kind"] == "ddp" and buffers["bucket_bytes"] == trainable_bytes
        assert buffers["gradient_as_bucket_view"] is True and buffers["extra_bytes"] == 0
    # A view is counted once, as a gradient; zeroed in place, the views outlive the step (set to None, the next
    # step's first micro-batches would accumulate into fresh tensors beside the buckets)
    for snapshot in record["snapshots"]:
        if snapshot["phase"] == "after_step" or (snapshot["step"], snapshot["phase"]) == (1, "before_fwd"):
            assert snapshot["grads_cpu"] == trainable_bytes, snapshot


@pytest.mark.parametrize("preset, precision, language_layer, layers_per_unit, units", [
    ("blip2-tiny-opt", "32-true", "OPTDecoderLayer", 1, 8), ("blip2-tiny-t5", "bf16-true", "T5Block", 1, 10),
    ("blip2-tiny-opt", "bf16-true", "OPTDecoderLayer", 2, 5)])
def test_fsdp_shards_each_towers_layers_checkpoints_them_and_saves_the_full_model(photos, tmp_path, preset, precision,
                                                                                  language_layer, layers_per_unit,
                                                                                  units):
    words = train_words(photos, tmp_path, "--model_name_or_path", preset, "--precision", precision,
                        "--gradient_checkpointing", "true", "--fsdp_layers_per_unit", str(layers_per_unit))
    # launched.py lifts accelerate's GPU-only FSDP switch, so accelerate's real FSDP2 path runs over gloo
    out = finish(launch("fsdp4.yaml", tmp_path, words, "--main_process_port", str(free_port()),
                        env={"ALTSCALE_FSDP_ON_CPU": "1"}))
    rank0, rank1 = ranks(tmp_path)
    assert rank0["code"] == rank1["code"] == 0
    assert rank0["batches"][0] != rank1["batches"][0]

    record = the_record(tmp_path)
    assert (record["status"], record["strategy"], record["ranks_recorded"]) == ("ok", "fsdp2", [0, 1])
    fsdp = record["config"]["launch"]["fsdp"]
    assert fsdp["transformer_cls_names_to_wrap"] == ["Blip2EncoderLayer", "Blip2QFormerLayer", language_layer]
    assert fsdp["activation_checkpointing"] is True and fsdp["weights_broadcast_from_rank0"] is False
    # the layer units, as strategies/fsdp_units.py made them: all but accelerate's embedding + head unit and the root
    assert (fsdp["layer_units"], fsdp["layers_per_unit"], fsdp["forward_prefetch"]) == (units - 2, layers_per_unit, True)
    layers = fsdp["checkpointed_layers"]
    assert layers == 6 if preset == "blip2-tiny-opt" else layers == 6 + 2  # T5: 2 encoder + 2 decoder blocks
    assert record["config"]["adjusted"]["gradient_checkpointing"]["asked"] is True
    assert out.count("using FSDP's activation checkpointing") == 1
    effective = record["effective_config"]
    assert effective["gradient_checkpointing"] is False and effective["checkpoint_wrapped_layers"] == layers
    # AdamW steps each rank's local shards (strategies/sharded_optim.py), and the record says so
    assert fsdp["optimizer"] == "ShardLocalAdamW"
    assert effective["optimizer_class"] == "altscale.strategies.sharded_optim.ShardLocalAdamW"
    # bf16-true stays bf16 (the launch file's mixed_precision 'no' keeps accelerate from upcasting to fp32)
    dtype = {"32-true": "torch.float32", "bf16-true": "torch.bfloat16"}[precision]
    assert list(effective["param_dtypes"]) == [dtype] and list(effective["grad_dtypes"]) == [dtype]
    assert {state.split(": ")[1] for state in effective["optimizer_state_dtypes"]} == {dtype}

    # Each rank holds about half of every parameter: counted by its local shard (plus FSDP's dim-0 padding).
    full = {name.replace(WRAPPED, ""): torch.cat([rank0["after"][name], rank1["after"][name]])
            for name in rank0["after"]}
    full_bytes = sum(t.numel() * t.element_size() for t in full.values())
    assert sum(t.numel() for t in full.values()) == record["effective_config"]["trainable_params"]
    for rank in (0, 1):
        step1 = next(s for s in record["snapshots"] if (s["rank"], s["step"], s["phase"]) == (rank, 1, "after_step"))
        assert full_bytes / 2 <= step1["params_cpu"] <= full_bytes / 2 * 1.05
        assert step1["grads_cpu"] == step1["params_cpu"]
    buffers = record["comm_buffers_per_rank"][0]
    assert buffers["kind"] == "fsdp2" and buffers["units"] == units and buffers["all_gathered_bytes"] == full_bytes

    before = {name.replace(WRAPPED, ""): t for name, t in rank0["before"].items()}
    assert any(not torch.equal(before[n], full[n]) for n in full)  # the shards trained
    # save_model: rank 0 wrote the whole model, and it is the two ranks' shards put together
    saved = load_file(tmp_path / "out" / "model.safetensors")
    assert all(torch.equal(saved[name], full[name]) for name in full)
    if preset == "blip2-tiny-t5":  # the tied embedding trained as one tensor (strategies/fsdp.py share_tied_embeddings)
        for name in ("language_model.encoder.embed_tokens.weight", "language_model.lm_head.weight"):
            assert name not in saved or torch.equal(saved[name], saved["language_model.shared.weight"])


def test_the_two_machine_config_runs_as_two_machines_of_one_process(photos, tmp_path):
    """accelerate_configs/ddp8-2machines.yaml, with only the fields the README says to fill in (here: localhost)."""
    port = str(free_port())
    words = train_words(photos, tmp_path)
    machines = [launch("ddp8-2machines.yaml", tmp_path, words, "--num_machines", "2", "--machine_rank", str(rank),
                       "--main_process_ip", "127.0.0.1", "--main_process_port", port) for rank in (0, 1)]
    for machine in machines:
        finish(machine)
    record = the_record(tmp_path)
    assert (record["status"], record["world_size"], record["ranks_recorded"]) == ("ok", 2, [0, 1])
    rank0, rank1 = ranks(tmp_path)
    assert all(torch.equal(rank0["after"][n], rank1["after"][n]) for n in rank0["after"])


def test_a_rank_that_fails_records_it_and_the_launch_ends_instead_of_hanging(photos, tmp_path):
    """Rank 1 fails mid-run while rank 0 waits in the step's gradient all-reduce. A record that gathered from
    every rank would wait there for the process group's 30-minute timeout; the failing rank writes its own."""
    words = train_words(photos, tmp_path, "--max_steps", "4")
    process = launch("ddp4.yaml", tmp_path, words, "--main_process_port", str(free_port()),
                     env={"ALTSCALE_FAIL_RANK": "1"})
    out, _ = process.communicate(timeout=180)
    assert process.returncode != 0
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    failed = next(r for r in records if r["ranks_recorded"] == [1])
    assert failed["status"] == "error" and "injected failure on rank 1" in failed["error"]
    assert {s["rank"] for s in failed["snapshots"]} == {1} and failed["last_phase"]["step"] == 1


def test_qlora_under_fsdp_shards_the_4bit_weights_too(photos, tmp_path):
    """bitsandbytes 0.50 has CPU 4-bit kernels. With its default uint8 storage accelerate leaves every 4-bit
    weight whole on every rank ("Excluding from FSDP2 sharding"); stored in bf16 (strategies/launch.py
    LaunchPlan.quant_storage) they are sharded like the rest."""
    words = train_words(photos, tmp_path, "--use_peft", "true", "--load_in_4bit", "true", "--precision", "bf16-true",
                        "--save_model", "false")
    finish(launch("fsdp4.yaml", tmp_path, words, "--main_process_port", str(free_port()),
                  env={"ALTSCALE_FSDP_ON_CPU": "1"}))
    effective = the_record(tmp_path)["effective_config"]
    assert "torch.bfloat16" in effective["param_dtypes"] and "torch.uint8" not in effective["param_dtypes"]
    assert list(effective["param_devices"]) == ["cpu (DTensor sharded over 2 ranks)"]
    assert 0 < effective["trainable_params"] < effective["frozen_params"]  # LoRA adapters only


def test_grouping_layers_into_fewer_fsdp_units_trains_the_same_weights(photos, tmp_path):
    """fsdp_layers_per_unit changes which tensors are gathered together, not what is computed: with two ranks
    every gradient element is the sum of the same two numbers, so the weights agree to the bit."""
    after = {}
    for layers_per_unit in (1, 2):
        run = tmp_path / str(layers_per_unit)
        words = train_words(photos, run, "--gradient_checkpointing", "true", "--fsdp_layers_per_unit",
                            str(layers_per_unit), "--save_model", "false")
        finish(launch("fsdp4.yaml", run, words, "--main_process_port", str(free_port()),
                      env={"ALTSCALE_FSDP_ON_CPU": "1"}))
        after[layers_per_unit] = ranks(run)[0]["after"]
        assert the_record(run)["config"]["launch"]["fsdp"]["layer_units"] == 6 // layers_per_unit
    assert after[1].keys() == after[2].keys()
    assert all(torch.equal(after[1][name], after[2][name]) for name in after[1])
