"""recipes/train.py as `accelerate launch` runs it, plus what the multi-process tests need to look inside.

    accelerate launch --config_file accelerate_configs/ddp4.yaml --num_processes 2 tests/recipes/launched.py \
        <dump folder> <train.py arguments...>

Each rank runs the real `recipes.train.run`, then writes <dump folder>/rank<N>.pt: its exit code, its parameters
before and after training (a DTensor by its local shard) and the labels (captions) of every training forward.
With ALTSCALE_FAIL_RANK=<rank> that rank raises as step 1 begins. With ALTSCALE_FSDP_ON_CPU=1 it first lifts
accelerate 1.15's one restriction that keeps FSDP off the CPU (AcceleratorState enables FSDP for accelerator
backends only), doing on MULTI_CPU exactly what that branch does on MULTI_GPU, so accelerate's real FSDP2 path
(fully_shard, activation checkpointing, full state dict) runs over gloo; strategies/fsdp.py's refusal of FSDP on
the CPU, which exists because of that restriction, is lifted with it.
"""

import dataclasses
import os
import sys
from pathlib import Path

import torch
from transformers import TrainerCallback



def allow_fsdp_on_cpu() -> None:
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    import altscale.strategies.launch

    original = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            # As accelerate/state.py does for MULTI_GPU: FSDP type, the precision policy, the plugin, and the same
            # type in PartialState (AcceleratorState copies PartialState's fields back on every later construction).
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    AcceleratorState.__init__ = init


class FailOnRank(TrainerCallback):
    """Raises on one rank as step 1 begins, as an OOM on one GPU would: the other rank is left in its collectives."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def on_step_begin(self, args, state, control, **kwargs):
        if args.process_index == self.rank and state.global_step == 1:
            raise RuntimeError(f"injected failure on rank {self.rank}")


def local(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    return (tensor.to_local() if hasattr(tensor, "to_local") else tensor).clone().cpu()


def main() -> int:
    dump, argv = Path(sys.argv[1]), sys.argv[2:]
    from altscale.config.machine import Machine
    from recipes import train

    machine = Machine.detect()
    if os.environ.get("ALTSCALE_FSDP_ON_CPU") == "1":
        allow_fsdp_on_cpu()
        machine = dataclasses.replace(machine, fsdp_on_cpu=True)  # what the patched accelerate now does

    seen = {}
    build_trainer = train.build_trainer

    def capture(*args, **kwargs):
        trainer = build_trainer(*args, **kwargs)
        seen["trainer"] = trainer
        if "ALTSCALE_FAIL_RANK" in os.environ:
            trainer.add_callback(FailOnRank(int(os.environ["ALTSCALE_FAIL_RANK"])))
        seen["before"] = {name: local(p) for name, p in trainer.model.named_parameters()}
        seen["batches"] = []  # what each rank's forward passes saw: evidence that the ranks trained on different data
        trainer.model.register_forward_pre_hook(
            lambda module, args, kwargs: seen["batches"].append(kwargs["labels"].tolist()) if module.training else None,
            with_kwargs=True)
        return trainer

    train.build_trainer = capture
    code = train.run(argv, machine)
    rank = int(os.environ.get("RANK", 0))
    trainer = seen.get("trainer")
    after = {name: local(p) for name, p in trainer.model.named_parameters()} if trainer is not None else {}
    dump.mkdir(parents=True, exist_ok=True)
    torch.save({"code": code, "before": seen.get("before", {}), "after": after, "batches": seen.get("batches", [])},
               dump / f"rank{rank}.pt")
    return code


if __name__ == "__main__":
    sys.exit(main())
