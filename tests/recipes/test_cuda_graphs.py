"""cuda_graphs on the CPU: the bookkeeping around the graphs (which batch is captured, replayed or run eagerly,
gradients kept across zero_grad, inputs copied in, failures falling back), with a stand-in for the capture that
runs the recorded step again at each replay. The capture itself needs a GPU: benchmarks/gpu_speed.sh checks it
against eager training there (part graphs-check)."""

import functools
import json
from types import SimpleNamespace

import pytest
import torch
from transformers import Trainer, TrainingArguments

from altscale.callbacks import build_callbacks
from altscale.callbacks.memory import MemoryCallback, memory_by_category
from altscale.patches.torch import masked_scatter_rows
from tests.recipes.machines import GPU
from altscale.strategies import cuda_graphs
from recipes import train
from altscale.strategies.cuda_graphs import GraphedSteps
from tests.callbacks.tiny import TinyData, TinyModel
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
def photos(synthetic_photos):
    return synthetic_photos(num_train=96, num_test=8, seed=3, size=32)


@pytest.fixture
def stand_in(monkeypatch):
    """train.main with cuda_graphs as on a GPU, the captures done by RerunGraphs."""
    backend = RerunGraphs()
    monkeypatch.setattr(train, "main", functools.partial(train.main, machine=GPU))  # checked as on a GPU
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
    monkeypatch.setattr(train, "main", functools.partial(train.main, machine=GPU))  # checked as on a GPU
    monkeypatch.setattr(cuda_graphs, "CudaGraphBackend", lambda: backend)
    result = trained(tmp_path, photos, "--cuda_graphs", "true", "--save_model", "false")
    report = result["record"]["cuda_graphs"]
    assert report["replays"] == 0 and report["eager_micro_batches"] == 12
    assert report["capture_failed"] == "RuntimeError: operation not permitted when stream is capturing"
    assert "cuda_graphs: capture failed, training on eagerly" in capsys.readouterr().out
    assert result["record"]["summary"]["optimizer_steps"] == 6 and backend.recovered == 1


def test_a_step_that_waits_for_the_host_is_never_captured(tmp_path, photos, monkeypatch, capsys):
    backend = RerunGraphs(syncs=["modeling_blip_2.py:1692"])
    monkeypatch.setattr(train, "main", functools.partial(train.main, machine=GPU))  # checked as on a GPU
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
    for place in (lambda t, s: t.masked_scatter(mask, s), lambda t, s: masked_scatter_rows(t, mask, s)):
        torch.manual_seed(0)
        target = torch.randn(3, 7, 5, dtype=dtype, requires_grad=True)
        source = torch.randn(3, 3, 5, dtype=dtype, requires_grad=True)
        out = place(target, source)
        (out * torch.randn_like(out)).sum().backward()
        grads.append((out.detach(), target.grad, source.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b)
    assert masked_scatter_rows(torch.zeros(2, 4), torch.ones(2, 4, dtype=torch.bool), torch.ones(8)) is None


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
        monkeypatch.setattr(train, "run", functools.partial(train.run, machine=GPU))  # checked as on a GPU
    code = train.run(run_args(tmp_path, photos, "--cuda_graphs", "true", *extra))
    err = capsys.readouterr().err
    assert code == train.EXIT_USER_ERROR and expected in err and "Traceback" not in err


def test_pad_to_multiple_of_must_be_positive(tmp_path, photos, capsys):
    assert train.run(run_args(tmp_path, photos, "--pad_to_multiple_of", "0")) == train.EXIT_USER_ERROR
    assert "pad_to_multiple_of: 0; use 1 (no rounding) or more" in capsys.readouterr().err


class Allocator:
    """torch.cuda's allocator counters, as the memory callback and a graphs backend both read them."""

    def __init__(self):
        self.allocated = self.peak = 100

    def hold(self, nbytes):
        self.allocated, self.peak = nbytes, max(self.peak, nbytes)

    def reset_peak(self):
        self.peak = self.allocated


@pytest.fixture
def allocator(monkeypatch):
    """CUDA as the memory callback sees it, on the CPU."""
    counters = Allocator()
    for name, value in {"is_available": lambda: True, "is_initialized": lambda: True,
                        "memory_allocated": lambda *_: counters.allocated, "memory_reserved": lambda *_: 0,
                        "max_memory_allocated": lambda *_: counters.peak,
                        "reset_peak_memory_stats": lambda *_: counters.reset_peak()}.items():
        monkeypatch.setattr(torch.cuda, name, value)
    return counters


class CountedGraphs(RerunGraphs):
    """RerunGraphs on the allocator's counters: a capture finds `held` bytes above what was allocated before it."""

    def __init__(self, counters, held):
        super().__init__()
        self.counters, self.held = counters, held

    def capture(self, fn):
        self.counters.peak = self.counters.allocated + self.held
        return super().capture(fn)

    def allocated(self):
        return self.counters.allocated

    def peak(self):
        return self.counters.peak

    def reset_peak(self):
        self.counters.reset_peak()


def _graphed(counters, held=50):
    """GraphedSteps on one parameter and a micro-batch runner that first makes the allocator hold `before` bytes."""
    weight = torch.nn.Parameter(torch.zeros(2))
    steps = GraphedSteps([weight], backend=CountedGraphs(counters, held))

    def run(batch, num_items):
        loss = (weight * batch["x"]).sum()
        loss.backward()
        return loss.detach()

    def micro_batch(before):
        counters.hold(before)
        steps(run, {"x": torch.ones(2)}, None)

    return steps, micro_batch


def test_the_replay_peak_since_any_replay_is_the_most_any_later_one_held(allocator):
    steps, micro_batch = _graphed(allocator)
    before = [300, 100, 400, 250, 250, 380, 120, 90, 90, 200]
    for nbytes in [100, *before]:  # the first runs eagerly; the second is captured, and each from it on replayed
        micro_batch(nbytes)
    assert steps.replays == len(before) and steps.peak_bytes == 450
    for mark in range(len(before) + 2):
        assert steps.replay_peak_since(mark) == max([b + 50 for b in before[mark:]], default=0), mark


def test_the_memory_callback_reads_the_replay_peaks_and_writes_nothing_into_them(allocator):
    steps, micro_batch = _graphed(allocator)
    run = cuda_graphs.GraphedRun()
    memory = MemoryCallback(every=5, print_rank0=False, graphed_run=run)
    state, args = SimpleNamespace(global_step=0), SimpleNamespace(process_index=0)
    memory.on_train_begin(args, state, None, model=torch.nn.Linear(2, 2))

    def event(name, **kwargs):
        graphs = repr(vars(steps))  # what the callback may read, compared after the event: one-way
        getattr(memory, name)(args, state, None, **kwargs)
        assert repr(vars(steps)) == graphs

    event("on_step_begin")  # step 0: before the trainer's first micro-batch made the graphs
    run.steps = steps
    micro_batch(100)  # eager
    allocator.peak = 900  # a peak the capture's reset erases before any snapshot sees it
    micro_batch(100)  # captured (the graph holds 50 more), then replayed
    micro_batch(300)
    event("on_pre_optimizer_step")
    assert memory.last_row["peak_allocated_bytes"] == 350 and memory.last_row["graph_pool_bytes"] == 0
    state.global_step = 1
    allocator.hold(100)
    event("on_step_begin")  # a snapshot step: the allocator's peak is reset, the replays before it do not count
    micro_batch(120)
    event("on_pre_optimizer_step")
    assert memory.last_row["peak_allocated_bytes"] == 170  # the replay since, not the run's 350 nor the allocator's 120
    assert memory.peak_allocated_bytes() == memory.peak_allocated_bytes() == 900
    state.global_step = 2  # not a snapshot step: nothing is reset, the epoch's end still sees step 1's replay
    micro_batch(110)
    event("on_epoch_end")
    assert memory.last_row["peak_allocated_bytes"] == 170
    event("on_train_end")
    assert memory.run_peak_allocated_bytes == 900


def _tiny_trainer(tmp_path, trainer_class, callbacks=None, **extra):
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, learning_rate=1e-2, save_strategy="no", report_to="none",
                             use_cpu=True, disable_tqdm=True)
    return trainer_class(model=TinyModel(), args=args, train_dataset=TinyData(), callbacks=callbacks, **extra)


def test_a_graphed_trainer_needs_no_callbacks_and_counts_what_the_summary_would(tmp_path, monkeypatch):
    monkeypatch.setattr(cuda_graphs, "CudaGraphBackend", RerunGraphs)
    bare = _tiny_trainer(tmp_path, cuda_graphs.GraphedTrainer)
    bare.train()
    # 4 steps x 2 micro-batches x 2 samples, 4 unpadded tokens each (tests/callbacks/tiny.py); one eager, one shape
    assert bare.graphed_steps.eager_steps == 1 and bare.graphed_steps.replays == 7
    assert bare.graphed_run.batches.samples == 16 and int(bare.graphed_run.batches.tokens) == 64
    summaries = []
    for trainer_class in (Trainer, cuda_graphs.GraphedTrainer):
        run = cuda_graphs.GraphedRun() if trainer_class is not Trainer else None
        callbacks = build_callbacks(results_file=str(tmp_path / "results.jsonl"), query_tokens_per_sample=3,
                                    graphed_run=run)
        trainer = _tiny_trainer(tmp_path, trainer_class, callbacks, **({"graphed_run": run} if run else {}))
        trainer.train()
        summaries.append(callbacks[1].summary())
    counted = [(s["samples"], s["tokens"], s["steady_samples_per_s"] is not None) for s in summaries]
    assert counted[0] == counted[1] == (16, 16 * (4 + 3), True)  # the hook's count, and the trainer's
