"""The validator's side of the compatibility matrix (benchmarks/compatibility.py).

- `verdict(words)`: what the validator says about a cell, as recipes/train.py meets it;
- `validator_off()`: every check it makes, switched off, for the run that shows what would happen without it;
- `replay_verdict(line, base_words)`: today's verdict on a recorded cell, on this machine, under the recorded facts
  of the machine and launch that ran it. The page (compatibility_doc.py) and the tests show and check today's
  validator against the recorded outcomes this way, so a GPU run need not be repeated when a check changes; the
  runner replays every cell it runs too, on the real machine, and records whether the replay agreed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import os
from unittest import mock

from transformers import TrainingArguments

import altscale.config.arguments
import altscale.families
from altscale.config.arguments import check_deepspeed_installed, parse_args
from altscale.config.checks import check_compatible
from altscale.config.errors import ConfigError
from altscale.config.machine import Gpu, Machine
from altscale.strategies.launch import launch_deepspeed_words, plan_launch
from altscale.strategies.precision import precision_flags

# Every check this project adds before a model is built. A run with them patched out meets only the libraries.
# recipes/train.py calls check_compatible by the name it imported; parse_args calls the other two in its module.
VALIDATOR = ("recipes.train.check_compatible", "altscale.config.arguments.check_deepspeed_installed",
             "altscale.config.arguments.check_optim_name")


def verdict(words: list[str], machine: Machine | None = None) -> dict:
    """The validator's answer, exactly as recipes/train.py meets it: parse_args, plan_launch, then check_compatible
    on `machine` (default: this one)."""
    try:
        args = parse_args(words)
        check_compatible(args, plan_launch(args), machine or Machine.detect())
    except ConfigError as err:
        return {"refused": True, "message": str(err)}
    return {"refused": False, "message": None}


@contextlib.contextmanager
def validator_off():
    with contextlib.ExitStack() as stack:
        for target in VALIDATOR:
            stack.enter_context(mock.patch(target, lambda *args, **kwargs: None))
        yield


class RecordedTraining:
    """Parsed TrainingArguments as the recorded machine had them: `values` are read over the parsed ones, every
    other attribute (world_size, n_gpu, optim, ...) is read from the parsed object, and nothing is assigned to it.

    The recorded values cannot be parsed here as words: `deepspeed` makes TrainingArguments build DeepSpeed's
    config, which needs the deepspeed package (not on the CPU machine), and `use_cpu: false` with bf16 is refused
    by TrainingArguments itself on a machine without a bf16 GPU ("Your setup doesn't support bf16/gpu").
    """

    def __init__(self, training: TrainingArguments, values: dict) -> None:
        self._training, self._values = training, values

    def __getattr__(self, name: str):
        values = self.__dict__["_values"]
        return values[name] if name in values else getattr(self.__dict__["_training"], name)


def recorded_machine(line: dict) -> Machine:
    """This machine as the line's: its GPUs (one per process, by the recorded name and bf16 support; their memory
    is not recorded and no check reads it) and whether deepspeed was installed; host memory and LOCAL_WORLD_SIZE
    are this machine's, as the estimate of strategies/deepspeed.py reads them in a real run."""
    here = Machine.detect()
    gpus = ()
    if line["platform"] == "cuda":
        gpus = (Gpu(name=line["device"], total_bytes=0, bf16=bool(line.get("bf16_supported"))),) * max(
            1, line["processes"])
    deepspeed = {"deepspeed"} if line["versions"].get("deepspeed") is not None else set()
    return dataclasses.replace(here, gpus=gpus, installed=(here.installed - {"deepspeed"}) | deepspeed)


def replay_verdict(line: dict, base_words: list[str]) -> dict:
    """The validator's verdict today on a recorded cell, under the facts recorded with it.

    The words are parsed as on a CPU (use_cpu, and the deepspeed key held back: deepspeed need not be installed
    here); the checks then read the recorded machine's values over the parsed ones (`RecordedTraining`: use_cpu
    off on a GPU, the deepspeed file, DeepSpeed's bf16 mode), and check_compatible runs on the recorded machine
    (`recorded_machine`: CUDA, bf16 support, device name), with the launch's variables and its process count.
    The launch's DeepSpeed variables are replayed by launch_deepspeed_words, as parse_args would, and whether
    deepspeed was installed by check_deepspeed_installed.
    """
    words = [*base_words, *(["--use_cpu", "true"] if "--use_cpu" not in base_words else []), *line["words"]]
    deepspeed = words[words.index("--deepspeed") + 1] if "--deepspeed" in words else None
    parse_words = [w for i, w in enumerate(words) if "--deepspeed" not in (w, words[i - 1] if i else None)]
    launch_env = line["launch_env"]
    parse_env = {k: v for k, v in launch_env.items() if not k.startswith(("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_DEEPSPEED"))}
    on_gpu = line["platform"] == "cuda"
    installed = line["versions"].get("deepspeed") is not None
    machine = recorded_machine(line)
    real_find_spec = importlib.util.find_spec
    with mock.patch.dict(os.environ):  # restored on exit
        for name in [name for name in os.environ if name.startswith(("ACCELERATE_", "FSDP_"))]:
            del os.environ[name]
        os.environ.update(parse_env)
        try:
            launch_deepspeed_words(words, environ=launch_env)
            with mock.patch("importlib.util.find_spec", lambda name, *a: (object() if installed else None)
                            if name == "deepspeed" else real_find_spec(name, *a)):
                check_deepspeed_installed(words)
            args = parse_args(parse_words)
            values = {"deepspeed": deepspeed}
            # DeepSpeed's bf16 mode, as parse_args would set it with the deepspeed key
            values |= precision_flags(args.strategy.precision, RecordedTraining(args.training, values))
            if on_gpu:
                values["use_cpu"] = False
            args = dataclasses.replace(args, training=RecordedTraining(args.training, values))
            with mock.patch.object(TrainingArguments, "world_size", property(lambda self: line["processes"])):
                check_compatible(args, plan_launch(args), machine)
        except ConfigError as err:
            return {"refused": True, "message": str(err)}
    return {"refused": False, "message": None}


@contextlib.contextmanager
def memoized_validator():
    """A thousand verdicts cost 35 ms each as the scripts build them: the argument parser, the preset's config and
    its parameter count, all pure (same input, same object), are built once here instead."""
    real_parser = altscale.config.arguments.Parser
    parser = functools.cache(lambda groups, source, help_command: real_parser(groups, source=source,
                                                                             help_command=help_command))
    with mock.patch.object(altscale.config.arguments, "Parser", lambda groups, *, source="command line",
                           help_command=None: parser(groups, source, help_command)), \
            mock.patch.object(altscale.families, "random_init_config", functools.cache(altscale.families.random_init_config)), \
            mock.patch.object(altscale.families, "parameter_count", functools.cache(altscale.families.parameter_count)):
        yield
