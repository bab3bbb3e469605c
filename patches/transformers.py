"""transformers, as this project changes it. Checked with transformers 5.17 (GPU image) and 5.17.0 (CPU tests).

What is changed, and why:
- `transformers.masking_utils.is_tracing` (`masks_built_as_traced`): the attention-mask helpers read the mask on the
  host to skip it when nothing is padded, a wait that a CUDA graph cannot hold, and during a capture they would
  build a different mask than the eager batch before it. While CUDA graphs run (strategies/cuda_graphs.py
  `capture_safe`) they are told they are being traced, so every batch builds the full mask, with the same kernels.

What is read or overridden (transformers internals the engine relies on, no behaviour changed; listed in `PATCHED`
so that an upgrade that renames them fails tests/patches rather than a run):
- `Trainer.training_step`, overridden by `GraphedTrainer`, which calls the Trainer's own step inside a CUDA graph,
  feeds it through the private `Trainer._prepare_inputs` and keys its graphs on `current_gradient_accumulation_steps`
  (baked into the step as a constant) (strategies/cuda_graphs.py);
- `Trainer.optimizer_cls_and_kwargs`, set before training so the Trainer builds the shard-local optimizer
  (strategies/fsdp.py `step_local_shards`);
- `PreTrainedModel._from_config` and `config._attn_implementation` (models/build.py and families/ build random
  models in the target dtype and attention, on the target or meta device, as from_pretrained would);
- `_gradient_checkpointing_func`, bound on each layer by `gradient_checkpointing_enable`
  (callbacks/effective_config.py reads its `use_reentrant`);
- `transformers.integrations.INTEGRATION_TO_CALLBACK` (callbacks/__init__.py finds the reporting callbacks).
"""

from __future__ import annotations

import contextlib

# What this module changes in transformers and what the engine reads of its internals; tests/patches checks each.
# (owner, attribute): `owner` (a module or class, by dotted path) has `attribute`.
# (owner, attribute, "instance"): set on instances only (in __init__ or by other code); the owner's source sets it.
PATCHED = (
    # changed
    ("transformers.masking_utils", "is_tracing"),
    # overridden or read
    ("transformers.Trainer", "training_step"),
    ("transformers.Trainer", "_prepare_inputs"),
    ("transformers.Trainer", "current_gradient_accumulation_steps", "instance"),
    ("transformers.Trainer", "optimizer_cls_and_kwargs", "instance"),
    ("transformers.PreTrainedModel", "_from_config"),
    ("transformers.PreTrainedConfig", "_attn_implementation"),
    ("transformers.PreTrainedModel", "_gradient_checkpointing_func", "instance"),
    ("transformers.integrations", "INTEGRATION_TO_CALLBACK"),
)


@contextlib.contextmanager
def masks_built_as_traced():
    """Inside it, transformers' mask helpers believe they are traced, so none reads a mask on the host."""
    import transformers.masking_utils as masking

    traced = masking.is_tracing
    masking.is_tracing = lambda *args, **kwargs: True
    try:
        yield
    finally:
        masking.is_tracing = traced
