"""bitsandbytes, as this project changes it: one logger quieted. Checked with bitsandbytes 0.50.2.

Importing it on a CPU with AVX512-BF16 logs that an optional package for 4-bit *CPU* kernels ("kernels") is
missing: nothing here runs 4-bit on the CPU, and the line reads like an error in every CPU run's output. Scripts
import this module before anything that imports bitsandbytes (transformers does, through its quantizers).
"""

import logging

LOGGER = "bitsandbytes"
logging.getLogger(LOGGER).setLevel(logging.ERROR)
