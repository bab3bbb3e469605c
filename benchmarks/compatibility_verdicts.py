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
import functools
import importlib.util
import os
from unittest import mock

from transformers import TrainingArguments

import altscale.models.build
import altscale.config.arguments
from altscale.config.arguments import check_deepspeed_installed, parse_args, precision_flags
from altscale.config.checks import check_compatible
from altscale.config.errors import ConfigError
from altscale.strategies.launch import launch_deepspeed_words

# Every check this project adds before a model is built. A run with them patched out meets only the libraries.
VALIDATOR = ("recipes.train.check_compatible", "recipes.arguments.check_deepspeed_installed",
             "recipes.arguments.check_optim_name")


def verdict(words: list[str]) -> dict:
    """The validator's answer, exactly as recipes/train.py meets it: parse_args, then check_compatible."""
    try:
        check_compatible(parse_args(words))
    except ConfigError as err:
        return {"refused": True, "message": str(err)}
    return {"refused": False, "message": None}


@contextlib.contextmanager
def validator_off():
    with contextlib.ExitStack() as stack:
        for target in VALIDATOR:
            stack.enter_context(mock.patch(target, lambda *args, **kwargs: None))
        yield


def replay_verdict(line: dict, base_words: list[str]) -> dict:
    """The validator's verdict today on a recorded cell, under the facts recorded with it.

    The words are parsed as on a CPU (use_cpu, and the deepspeed key held back: deepspeed need not be installed
    here); TrainingArguments then gets the recorded machine's values (use_cpu off on a GPU, the deepspeed file,
    DeepSpeed's bf16 mode), and check_compatible runs with the recorded GPU facts (CUDA, bf16 support, device
    name), the launch's variables and its process count. The launch's DeepSpeed variables are replayed by
    launch_deepspeed_words, as parse_args would, and whether deepspeed was installed by check_deepspeed_installed.
    """
    words = [*base_words, *(["--use_cpu", "true"] if "--use_cpu" not in base_words else []), *line["words"]]
    deepspeed = words[words.index("--deepspeed") + 1] if "--deepspeed" in words else None
    parse_words = [w for i, w in enumerate(words) if "--deepspeed" not in (w, words[i - 1] if i else None)]
    launch_env = line["launch_env"]
    parse_env = {k: v for k, v in launch_env.items() if not k.startswith(("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_DEEPSPEED"))}
    on_gpu = line["platform"] == "cuda"
    installed = line["versions"].get("deepspeed") is not None
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
            args.training.deepspeed = deepspeed
            for flag in precision_flags(args.strategy.precision, args.training):  # DeepSpeed's bf16 mode
                setattr(args.training, flag, True)
            if on_gpu:
                args.training.use_cpu = False
            with mock.patch.object(TrainingArguments, "world_size", property(lambda self: line["processes"])), \
                    mock.patch("torch.cuda.is_available", lambda: on_gpu), \
                    mock.patch("torch.cuda.is_bf16_supported", lambda *a, **k: bool(line.get("bf16_supported"))), \
                    mock.patch("torch.cuda.get_device_name", lambda *a, **k: line["device"]):
                check_compatible(args)
        except ConfigError as err:
            return {"refused": True, "message": str(err)}
    return {"refused": False, "message": None}


@contextlib.contextmanager
def memoized_validator():
    """A thousand verdicts cost 35 ms each as the scripts build them: the argument parser and the preset's config,
    both pure (same input, same object), are built once here instead."""
    real_parser = recipes.arguments.Parser
    parser = functools.cache(lambda groups, source, help_command: real_parser(groups, source=source,
                                                                             help_command=help_command))
    with mock.patch.object(recipes.arguments, "Parser", lambda groups, *, source="command line", help_command=None:
                           parser(groups, source, help_command)), \
            mock.patch.object(models.build, "random_init_config", functools.cache(models.build.random_init_config)):
        yield
