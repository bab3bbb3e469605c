"""cuda_graphs on the CPU: the bookkeeping around the graphs (which batch is captured, replayed or run eagerly,
gradients kept across zero_grad, inputs copied in, failures falling back), with a stand-in for the capture that
runs the recorded step again at each replay. The capture itself needs a GPU: benchmarks/gpu_speed.sh checks it
against eager training there (part graphs-check)."""

import json

import pytest
import torch

from altscale.callbacks.memory import memory_by_category
from altscale.data.synthetic import make_synthetic_dataset
from altscale.config import checks
from altscale.strategies import cuda_graphs
from recipes import train
from altscale.strategies.cuda_graphs import GraphedSteps
from tests.recipes.test_train import run_args


class RerunGraphs:
    """Stands in for CudaGraphBackend: `capture` records without running, as CUDA does; `replay` runs it again."""

    def __init__(self, fail: Exception | None = None, syncs: list[str] | None = None):
        self.fail = fail
        self.syncs = syncs or []
        self.captures = 0
        self.recovered = 0

    def capture(self, fn):
        if self.fail is not None:
            raise self.fail
        self.captures += 1
        loss = torch.zeros(())

        def replay():
            loss.copy_(fn())

        return replay, loss

    def syncs_during(self, fn):
        return fn(), list(self.syncs)

    def recover(self):
        self.recovered += 1

    def synchronize(self):
        pass

    def allocated(self):
        return 0

    reserved = peak = allocated

    def reset_peak(self):
        pass

    release_cached = reset_peak


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "food"
    make_synthetic_dataset(path, num_train=96, num_test=8, seed=3, size=32)
    return str(path)


@pytest.fixture
def stand_in(monkeypatch):
    """train.main with cuda_graphs as on a GPU, the captures done by RerunGraphs."""
    backend = RerunGraphs()
    monkeypatch.setattr(checks, "cuda_available", lambda: True)
    monkeypatch.setattr(cuda_graphs, "CudaGraphBackend", lambda: backend)
    return backend


def trained(tmp_path, photos, *extra):
    result = train.main(run_args(tmp_path, photos, "--max_steps", "6", "--gradient_accumulation_steps", "2",
                                 "--per_device_train_batch_size", "8", "--num_sample_captions", "0", "--seed", "7",
                                 *extra))
    return result


def final_params(result):
    from transformers import Blip2ForConditionalGeneration

    return Blip2ForConditionalGeneration.from_pretrained(result["output_dir"]).state_dict()


def test_graphed_training_matches_eager_training_bit_for_bit(tmp_path, photos, stand_in):
    eager = trained(tmp_path / "eager", photos, "--pad_to_multiple_of", "8")
    graphed = trained(tmp_path / "graphed", photos, "--pad_to_multiple_of", "8", "--cuda_graphs", "true")
    # Dropout draws the same numbers in the same order: the replayed step is the eager step.
    report = graphed["record"]["cuda_graphs"]
    assert report["replays"] > 0 and stand_in.captures == report["graphs"] >= 1
    assert report["eager_micro_batches"] + report["replays"] == 12 and report["capture_failed"] is None
    losses = [[e["loss"] for e in r["log_history"] if "loss" in e] for r in (eager, graphed)]
    assert losses[0] == losses[1]
    a, b = final_params(eager), final_params(graphed)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_a_shape_is_captured_on_its_second_batch_and_at_most_max_shapes(tmp_path, photos, stand_in):
    result = trained(tmp_path, photos, "--cuda_graphs", "true", "--cuda_graph_max_shapes", "1",
                        "--save_model", "false")
    report = result["record"]["cuda_graphs"]
    assert report["graphs"] == 1 and len(report["shapes"]) == 1
    # Replays run no forward hook: the summary still counts every sample (6 steps x 2 micro-batches x 8).
    assert result["record"]["summary"]["samples"] == 96
    widths = {shape.split("input_ids")[1] for shape in report["shapes"]}
    assert len(widths) == 1
    record = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[-1])
    assert record["cuda_graphs"]["replays"] == report["replays"]


def test_a_failed_capture_trains_on_eagerly_and_says_why(tmp_path, photos, monkeypatch, capsys):
    try:  # as torch reports it: the capture's end fails, the real error is its context
        try:
            raise RuntimeError("operation not permitted when stream is capturing")
        except RuntimeError:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
    except RuntimeError as err:
        failure = err
    backend = RerunGraphs(fail=failure)
    monkeypatch.setattr(checks, "cuda_available", lambda: True)
    monkeypatch.setattr(cuda_graphs, "CudaGraphBackend", lambda: backend)
    result = trained(tmp_path, photos, "--cuda_graphs", "true", "--save_model", "false")
    report = result["record"]["cuda_graphs"]
    assert report["replays"] == 0 and report["eager_micro_batches"] == 12
    assert report["capture_failed"] == "RuntimeError: operation not permitted when stream is capturing"
    assert "cuda_graphs: capture failed, training on eagerly" in capsys.readouterr().out
    assert result["record"]["summary"]["optimizer_steps"] == 6 and backend.recovered == 1


def test_a_step_that_waits_for_the_host_is_never_captured(tmp_path, photos, monkeypatch, capsys):
    backend = RerunGraphs(syncs=["modeling_blip_2.py:1692"])
    monkeypatch.setattr(checks, "cuda_available", lambda: True)
    monkeypatch.setattr(cuda_graphs, "CudaGraphBackend", lambda: backend)
    result = trained(tmp_path, photos, "--cuda_graphs", "true", "--save_model", "false")
    report = result["record"]["cuda_graphs"]
    assert backend.captures == 0 and report["replays"] == 0 and report["eager_micro_batches"] == 12
    assert all(where == ["modeling_blip_2.py:1692"] for where in report["not_captured"].values())
    assert "the step waits for the host at modeling_blip_2.py:1692" in capsys.readouterr().out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gather_places_rows_exactly_as_masked_scatter_does(dtype):
    mask = torch.zeros(3, 7, 1, dtype=torch.bool)
    mask[:, 1:4] = True  # three query rows per sequence, as BLIP-2's image tokens
    grads = []
    for place in (lambda t, s: t.masked_scatter(mask, s), lambda t, s: cuda_graphs.masked_scatter_rows(t, mask, s)):
        torch.manual_seed(0)
        target = torch.randn(3, 7, 5, dtype=dtype, requires_grad=True)
        source = torch.randn(3, 3, 5, dtype=dtype, requires_grad=True)
        out = place(target, source)
        (out * torch.randn_like(out)).sum().backward()
        grads.append((out.detach(), target.grad, source.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b)
    assert cuda_graphs.masked_scatter_rows(torch.zeros(2, 4), torch.ones(2, 4, dtype=torch.bool), torch.ones(8)) is None


def test_capture_safe_routes_masked_scatter_and_restores_everything():
    import transformers.masking_utils as masking

    before = masking.is_tracing
    target, mask, source = torch.zeros(1, 3, 2), torch.tensor([[[False], [True], [True]]]), torch.ones(1, 2, 2)
    with cuda_graphs.capture_safe():
        assert masking.is_tracing() is True
        assert torch.equal(target.masked_scatter(mask, source), torch.tensor([[[0.0, 0], [1, 1], [1, 1]]]))
    assert masking.is_tracing is before


def test_gradients_survive_zero_grad_and_a_replaced_gradient_is_kept():
    weight = torch.nn.Parameter(torch.ones(3))
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    steps = GraphedSteps([weight, frozen], backend=RerunGraphs())
    inputs = {"x": torch.tensor([1.0, 2.0, 3.0])}

    def run(batch, num_items):
        loss = (weight * batch["x"]).sum() / num_items
        loss.backward()
        return loss.detach()

    steps(run, inputs, 1)  # first batch of this shape: eager, watched for host syncs
    held = weight.grad
    steps(run, inputs, torch.tensor(1))  # second: captured, then replayed
    assert torch.equal(weight.grad, torch.tensor([2.0, 4.0, 6.0])) and frozen.grad is None
    weight.grad = None  # the Trainer's zero_grad
    steps(run, {"x": torch.tensor([1.0, 1.0, 1.0])}, 1)
    assert weight.grad is held and torch.equal(held, torch.ones(3))  # zeroed, then one replay's gradient
    weight.grad = torch.full((3,), 5.0)  # someone else's tensor: its values move into the graph's
    steps(run, inputs, 1)
    assert weight.grad is held and torch.equal(held, torch.tensor([6.0, 7.0, 8.0]))
    assert steps.report()["graphs"] == 1 and steps.replays == 3 and steps.eager_steps == 1


def test_the_inputs_a_graph_reads_are_its_own_copies():
    weight = torch.nn.Parameter(torch.zeros(2))
    seen = []
    steps = GraphedSteps([weight], backend=RerunGraphs())

    def run(batch, num_items):
        seen.append(batch["x"].clone())
        (weight * batch["x"]).sum().backward()
        return torch.zeros(())

    for value in (1.0, 2.0, 3.0):
        x = torch.full((2,), value)
        steps(run, {"x": x}, None)
        x.fill_(-1)  # the DataLoader reuses its buffers: the graph's copy must not change
    assert [s.tolist() for s in seen] == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]


def test_gradient_buffers_count_as_grads_once():
    model = torch.nn.Linear(4, 4, bias=False)
    buffer = torch.zeros_like(model.weight)
    detached = memory_by_category(model, grad_buffers=[buffer])
    model.weight.grad = buffer
    attached = memory_by_category(model, grad_buffers=[buffer])
    assert detached["grads_cpu"] == attached["grads_cpu"] == buffer.numel() * 4


@pytest.mark.parametrize("extra, expected", [
    ([], "cuda_graphs: true needs a CUDA GPU"),
    (["--gradient_checkpointing", "true"], "cuda_graphs with gradient_checkpointing is not verified"),
    (["--torch_empty_cache_steps", "4"], "torch_empty_cache_steps empties the allocator's cache"),
    (["--cuda_graph_max_shapes", "0"], "cuda_graph_max_shapes: 0; use 1 or more"),
])
def test_what_cuda_graphs_cannot_run_is_refused_in_one_message(tmp_path, photos, monkeypatch, capsys, extra, expected):
    if extra:
        monkeypatch.setattr(checks, "cuda_available", lambda: True)
    code = train.run(run_args(tmp_path, photos, "--cuda_graphs", "true", *extra))
    err = capsys.readouterr().err
    assert code == train.EXIT_USER_ERROR and expected in err and "Traceback" not in err


def test_pad_to_multiple_of_must_be_positive(tmp_path, photos, capsys):
    assert train.run(run_args(tmp_path, photos, "--pad_to_multiple_of", "0")) == train.EXIT_USER_ERROR
    assert "pad_to_multiple_of: 0; use 1 (no rounding) or more" in capsys.readouterr().err
