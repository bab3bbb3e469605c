"""The compatibility matrix itself: its cells (precision x optimizer x launch x adapter x checkpointing), which
machine runs which, what must have run for a cell to work, and a line's status. benchmarks/compatibility.py runs
the cells; benchmarks/compatibility_doc.py renders the page; both import this module (no script imports another).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

MATRIX_VERSION = 1
PRECISIONS = ("32-true", "bf16-true", "bf16-mixed")
# deepspeed_cpu_adam is what a ZeRO offload config's optimizer section builds; under a ZeRO launch the cell leaves
# `optim` unset, elsewhere it asks for `optim: deepspeed_cpu_adam`, which no transformers optimizer answers to.
OPTIMIZERS = ("sgd", "adamw_torch", "adamw_torch_fused", "adamw_bnb_8bit", "deepspeed_cpu_adam")
LAUNCHES = ("single", "ddp", "fsdp", "zero2-offload", "zero3-offload")
ADAPTERS = ("full", "lora", "qlora")
CHECKPOINTING = (False, True)

DEEPSPEED_CONFIGS = {"zero2-offload": "ds_configs/zero2_offload.json", "zero3-offload": "ds_configs/zero3_offload.json"}
# What must have run for a cell to count as working: the class, and the switches that pick its kernel.
EXPECTED_OPTIMIZER = {
    "sgd": ("torch.optim.sgd.SGD", {}),
    "adamw_torch": ("torch.optim.adamw.AdamW", {"fused": None}),
    "adamw_torch_fused": ("torch.optim.adamw.AdamW", {"fused": True}),
    "adamw_bnb_8bit": ("bitsandbytes.optim.adamw.AdamW", {"optim_bits": 8}),
    "deepspeed_cpu_adam": ("deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam", {}),
}
# The effective configuration's `strategy` each launch must show (callbacks/effective_config.py); on the CPU,
# accelerate runs an FSDP launch as DDP, for one.
EXPECTED_STRATEGY = {"single": "single device", "ddp": "ddp", "fsdp": "fsdp", "zero2-offload": "deepspeed zero2",
                     "zero3-offload": "deepspeed zero3"}
# The effective-configuration keys a matrix line keeps: what ran, not how much memory it took.
RAN_KEYS = ("strategy", "optimizer_class", "optimizer_options", "optimizer_wrapper_class", "model_dtype",
            "param_dtypes", "trainable_params", "grad_dtypes", "optimizer_state_dtypes", "master_weights", "bf16",
            "fp16", "gradient_checkpointing", "world_size")
STEPS = 2
# A rank that fails alone leaves the others in a collective; they fail too after this long, instead of 30 minutes.
COLLECTIVE_TIMEOUT_S = 60
RENDEZVOUS_TIMEOUT_S = 30  # ranks that finished a cell meet within this; one that failed alone waits no longer
# Two optimizer steps on the tiny model's 64-px photos, batch 2 per process.
BASE_WORDS = ["--model_name_or_path", "blip2-tiny-opt", "--eval_size", "0", "--max_steps", str(STEPS),
              "--per_device_train_batch_size", "2", "--learning_rate", "1e-4", "--logging_steps", "1",
              "--memory_log_steps", "1", "--dataloader_num_workers", "0", "--disable_tqdm", "true",
              "--num_sample_captions", "0", "--save_model", "false", "--overwrite_output_dir", "true", "--seed", "0",
              "--ddp_timeout", str(COLLECTIVE_TIMEOUT_S)]
EXIT_RESTART = 75  # the process group broke: launch again with --resume (the Makefile and the GPU script do)
DIED_TWICE = "the launch died twice in this cell"
DIED_ONCE = "the launch died during this cell"  # what lines said before a cell got a second try
NUM_PHOTOS = 16  # two steps of batch 2 on each of up to four processes


@dataclass(frozen=True)
class Cell:
    precision: str
    optimizer: str
    launch: str
    adapter: str
    checkpointing: bool

    @property
    def key(self) -> str:
        return "/".join([self.precision, self.optimizer, self.launch, self.adapter,
                         "ckpt-on" if self.checkpointing else "ckpt-off"])

    def words(self) -> list[str]:
        """The recipe keys that make this cell, as command-line words (the launch's process count is not one)."""
        words = ["--precision", self.precision, "--gradient_checkpointing", str(self.checkpointing).lower()]
        if self.launch in DEEPSPEED_CONFIGS:
            words += ["--deepspeed", DEEPSPEED_CONFIGS[self.launch]]
        if not (self.optimizer == "deepspeed_cpu_adam" and self.launch in DEEPSPEED_CONFIGS):
            words += ["--optim", self.optimizer]
        if self.adapter in ("lora", "qlora"):
            words += ["--use_peft", "true", "--lora_r", "4"]
        if self.adapter == "qlora":
            words += ["--load_in_4bit", "true"]
        return words


CELLS = [Cell(*values) for values in itertools.product(PRECISIONS, OPTIMIZERS, LAUNCHES, ADAPTERS, CHECKPOINTING)]


def cells_for(launch: str) -> list[Cell]:
    return [cell for cell in CELLS if cell.launch == launch]


# Which launches each machine runs, by (platform, processes); a cell of them is run unless `unplanned` says why
# not. docs/compatibility.md shows a planned cell without a line as not run yet.
PLAN = {
    ("cpu", 1): ("single", "zero2-offload", "zero3-offload"),
    ("cpu", 2): ("ddp", "fsdp", "zero2-offload", "zero3-offload"),
    ("cuda", 1): ("single", "zero2-offload", "zero3-offload"),
    ("cuda", 2): ("ddp", "fsdp", "zero2-offload", "zero3-offload"),
}


def unplanned(cell: Cell, platform: str, processes: int) -> str | None:
    """Why a machine does not run a cell of a launch that takes either process count; None: it runs it.

    Each reason is a rule tests/benchmarks/test_compatibility.py checks against the lines: the cell it skips is
    refused today, and the same cell with one process on the same machine failed.
    """
    if cell.launch not in DEEPSPEED_CONFIGS or processes == 1:
        return None
    if platform == "cpu":
        return ("the CPU machine has no deepspeed: its one-process cells are refused for that before any launch "
                "matters, and two processes would be refused the same way")
    if cell.optimizer != "deepspeed_cpu_adam":
        # 72 of a ZeRO launch's 90 cells, at 5-10 s each with 2 processes: they would not fit the GPU's time.
        return ("`optim` under a ZeRO config is refused whatever the process count; with one process the run "
                "without the validator shows DeepSpeed replacing it")
    return None


def planned_cells(launch: str, platform: str, processes: int) -> list[Cell]:
    return [cell for cell in cells_for(launch) if unplanned(cell, platform, processes) is None]


def status(said: dict, outcome: dict) -> str:
    """works / refused (and it fails) / failed (the validator let a failing cell through) / refused-but-works (the
    validator is too strict) / hung (the launch died in this cell once, in a run before the retry existed)."""
    if outcome["status"] != "works" and str(outcome.get("error")).startswith(DIED_ONCE):
        return "hung"
    refused, works = said["refused"], outcome["status"] == "works"
    if refused:
        return "refused-but-works" if works else "refused"
    return "works" if works else "failed"


def status_of(line: dict) -> str:
    return status(line["verdict"], line["outcome"])
