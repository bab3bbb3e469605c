"""bitsandbytes, as this project changes it: one logger quieted. Checked with bitsandbytes 0.50.2 (CPU tests and GPU
image).

What is changed, and why: importing it on a CPU with AVX512-BF16 logs that an optional package for 4-bit *CPU* kernels
("kernels") is missing: nothing here runs 4-bit on the CPU, and the line reads like an error in every CPU run's
output. Scripts import this module before anything that imports bitsandbytes (transformers does, through its
quantizers); the logger's level is the only change.

What is read (bitsandbytes internals the engine relies on, no behaviour changed; listed in `PATCHED` so that an upgrade
that renames them fails tests/patches): the memory breakdown (callbacks/memory.py) counts a 4-bit weight's packed
storage plus its `quant_state` (`absmax`, `code`, `offset`, nested `state2`: a `QuantState`), an 8-bit weight's `SCB`
scales; the effective configuration (callbacks/effective_config.py) reads a 4-bit weight's logical `shape` from its
quant state and an 8-bit optimizer's `optim_bits` from its `args`.
"""

import logging

LOGGER = "bitsandbytes"
logging.getLogger(LOGGER).setLevel(logging.ERROR)

# What the engine reads of bitsandbytes' internals; tests/patches checks each exists.
# (owner, attribute): `owner` (a module or class, by dotted path) has `attribute`.
# (owner, attribute, "instance"): set on instances only (in __init__ or by other code); the owner's source sets it.
# (owner, name, "source"): the owner's source reads it (`args.optim_bits`: `args` is a plain namespace).
PATCHED = (
    ("bitsandbytes.nn.Params4bit", "quant_state", "instance"),
    ("bitsandbytes.nn.Int8Params", "SCB", "instance"),
    ("bitsandbytes.functional", "QuantState"),
    *(("bitsandbytes.functional.QuantState", name, "instance")
      for name in ("absmax", "code", "offset", "state2", "shape")),
    ("bitsandbytes.optim.optimizer.Optimizer1State", "args", "instance"),
    ("bitsandbytes.optim.optimizer.Optimizer2State", "args", "instance"),
    ("bitsandbytes.optim.optimizer.Optimizer8bit", "optim_bits", "source"),
)
