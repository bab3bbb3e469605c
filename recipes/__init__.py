"""The scripts users run (train, generate, score, publish) and what they share."""

import logging

# On CPUs with AVX512-BF16, importing bitsandbytes warns that an optional package for 4-bit *CPU* kernels is
# missing: nothing here runs 4-bit on the CPU, and the line reads like an error in every CPU run's output.
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
