"""Replay each micro-batch's forward and backward as one CUDA graph: the host launches one graph, not ~5,000 kernels.

On the GPUs we measured, an eager BLIP-2 step is bound by the host: the Python and dispatcher work that launches
each kernel takes longer than the kernel (docs/speed.md). A CUDA graph records the kernels of one forward+backward
once and replays them with a single launch; the numerics are the eager ones, kernel for kernel.

How it fits the Trainer (`GraphedTrainer.training_step`, transformers 5.17's own step inside, fed by the Trainer's
private `_prepare_inputs`: both listed in patches/transformers.py):
- A graph fixes every shape and address. A batch's signature (shapes and dtypes of its tensors, the accumulation
  count) picks its graph. The first batch of a signature runs eagerly, which also builds that shape's cuBLAS and
  cuDNN plans; the second is captured, and every later one replays. At most `max_graphs` signatures are captured
  (captions padded to a multiple, `pad_to_multiple_of`, keep them few); the rest run eagerly. All graphs share one
  memory pool: they run one at a time, so the pool is as large as the largest graph's activations, not their sum.
- Inputs are copied into the graph's own input tensors before each replay; the loss is copied out.
- Gradients accumulate inside the graph into tensors whose addresses the graph holds. The Trainer frees gradients
  after each optimizer step (`model.zero_grad()` sets them to None), so before each micro-batch every trainable
  parameter gets its gradient tensor back, zeroed if it had been let go. These are the gradients eager training
  would allocate anyway; they are simply never freed.
- A graph cannot hold an operation that waits for the host. The first (eager) batch of a signature runs with
  torch's sync check on (if the run's very first batch syncs, it may be lazy set-up: its next batch is watched
  too): a signature whose step synchronizes is never captured and runs eagerly, and the run record says where.
  Two such waits in transformers 5.17's BLIP-2 step are removed while graphs are on (`capture_safe`): the
  backward of `masked_scatter` (placing the 32 query outputs among the text embeddings) selects with a
  data-dependent size, so it is replaced by the same copy written as a gather (identical values and gradients); and
  the attention-mask helpers, which read the mask on the host to skip it when nothing is padded, are told they are
  being traced, as they are during a capture, so the eager batch and the capture build the same masks and kernels
  (patches/torch.py and patches/transformers.py hold the two changes).
- If a capture still fails, the run goes on eagerly and the reason is kept for the run record.

Memory: during a replay the allocator sees nothing, so `torch.cuda.max_memory_allocated` misses the activations.
`peak_bytes` adds them back: memory allocated just before a replay plus the most the graph held live while it was
captured (measured at capture). `pool_bytes` is what the shared pool reserves.

Callbacks only observe (tests/callbacks/test_observe_only.py): the recipe makes a `GraphedRun`, hands it to the
callbacks (`build_callbacks(graphed_run=...)`) and to the `GraphedTrainer`; the trainer fills it, the callbacks read
it in their own events. Nothing here sets a callback's attributes or calls its methods.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import Trainer

from altscale.callbacks.summary import BatchCounts
from altscale.patches.torch import masked_scatter_as_gather
from altscale.patches.transformers import masks_built_as_traced


class CudaGraphBackend:
    """torch.cuda.CUDAGraph captures sharing one memory pool (the real thing; tests substitute a CPU stand-in)."""

    def __init__(self) -> None:
        self.pool = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        """Record `fn` (nothing runs); returns the replay function and `fn`'s output, which each replay rewrites."""
        graph = torch.cuda.CUDAGraph()
        # thread_local: the DataLoader's pin-memory thread may allocate pinned host memory during a capture.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            output = fn()
        if self.pool is None:
            self.pool = graph.pool()
        return graph.replay, output

    def syncs_during(self, fn: Callable[[], Any]) -> tuple[Any, list[str]]:
        """Runs `fn` with torch's sync debug mode warning; returns its result and where (Python lines) this thread
        synchronized. Warnings of other threads (the GPU-utilization sampler, the pin-memory thread) are not ours."""
        found, me = [], threading.get_ident()

        def note(message, category, filename, lineno, file=None, line=None):
            # torch's own words for a sync (set_sync_debug_mode also warns, about being a prototype: not a sync)
            if threading.get_ident() == me and "called a synchronizing CUDA operation" in str(message):
                found.append(" < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}"
                                        for f in reversed(traceback.extract_stack()[-5:-1])))

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = note
            torch.cuda.set_sync_debug_mode("warn")
            try:
                result = fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return result, found

    def recover(self) -> None:
        """After a failed capture: torch leaves its CUDA RNG in capture mode (every later dropout fails); an empty
        capture closes it."""
        torch.cuda.synchronize()
        with torch.cuda.graph(torch.cuda.CUDAGraph(), capture_error_mode="thread_local"):
            pass

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def allocated(self) -> int:
        return torch.cuda.memory_allocated()

    def reserved(self) -> int:
        return torch.cuda.memory_reserved()

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated()

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def release_cached(self) -> None:
        torch.cuda.empty_cache()


class _Graph:
    def __init__(self, inputs: dict[str, Any], num_items: torch.Tensor | None) -> None:
        # The graph reads these tensors: each replay first copies the batch into them.
        self.inputs = {k: v.clone() if torch.is_tensor(v) else v for k, v in inputs.items()}
        self.num_items = num_items.clone() if num_items is not None else None
        self.replay: Callable[[], None] | None = None
        self.loss: torch.Tensor | None = None
        self.live_bytes = 0  # the most the graph holds at once (its activations), measured at capture

    def load(self, inputs: dict[str, Any], num_items: torch.Tensor | None) -> None:
        for name, value in inputs.items():
            if torch.is_tensor(value):
                self.inputs[name].copy_(value, non_blocking=True)
        if num_items is not None:
            self.num_items.copy_(num_items, non_blocking=True)


class GraphedSteps:
    """Forward+backward of micro-batches as CUDA graphs, one per batch signature (see the module docstring)."""

    def __init__(self, params: list[torch.nn.Parameter], max_graphs: int = 4, backend=None) -> None:
        if max_graphs < 1:
            raise ValueError(f"cuda_graph_max_shapes: {max_graphs}; use 1 or more")
        self.params = [p for p in params if p.requires_grad]
        self.max_graphs = max_graphs
        self.backend = backend or CudaGraphBackend()
        self.grads: list[torch.Tensor] | None = None
        self.graphs: dict[tuple, _Graph] = {}
        self.clean: set[tuple] = set()  # signatures whose eager step was watched and never waited for the host
        self.uncapturable: dict[tuple, list[str]] = {}  # signature -> where its step synchronized
        self.failed: str | None = None  # why capturing stopped, if it did
        self.eager_steps = 0
        self.replays = 0
        self.pool_bytes = 0
        self.peak_bytes = 0
        # A capture resets the allocator's peak counter, which others read too: what it read then is kept here.
        self.erased_peak_bytes = 0
        self._replay_peaks: list[tuple[int, int]] = []  # (replay, bytes) of each replay no later one reached

    def __call__(self, run: Callable[[dict, Any], torch.Tensor], inputs: dict[str, Any], num_items: Any,
                 extra_key: tuple = ()) -> torch.Tensor:
        """One micro-batch: `run(inputs, num_items)` is the eager forward+backward, returning the detached loss."""
        device = next(v.device for v in inputs.values() if torch.is_tensor(v))
        if isinstance(num_items, int):  # a Python count would be baked into the graph as a constant
            num_items = torch.tensor(num_items, device=device)
        self._attach_grads()
        key = signature(inputs, num_items) + extra_key
        graph = self.graphs.get(key)
        if graph is None:
            with capture_safe():
                if key not in self.clean and key not in self.uncapturable:  # eager, watched for host syncs
                    first_of_run = self.eager_steps == 0  # no capture comes before an eager step
                    self.eager_steps += 1
                    loss, syncs = self.backend.syncs_during(lambda: run(inputs, num_items))
                    if not syncs:
                        self.clean.add(key)
                    elif not first_of_run:  # the run's first batch may sync once for lazy set-up: watch again
                        self.uncapturable[key] = syncs
                        print(f"cuda_graphs: not capturing {describe(key)}: the step waits for the host at "
                              f"{'; '.join(sorted(set(syncs)))}", flush=True)
                    return loss
                if not (self.failed or key in self.uncapturable or len(self.graphs) >= self.max_graphs):
                    graph = self._capture(run, inputs, num_items, key)
                if graph is None:
                    self.eager_steps += 1
                    return run(inputs, num_items)
        graph.load(inputs, num_items)
        during = self.backend.allocated() + graph.live_bytes
        self.peak_bytes = max(self.peak_bytes, during)
        self._note_replay_peak(during)
        graph.replay()
        self.replays += 1
        return graph.loss.clone()

    def _note_replay_peak(self, during: int) -> None:
        while self._replay_peaks and self._replay_peaks[-1][1] <= during:
            self._replay_peaks.pop()  # never again the most since any mark: this replay is later and as large
        self._replay_peaks.append((self.replays, during))

    def replay_peak_since(self, replay: int) -> int:
        """The most memory any replay from number `replay` on held (0 if none ran since).

        A reader that resets the allocator's peak notes `replays` then, and asks for the replays' share of the peak
        since, without anyone resetting a counter on its behalf. The kept peaks fall from oldest to newest, so the
        first at or after `replay` is the largest; while the memory before a replay stays level they are few.
        """
        at = bisect.bisect_left(self._replay_peaks, replay, key=lambda peak: peak[0])
        return self._replay_peaks[at][1] if at < len(self._replay_peaks) else 0

    def _attach_grads(self) -> None:
        """Every trainable parameter holds its own gradient tensor; zero those the Trainer had let go."""
        if self.grads is None:
            self.grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in self.params]
            for param, grad in zip(self.params, self.grads):
                param.grad = grad
            return
        released = []
        for param, grad in zip(self.params, self.grads):
            if param.grad is None:
                param.grad = grad
                released.append(grad)
            elif param.grad is not grad:  # someone replaced it: keep its values in the tensor the graphs write to
                grad.copy_(param.grad)
                param.grad = grad
        if released:
            torch._foreach_zero_(released)

    def _capture(self, run, inputs, num_items, key) -> _Graph | None:
        graph = _Graph(inputs, num_items)
        backend = self.backend
        backend.synchronize()
        backend.release_cached()  # the eager step's cached activations go back, for the graph's pool to take
        reserved, allocated = backend.reserved(), backend.allocated()
        self.erased_peak_bytes = max(self.erased_peak_bytes, backend.peak())
        backend.reset_peak()
        try:
            graph.replay, graph.loss = backend.capture(lambda: run(graph.inputs, graph.num_items))
        except Exception as err:  # noqa: BLE001 (any failure to record: fall back to eager, say why)
            self.failed = root_cause(err)
        if self.failed:
            # Outside the except block: the traceback no longer holds the failed graph, so its pool can be freed.
            print(f"cuda_graphs: capture failed, training on eagerly ({self.failed})", flush=True)
            try:
                backend.recover()
                backend.release_cached()
            except Exception as again:  # noqa: BLE001
                raise RuntimeError(f"cuda_graphs: capture failed ({self.failed}) and CUDA did not recover "
                                   f"({root_cause(again)}); run without cuda_graphs") from None
            return None
        graph.live_bytes = max(0, backend.peak() - allocated)
        self.pool_bytes += max(0, backend.reserved() - reserved)
        self.graphs[key] = graph
        return graph

    def report(self) -> dict[str, Any]:
        """What ran, for the run record."""
        return {
            "graphs": len(self.graphs),
            "shapes": [describe(key) for key in self.graphs],
            "replays": self.replays,
            "eager_micro_batches": self.eager_steps,
            "pool_bytes": self.pool_bytes,
            "peak_bytes": self.peak_bytes,
            "capture_failed": self.failed,
            "not_captured": {describe(key): sorted(set(where)) for key, where in self.uncapturable.items()},
        }


def root_cause(err: BaseException) -> str:
    """The first error of a chain: a failed capture reports "operation failed due to a previous error during
    capture", raised while the real one (the operation that could not be recorded) is its context."""
    while err.__cause__ is not None or err.__context__ is not None:
        err = err.__cause__ or err.__context__
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".strip()


@contextlib.contextmanager
def capture_safe():
    """BLIP-2's training step without its two host waits (see the module docstring), for eager and captured runs.
    Both are changes to a library, kept with that library's others: patches/transformers.py, patches/torch.py."""
    with masks_built_as_traced(), masked_scatter_as_gather():
        yield


def signature(inputs: dict[str, Any], num_items: Any) -> tuple:
    """What a graph fixes about a batch: each tensor's shape and dtype, every other value itself."""
    parts = []
    for name in sorted(inputs):
        value = inputs[name]
        parts.append((name, tuple(value.shape), str(value.dtype)) if torch.is_tensor(value) else (name, repr(value)))
    parts.append(("num_items_in_batch", None if num_items is None else tuple(num_items.shape)))
    return tuple(parts)


def describe(key: tuple) -> str:
    return " ".join(f"{part[0]}{list(part[1])}" for part in key if isinstance(part, tuple) and len(part) == 3)


class GraphedRun:
    """What a GraphedTrainer's micro-batches did that its callbacks cannot see for themselves, for them to read.

    A replay runs no forward hook (where the run summary counts samples and tokens) and allocates nothing the
    allocator's counters see (the memory callback's peaks). The recipe makes one before the Trainer and hands it to
    both: the trainer fills it, the callbacks read it, so no code outside a callback writes into one.
    """

    def __init__(self) -> None:
        self.steps: GraphedSteps | None = None  # made at the first micro-batch, from the model the Trainer trains
        self.batches = BatchCounts()  # every training micro-batch, replayed or eager


class GraphedTrainer(Trainer):
    """The Trainer, with each micro-batch's forward+backward replayed as a CUDA graph (`cuda_graphs: true`).

    `graphed_run`: the GraphedRun its callbacks were given (build_callbacks); without one it keeps its own.
    """

    def __init__(self, *args, cuda_graph_max_shapes: int = 4, graphed_run: GraphedRun | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.cuda_graph_max_shapes = cuda_graph_max_shapes
        self.graphed_run = graphed_run if graphed_run is not None else GraphedRun()

    @property
    def graphed_steps(self) -> GraphedSteps | None:
        """What the graphs ran, for the run record (callbacks/results.py); None before the first micro-batch."""
        return self.graphed_run.steps

    def training_step(self, model, inputs, num_items_in_batch=None):
        run = self.graphed_run
        if run.steps is None:  # the parameters of the model as the Trainer prepared it
            run.steps = GraphedSteps(list(model.parameters()), max_graphs=self.cuda_graph_max_shapes)
        run.batches.add(inputs)  # a replay runs no forward hook: the run summary reads these counts instead
        eager = super().training_step
        return run.steps(
            lambda batch, num_items: eager(model, batch, num_items),
            self._prepare_inputs(inputs),
            num_items_in_batch,
            # Baked into a graph as constants by the Trainer's step: a different value needs its own graph.
            extra_key=(("accumulation", self.current_gradient_accumulation_steps),),
        )
