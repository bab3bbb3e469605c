"""Where the memory of a training step goes: bytes per category, and a callback that decides when to look.

`memory_by_category(model, optimizer)` is the measuring: a plain function, tested on CPU by itself.
`MemoryCallback` only decides when to call it (steps 0, 1, then every N, and each epoch end; four phases
of a step) and where the rows go (a printed line on rank 0, the Trainer's logs, the results file).

Counting rules, so that the numbers are the bytes a rank really holds:
- a tensor counts by its storage (`untyped_storage().nbytes()`), once per storage: tied or shared
  parameters and views into one flat buffer (ZeRO-1/2, FSDP1) count once;
- a DTensor (FSDP2) counts by its local shard (`to_local()`);
- bitsandbytes 4-bit weights count their packed uint8 storage plus their `quant_state` (absmax, code,
  offset, nested state2); 8-bit weights add their `SCB` scales; 8-bit optimizer states are uint8 tensors
  plus absmax and qmap, all counted at their true size;
- under DeepSpeed ZeRO the engine's flat buffers are counted (module parameters are empty placeholders
  under stage 3): see `_zero_tensors` for which attribute holds what (patches/deepspeed.py lists them);
- fp32 master weights (ZeRO) count as optimizer state: they exist only for the optimizer;
- each category is split by device: "gpu" is any accelerator, "cpu" is host memory (ZeRO offload).
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterable

import psutil
import torch
from transformers import TrainerCallback

from altscale.patches.torch import fsdp_param_groups

GIB = 2**30
PHASES = ("before_fwd", "after_fwd", "after_bwd", "after_step")
# What the step was doing when the memory ran out, given the last phase it reached.
_DOING_AFTER = {
    "before_fwd": "during the forward pass",
    "after_fwd": "during the backward pass",
    "after_bwd": "during the optimizer step",
    "after_step": "after the optimizer step (zero_grad, logging or the next batch)",
    "epoch_end": "between epochs",
}

try:  # FSDP2 shards parameters as DTensors; older or CPU-only builds may lack the module.
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover
    DTensor = None


# ---------------------------------------------------------------- measuring


class _Tally:
    """Bytes per (category, device kind), each storage counted once across all categories."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, int]] = set()
        self.bytes = {f"{cat}_{where}": 0 for cat in ("params", "grads", "optim") for where in ("gpu", "cpu")}

    def add(self, category: str, obj: Any) -> None:
        for tensor in _tensors_in(obj):
            if DTensor is not None and isinstance(tensor, DTensor):
                tensor = tensor.to_local()
            if tensor.device.type == "meta":
                continue
            try:
                storage = tensor.untyped_storage()
                pointer, nbytes = storage.data_ptr(), storage.nbytes()
            except (RuntimeError, NotImplementedError):  # tensors without a plain storage (sparse, ...)
                pointer, nbytes = tensor.data_ptr(), tensor.numel() * tensor.element_size()
            key = (str(tensor.device), pointer)
            if pointer == 0 or key in self.seen:  # empty placeholders (ZeRO-3 parameters) hold no memory
                continue
            self.seen.add(key)
            where = "cpu" if tensor.device.type == "cpu" else "gpu"
            self.bytes[f"{category}_{where}"] += nbytes


def _tensors_in(obj: Any) -> Iterable[torch.Tensor]:
    """Every tensor reachable through lists, dicts and bitsandbytes' quantization side tensors."""
    if obj is None:
        return
    if isinstance(obj, torch.Tensor):
        yield obj
        quant_state = getattr(obj, "quant_state", None)  # bnb Params4bit
        if quant_state is not None:
            yield from _tensors_in(quant_state)
        scales = getattr(obj, "SCB", None)  # bnb Int8Params
        if isinstance(scales, torch.Tensor):
            yield scales
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors_in(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors_in(value)
    elif type(obj).__name__ == "QuantState":  # bnb 4-bit: absmax, code, offset, nested state2
        for name in ("absmax", "code", "offset", "state2"):
            yield from _tensors_in(getattr(obj, name, None))
    elif hasattr(obj, "buffer"):  # DeepSpeed IPG buckets hold their reduce buffers in .buffer
        yield from _tensors_in(obj.buffer)


def unwrap_optimizer(optimizer: Any) -> Any:
    """The optimizer that holds the state: through accelerate's AcceleratedOptimizer / DeepSpeedOptimizerWrapper."""
    while optimizer is not None and type(optimizer).__name__ in ("AcceleratedOptimizer", "DeepSpeedOptimizerWrapper"):
        optimizer = optimizer.optimizer
    return optimizer


def zero_stage(optimizer: Any) -> int | None:
    """1/2 or 3 when `optimizer` (unwrapped) is a DeepSpeed ZeRO optimizer, else None."""
    if hasattr(optimizer, "fp32_partitioned_groups_flat"):
        return 3
    if hasattr(optimizer, "single_partition_of_fp32_groups"):
        return 2 if getattr(optimizer, "partition_gradients", False) else 1
    return None


def _zero_tensors(zero: Any) -> dict[str, list]:
    """What a DeepSpeed 0.19 ZeRO optimizer keeps, by category (attribute names read from its source).

    Stage 1/2 (`DeepSpeedZeroOptimizer`, runtime/zero/stage_1_and_2.py): `bit16_groups_flat` holds every
    bf16/fp16 parameter (the module's parameters are views into it); `single_partition_of_fp32_groups` is
    this rank's fp32 master partition (on CPU under offload_optimizer), its `.grad` the fp32 gradient
    partition (pinned host memory under offload); `averaged_gradients`, `ipg_buckets[*].buffer`,
    `grads_in_partition` and `accumulated_grads_in_cpu` hold gradients on their way to the partition;
    `param_buffer_of_bit16_for_cpu_offload_groups` is the host copy used to send updated weights back.
    Stage 3 (`DeepSpeedZeroOptimizer_Stage3`, runtime/zero/stage3.py): `fp16_partitioned_groups_flat` /
    `lp_param_buffer` hold this rank's bf16 partition (parameters themselves are empty placeholders
    outside of forward/backward); `fp32_partitioned_groups_flat` the fp32 master partition;
    `grad_partitions_flat_buffer` / `lp_grad_partitions_flat_pin_buffers` the gradient partition.
    Both: `.optimizer.state` holds the Adam moments, keyed by the fp32 partitions.
    Every name is listed in patches/deepspeed.py, whose test checks them where DeepSpeed is installed.
    """
    stage = zero_stage(zero)
    if stage == 3:
        params = ["fp16_partitioned_groups_flat", "lp_param_buffer"]
        grads = ["grad_partitions_flat_buffer", "lp_grad_partitions_flat_pin_buffers", "averaged_gradients",
                 "ipg_buckets"]
        master = "fp32_partitioned_groups_flat"
    else:
        params = ["bit16_groups_flat", "param_buffer_of_bit16_for_cpu_offload_groups"]
        grads = ["averaged_gradients", "ipg_buckets", "grads_in_partition", "accumulated_grads_in_cpu"]
        master = "single_partition_of_fp32_groups"
    master_partitions = list(getattr(zero, master, []))
    return {
        "params": [getattr(zero, name, None) for name in params],
        "grads": [getattr(zero, name, None) for name in grads] + [p.grad for p in master_partitions],
        "optim": master_partitions + [getattr(zero.optimizer, "state", {})],
    }


def communication_buffers(model: Any) -> dict[str, Any] | None:
    """What data parallelism holds besides params, grads and optimizer state: part of the act+other residual.

    `model` is the Trainer's `model_wrapped`. Read from the wrappers themselves (docs/memory.md):
    - DDP: its gradient buckets, from DDP's own logging data (`bucket_sizes`, bytes). With
      `gradient_as_bucket_view` off (torch's default, and the Trainer's) they are a second copy of every
      gradient, allocated at the first backward and kept: `extra_bytes`.
    - FSDP2: per unit (one `fully_shard` call), the bytes its parameters take once all-gathered, in the dtype
      they are gathered in: the largest unit bounds the gather buffers of one forward or backward step
      (prefetching can hold the next unit's as well), and units that do not reshard after forward (the root,
      accelerate's embedding + head unit) stay gathered from their forward until their backward.
    None for a single device or DeepSpeed (whose buffers memory_by_category counts), or where torch's
    internals differ from 2.11-2.13's (the private ones read here are listed in patches/torch.py).
    """
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        try:
            data = model._get_ddp_logging_data()
            sizes = [int(size) for size in str(data.get("bucket_sizes", "")).split(",") if size]
        except (AttributeError, RuntimeError, ValueError):
            return None
        as_view = bool(data.get("gradient_as_bucket_view"))
        return {"kind": "ddp", "buckets": len(sizes), "bucket_bytes": sum(sizes),
                "gradient_as_bucket_view": as_view, "extra_bytes": 0 if as_view else sum(sizes)}
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        return None
    if model is None or not isinstance(model, torch.nn.Module):
        return None
    states = {id(state): state for state in (m._get_fsdp_state() for m in model.modules() if isinstance(m, FSDPModule))}
    if not states:
        return None
    try:
        units = []
        for state in states.values():
            for group in fsdp_param_groups(state):
                gathered = sum(torch.Size(p._orig_size).numel() * (p.param_dtype or p.orig_dtype).itemsize
                               for p in group.fsdp_params)
                units.append((gathered, group.post_forward_mesh_info is None))
    except AttributeError:
        return None
    return {"kind": "fsdp2", "units": len(units), "largest_unit_gathered_bytes": max(b for b, _ in units),
            "kept_gathered_bytes": sum(b for b, kept in units if kept), "all_gathered_bytes": sum(b for b, _ in units)}


def memory_by_category(model: torch.nn.Module, optimizer: Any = None,
                       grad_buffers: list[torch.Tensor] | None = None) -> dict[str, int | None]:
    """Bytes this rank holds, per category; CUDA figures are None when CUDA is not in use.

    Keys: params/grads/optim × gpu/cpu (from the tensors themselves), allocated_bytes,
    peak_allocated_bytes, reserved_bytes (CUDA caching allocator, current device), act_other_bytes
    (a residual: allocated − params_gpu − grads_gpu − optim_gpu, so activations plus everything not
    named above: workspace, temporary buffers, fragments of freed blocks still allocated; it can be
    negative when counted tensors live outside the allocator, e.g. bnb paged optimizers in managed memory),
    rss_bytes (host resident set of this process). `grad_buffers`: gradient tensors kept while no parameter
    holds them (CUDA graphs keep theirs across zero_grad: strategies/cuda_graphs.py); they count as grads.
    """
    tally = _Tally()
    inner = unwrap_optimizer(optimizer)
    if zero_stage(inner) is not None:
        for category, objects in _zero_tensors(inner).items():
            tally.add(category, objects)
    for param in model.parameters():
        tally.add("params", param)
        tally.add("params", getattr(param, "ds_tensor", None))  # ZeRO-3 partition (a view: counted once)
        tally.add("grads", param.grad)
    tally.add("grads", grad_buffers)  # the same storages as param.grad while attached: counted once
    if inner is not None and zero_stage(inner) is None:
        tally.add("optim", list(getattr(inner, "state", {}).values()))

    row: dict[str, int | None] = dict(tally.bytes)
    row.update(allocated_bytes=None, peak_allocated_bytes=None, reserved_bytes=None, act_other_bytes=None)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        allocated = torch.cuda.memory_allocated()
        row.update(
            allocated_bytes=allocated,
            peak_allocated_bytes=torch.cuda.max_memory_allocated(),
            reserved_bytes=torch.cuda.memory_reserved(),
            act_other_bytes=allocated - row["params_gpu"] - row["grads_gpu"] - row["optim_gpu"],
        )
    row["rss_bytes"] = psutil.Process(os.getpid()).memory_info().rss
    return row


def format_snapshot(row: dict[str, Any]) -> str:
    """One aligned line, every figure in GiB; CUDA figures print as n/a on CPU-only runs."""

    def gib(key: str) -> str:
        value = row.get(key)
        return "  n/a" if value is None else f"{value / GIB:5.2f}"

    pool = f" (graph pool {gib('graph_pool_bytes').strip()})" if row.get("graph_pool_bytes") else ""
    return (
        f"[step {row['step']:>5} | {row['phase']:<10}] "
        f"params {gib('params_gpu')} | grads {gib('grads_gpu')} | optim {gib('optim_gpu')} | "
        f"act+other {gib('act_other_bytes')} | alloc {gib('allocated_bytes')} (peak {gib('peak_allocated_bytes')}) | "
        f"reserved {gib('reserved_bytes')}{pool} | cpu: params {gib('params_cpu')} grads {gib('grads_cpu')} "
        f"optim {gib('optim_cpu')} rss {gib('rss_bytes')} | GiB"
    )


# ---------------------------------------------------------------- when to measure


class MemoryCallback(TrainerCallback):
    """Takes `memory_by_category` at four phases of steps 0, 1, every `every` steps, and at each epoch end.

    Phases and the Trainer events (transformers 5.17, `Trainer._run_epoch`) that mark them:
    - before_fwd: `on_step_begin`, fired on the first micro-batch of an optimizer step;
    - after_fwd: a forward hook on the model, in training mode, first micro-batch of the step only;
    - after_bwd: `on_pre_optimizer_step`, after the last micro-batch's backward and gradient clipping;
    - after_step: `on_optimizer_step`, right after `optimizer.step()`, before `zero_grad` (so the
      gradients are still held). Under DeepSpeed, accelerate runs `engine.step()` (clip, step, zero
      grads) inside `backward`, so after_bwd and after_step both come after the real step.
    The step number is `state.global_step` at the time: the number of optimizer steps already done.

    At each snapshot step's start the CUDA peak counter is reset, so `peak_allocated_bytes` is the
    peak within that step up to the phase; the run's overall peak is kept in `run_peak_allocated_bytes`.
    Cheap bookkeeping (`last_step`, `last_phase`) runs at every step so an OOM can be placed exactly.

    `graphed_run` (strategies.cuda_graphs.GraphedRun, under cuda_graphs): a CUDA graph's replays allocate nothing
    the allocator's counters see; the callback reads their pool, gradient buffers and peaks from it, and writes
    nothing into it.
    """

    def __init__(self, every: int = 50, print_rank0: bool = True, graphed_run: Any = None) -> None:
        if every < 1:
            raise ValueError(f"memory_log_steps must be at least 1, got {every}")
        self.every = every
        self.print_rank0 = print_rank0
        self.rows: list[dict[str, Any]] = []
        self.last_step: int | None = None
        self.last_phase: str | None = None
        self.run_peak_allocated_bytes: int | None = None
        self._model = None
        self._optimizer = None
        self._hook = None
        self._want_after_fwd = False
        self._unlogged: list[dict[str, Any]] = []
        self._rank = 0
        self.graphed_run = graphed_run
        self._replay_mark = 0  # replays before this callback last reset the allocator's peak: not in a row's peak

    def is_snapshot_step(self, step: int) -> bool:
        return step in (0, 1) or step % self.every == 0

    @property
    def last_row(self) -> dict[str, Any] | None:
        return self.rows[-1] if self.rows else None

    def _graphs(self):
        """The run's GraphedSteps, once its first micro-batch made them; None without CUDA graphs."""
        return self.graphed_run.steps if self.graphed_run is not None else None

    def _take(self, state, phase: str) -> None:
        row = {"rank": self._rank, "step": state.global_step, "phase": phase, "time_s": time.time()}
        graphs = self._graphs()
        row.update(memory_by_category(self._model, self._optimizer, graphs.grads if graphs is not None else None))
        if graphs is not None and row["peak_allocated_bytes"] is not None:
            # A replay's activations are invisible to the allocator's counters: the pool holds them.
            row["graph_pool_bytes"] = graphs.pool_bytes
            row["peak_allocated_bytes"] = max(row["peak_allocated_bytes"], graphs.replay_peak_since(self._replay_mark))
        self.rows.append(row)
        self._unlogged.append(row)
        if self.print_rank0 and self._rank == 0:
            print(format_snapshot(row), flush=True)

    def _mark(self, state, phase: str) -> None:
        self.last_step, self.last_phase = state.global_step, phase

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self._model, self._optimizer, self._rank = model, optimizer, args.process_index
        if self._hook is not None:
            self._hook.remove()
        self._hook = model.register_forward_hook(self._after_forward)
        self._state = state

    def _after_forward(self, module, inputs, output) -> None:
        if not module.training:
            return
        self._mark(self._state, "after_fwd")
        if self._want_after_fwd:
            self._want_after_fwd = False
            self._take(self._state, "after_fwd")

    def on_step_begin(self, args, state, control, **kwargs):
        self._state = state
        self._mark(state, "before_fwd")
        snapshot = self.is_snapshot_step(state.global_step)
        self._want_after_fwd = snapshot
        if snapshot:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                self.run_peak_allocated_bytes = self.peak_allocated_bytes()  # before the reset erases it
                torch.cuda.reset_peak_memory_stats()
                if (graphs := self._graphs()) is not None:
                    self._replay_mark = graphs.replays
            self._take(state, "before_fwd")

    def on_substep_end(self, args, state, control, **kwargs):
        self._want_after_fwd = False  # only the step's first forward; a replayed one (CUDA graph) fires no hook

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self._want_after_fwd = False
        self._mark(state, "after_bwd")
        if self.is_snapshot_step(state.global_step):
            self._take(state, "after_bwd")

    def on_optimizer_step(self, args, state, control, **kwargs):
        self._mark(state, "after_step")
        if self.is_snapshot_step(state.global_step):
            self._take(state, "after_step")

    def on_epoch_end(self, args, state, control, **kwargs):
        self._mark(state, "epoch_end")
        self._take(state, "epoch_end")

    def on_log(self, args, state, control, logs=None, **kwargs):
        """Adds the snapshots taken since the last log to `logs` and to that log_history entry.

        Reporting callbacks (TensorBoard) only see these keys if they run after this one: see
        `callbacks.log_memory_before_reporters`.
        """
        if logs is None or not self._unlogged:
            return
        if not args.report_to:
            # Nobody listens but the console, which already printed each snapshot as one line.
            self._unlogged = []
            return
        values = {}
        for row in self._unlogged:
            for key in ("params_gpu", "grads_gpu", "optim_gpu", "params_cpu", "grads_cpu", "optim_cpu", "act_other_bytes",
                        "allocated_bytes", "peak_allocated_bytes", "reserved_bytes", "rss_bytes"):
                if row.get(key) is not None:
                    name = key.removesuffix("_bytes")
                    values[f"memory/{row['phase']}/{name}_gib"] = row[key] / GIB
        self._unlogged = []
        logs.update(values)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(values)

    def on_train_end(self, args, state, control, **kwargs):
        self.run_peak_allocated_bytes = self.peak_allocated_bytes()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def peak_allocated_bytes(self) -> int | None:
        """The run's CUDA peak so far on this rank (None without CUDA); reads, changes nothing.

        The allocator's peak counter since its last reset, the peaks kept before this callback's resets, and under
        CUDA graphs the replays' peak and what the counter read when a capture reset it.
        """
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return self.run_peak_allocated_bytes
        peak = torch.cuda.max_memory_allocated()
        graphs = self._graphs()
        if graphs is not None:
            peak = max(peak, graphs.peak_bytes, graphs.erased_peak_bytes)
        return max(self.run_peak_allocated_bytes or 0, peak)


# ---------------------------------------------------------------- after an OOM


def oom_advice(row: dict[str, Any] | None) -> str:
    """One line of advice, chosen by the category that holds the most accelerator memory."""
    if row is None:
        return ("advice: the run failed before the first measurement; load the model in bf16 or 4-bit, "
                "or shard it (FSDP, DeepSpeed ZeRO-3)")
    # On a CPU-only run nothing is on the accelerator: judge by the host figures instead.
    where = "gpu" if any(row.get(f"{cat}_gpu") for cat in ("params", "grads", "optim")) else "cpu"
    shares = {
        "params": row.get(f"params_{where}") or 0,
        "grads": row.get(f"grads_{where}") or 0,
        "optim": row.get(f"optim_{where}") or 0,
        "act_other": row.get("act_other_bytes") or 0,
    }
    largest = max(shares, key=shares.get)
    return "advice: " + {
        "act_other": "activations dominate: lower per_device_train_batch_size (raise gradient_accumulation_steps "
                     "to keep the global batch) or set gradient_checkpointing: true",
        "optim": "optimizer state dominates: set optim: adamw_bnb_8bit, or offload it with a DeepSpeed "
                 "ZeRO config with offload_optimizer, or train LoRA adapters only",
        "params": "weights dominate: train in bf16, load the frozen weights in 4-bit (QLoRA), "
                  "or shard them with FSDP or DeepSpeed ZeRO-3",
        "grads": "gradients dominate: freeze more of the model (LoRA), train in bf16, "
                 "or shard gradients with DeepSpeed ZeRO-2",
    }[largest]


def oom_report(memory_callback: MemoryCallback, exc: BaseException | None = None) -> str:
    """Where the OOM happened, the last breakdown taken, and one line of advice (several lines of text)."""
    cb = memory_callback
    lines = []
    if cb.last_phase is None:
        lines.append("OOM before the first training step")
    else:
        doing = _DOING_AFTER.get(cb.last_phase, "")
        lines.append(f"OOM at step {cb.last_step} {cb.last_phase} ({doing})")
    if exc is not None and str(exc):
        lines.append(f"torch: {str(exc).splitlines()[0]}")
    row = cb.last_row
    if row is not None:
        lines.append(f"last breakdown (step {row['step']} {row['phase']}):")
        lines.append(format_snapshot(row))
    peak = cb.peak_allocated_bytes()
    if peak is not None:
        lines.append(f"peak allocated in the run: {peak / GIB:.2f} GiB")
    lines.append(oom_advice(row))
    return "\n".join(lines)
