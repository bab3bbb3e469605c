"""What a recipe can say: four dataclasses read from a YAML file plus command-line overrides.

`TrainingArguments` keeps every name Hugging Face already has; the other three hold only what it lacks.
"""

import difflib
import importlib.util
import json
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml
from transformers import HfArgumentParser, TrainingArguments

from altscale.config.errors import ConfigError
from altscale.strategies.launch import last_value, launch_deepspeed_words
from altscale.strategies.precision import precision_flags


@dataclass
class ModelArguments:
    model_name_or_path: str = field(
        default="blip2-tiny-opt",
        metadata={"help": "A preset (blip2-opt-2.7b, blip2-opt-6.7b, blip2-flan-t5-xl, blip2-flan-t5-xxl, "
                  "blip2-tiny-opt, blip2-tiny-t5), a Hub id such as Salesforce/blip2-opt-2.7b, or a local folder."},
    )
    init: str = field(
        default="auto",
        metadata={"help": "pretrained: load the weights; random: same architecture, random weights, no download; "
                  "auto: random for a preset name, pretrained otherwise."},
    )
    processor_name_or_path: str | None = field(
        default=None, metadata={"help": "Where to load the processor from; default: the model's path, or the offline one."}
    )
    attn_implementation: str = field(default="sdpa", metadata={"help": "Attention kernel: sdpa or eager."})


@dataclass
class DataArguments:
    dataset_path: str = field(
        default="data/synthetic_food",
        metadata={"help": "A datasets.save_to_disk folder (the lab's format) or an imagefolder with metadata.jsonl/csv."},
    )
    image_column: str = field(default="image", metadata={"help": "Column holding the photo."})
    text_column: str = field(default="text", metadata={"help": "Column holding the caption."})
    train_split: str = field(default="train", metadata={"help": "Split to train on."})
    eval_split: str | None = field(
        default=None, metadata={"help": "Split to evaluate on; default: validation or test if present, else carved out."}
    )
    eval_size: float = field(default=0.1, metadata={"help": "Eval set carved from train: a fraction (<1) or a count; 0 for none."})
    num_train_samples: int | None = field(default=None, metadata={"help": "Train on the first N after a seeded shuffle."})
    num_eval_samples: int | None = field(default=None, metadata={"help": "Evaluate on the first N after a seeded shuffle."})
    prompt: str = field(default="", metadata={"help": "Text the model reads before the caption (not trained on)."})
    max_caption_tokens: int = field(default=48, metadata={"help": "Longer captions are cut to this many tokens."})
    pad_to_multiple_of: int = field(
        default=1, metadata={"help": "Pad each batch's sequences to a multiple of this many tokens (1: to the longest "
                             "row): fewer distinct shapes, hence fewer CUDA graphs under cuda_graphs."}
    )
    skip_bad_examples: bool = field(
        default=True,
        metadata={"help": "Every image is opened before training: true drops examples whose image does not decode or "
                  "whose caption is empty, and lists them; false stops and names them. See docs/data.md."},
    )
    max_image_pixels: int = field(
        default=64_000_000,
        metadata={"help": "An image with more pixels (width x height) counts as bad: the guard against decompression bombs."},
    )


@dataclass
class StrategyArguments:
    precision: str = field(
        default="32-true",
        metadata={"help": "32-true: fp32 everywhere; bf16-true: weights, grads and optimizer state in bf16; "
                  "bf16-mixed: fp32 weights, bf16 autocast; fp16-mixed: fp32 weights, fp16 autocast + loss scaling."},
    )
    memory_log_steps: int = field(default=50, metadata={"help": "Record memory per category at steps 0, 1 and every N steps."})
    profile_steps: int = field(
        default=0, metadata={"help": "Profile N optimizer steps after step 2 with torch.profiler: the top operators "
                             "and a trace go to output_dir/profile/ (callbacks/profiler.py); 0: off."}
    )
    cuda_graphs: bool = field(
        default=False,
        metadata={"help": "Replay each micro-batch's forward and backward as one CUDA graph (one per batch shape): "
                  "the host launches one graph instead of thousands of kernels. One GPU; see docs/speed.md."},
    )
    cuda_graph_max_shapes: int = field(
        default=4, metadata={"help": "cuda_graphs: capture at most this many batch shapes; others run eagerly."}
    )
    results_file: str = field(default="runs/results.jsonl", metadata={"help": "Every run appends one JSON record here."})
    num_sample_captions: int = field(
        default=8, metadata={"help": "After training, caption this many held-out photos and print them beside the truth."}
    )
    max_new_tokens: int = field(default=30, metadata={"help": "Longest alt text generated after training, in tokens."})
    caption_metrics_samples: int = field(
        default=0, metadata={"help": "At each evaluation, also score captions of the first N eval photos (BLEU, ROUGE-L, "
                             "CIDEr-D, METEOR, exact match; see metrics/); 0: loss only."}
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Allow training into an output_dir that holds a saved model or checkpoints; its old "
                  "checkpoint-* folders are removed. Without it, such a folder is an error unless resuming."},
    )
    save_model: bool = field(default=True, metadata={"help": "Save the trained model (or LoRA adapter) to output_dir at the end."})
    use_peft: bool = field(default=False, metadata={"help": "Train LoRA adapters only; the base model stays frozen."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator (the update is scaled by alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA input."})
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={"help": "Module names (or one regular expression) to adapt; default: the language model's "
                  "attention and MLP and the Q-Former's attention (models/adapters.py)."},
    )
    load_in_4bit: bool = field(
        default=False, metadata={"help": "QLoRA: load the base model's linear layers in 4-bit NF4 (needs use_peft)."}
    )
    bnb_4bit_use_double_quant: bool = field(default=True, metadata={"help": "QLoRA: quantize the quantization constants too."})
    fsdp_layers_per_unit: int = field(
        default=1,
        metadata={"help": "Under FSDP: shard this many consecutive layers of a tower as one unit, gathered and reduced "
                  "together: fewer units, less host work per step, a gathered unit k layers wide (docs/multi_gpu.md)."},
    )
    fsdp_forward_prefetch: bool = field(
        default=True,
        metadata={"help": "Under FSDP: each unit starts the next unit's all-gather as its own forward begins."},
    )
    host_memory_check: bool = field(
        default=True,
        metadata={"help": "Under a DeepSpeed config that offloads to the CPU: refuse a run whose estimated host memory "
                  "(~25 bytes a parameter, measured) exceeds this machine's; false skips the estimate."},
    )
    lr_scaling: str = field(
        default="none",
        metadata={"help": "none: use learning_rate as given; linear: multiply it by global batch / "
                  "lr_reference_batch_size (global batch = per-device batch x accumulation x processes)."},
    )
    lr_reference_batch_size: int = field(
        default=16, metadata={"help": "The global batch size at which learning_rate was chosen (lr_scaling: linear)."}
    )


@dataclass
class Arguments:
    """All four groups of one run, plus the recipe file they came from."""

    model: ModelArguments
    data: DataArguments
    strategy: StrategyArguments
    training: TrainingArguments
    recipe: str | None = None
    given: frozenset[str] = frozenset()  # keys the recipe or command line set; the rest hold their defaults


GROUPS = (ModelArguments, DataArguments, StrategyArguments, TrainingArguments)

# Values this project needs that differ from TrainingArguments' defaults; a recipe or the CLI may still set them.
PROJECT_DEFAULTS = {
    "remove_unused_columns": False,  # the collator needs the raw "image" and "text" columns
    "report_to": "none",
    "logging_steps": 10,
    "save_strategy": "no",
    "dataloader_num_workers": 2,
    # The Trainer's NaN/inf filter reads every micro-batch's loss on the host: one GPU sync per micro-batch.
    "logging_nan_inf_filter": False,
    # Batches leave pinned memory without waiting for the GPU to finish the previous step (a sync otherwise).
    "accelerator_config": {"non_blocking": True},
}


def known_keys() -> set[str]:
    return {f.name for group in GROUPS for f in fields(group) if f.init}


def load_recipe(path: str | Path) -> dict:
    """The keys of a recipe YAML file; an unknown key is an error that names the closest known one."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"recipe {path}: no such file; recipes live in recipes/ (e.g. recipes/blip2/tiny-opt-demo.yaml)")
    try:
        recipe = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"recipe {path}: not valid YAML ({err})") from None
    if not isinstance(recipe, dict):
        raise ConfigError(f"recipe {path}: expected `key: value` lines, found a {type(recipe).__name__}")
    unknown = sorted(set(recipe) - known_keys())
    if unknown:
        raise ConfigError("\n".join(f"recipe {path}: unknown key {key!r}{_closest(key)}" for key in unknown))
    return recipe


def _closest(key: str) -> str:
    match = difflib.get_close_matches(key, known_keys(), n=1)
    return f"; did you mean {match[0]!r}?" if match else "; see `python recipes/train.py --help` for the keys"


def to_argv(values: dict) -> list[str]:
    """Recipe values as command-line words, so YAML and CLI go through one parser and one type check."""
    argv = []
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = str(value).lower()
        if isinstance(value, dict):
            value = json.dumps(value)
        argv.append(f"--{key}")
        argv.extend(str(item) for item in value) if isinstance(value, list) else argv.append(str(value))
    return argv


def parse_args(argv: list[str] | None = None) -> Arguments:
    """`[recipe.yaml] [--key value ...]`: the recipe's values, then the command line's, which win."""
    argv = list(sys.argv[1:] if argv is None else argv)
    recipe_path = argv.pop(0) if argv and argv[0].endswith((".yaml", ".yml")) else None
    recipe = load_recipe(recipe_path) if recipe_path else {}
    words = to_argv(PROJECT_DEFAULTS) + to_argv(recipe) + argv
    words += launch_deepspeed_words(words)  # a DeepSpeed accelerate config's file, as if the recipe named it
    check_deepspeed_installed(words)
    check_optim_name(words)
    model, data, strategy, training = _parse(words)
    words += to_argv(precision_flags(strategy.precision, training))
    model, data, strategy, training = _parse(words)
    given = frozenset(recipe) | {word[2:] for word in argv if word.startswith("--")}
    return Arguments(model, data, strategy, training, recipe=recipe_path, given=given)


def check_deepspeed_installed(words: list[str]) -> None:
    """A DeepSpeed config needs the deepspeed package; TrainingArguments would fail halfway through without it."""
    config = last_value(words, "--deepspeed")
    if config is None or importlib.util.find_spec("deepspeed") is not None:
        return
    raise ConfigError(
        f"deepspeed: {config} needs the deepspeed package, which is not installed; pip install deepspeed==0.19.8 "
        "(it compiles its CPU Adam on first use and needs a CUDA GPU), or drop the deepspeed key"
    )


def check_optim_name(words: list[str]) -> None:
    """DeepSpeed's CPU Adam is no `optim` value: DeepSpeed builds it from a ZeRO offload config's optimizer section.

    The name is the one docs/compatibility.md uses for that optimizer; argparse alone would list 40 choices.
    """
    if last_value(words, "--optim") == "deepspeed_cpu_adam":
        raise ConfigError(
            "optim: deepspeed_cpu_adam is not an optimizer transformers builds; DeepSpeed steps its CPU Adam only "
            "under a ZeRO config that offloads the optimizer: set deepspeed: ds_configs/zero2_offload.json (or "
            "zero3_offload.json) and drop optim"
        )


class Parser(HfArgumentParser):
    """The parser of every script: a bad value is one ConfigError line, and a typo never matches a longer option.

    argparse would print the whole usage and exit 2; one line naming the bad value, and where help is, is enough.
    """

    def __init__(self, groups, *, source: str = "command line", help_command: str | None = None):
        super().__init__(groups, allow_abbrev=False)
        self.source = source
        self.help_command = help_command or f"python {Path(sys.argv[0]).name} --help"

    def error(self, message: str):
        raise ConfigError(f"{self.source}: {message}; see `{self.help_command}`")

    def parse_args_into_dataclasses(self, *args, **kwargs):
        try:
            return super().parse_args_into_dataclasses(*args, **kwargs)
        except ConfigError:
            raise  # already one line from error()
        except ValueError as err:  # options nobody takes, and the dataclasses' own checks (TrainingArguments)
            raise ConfigError(f"{self.source}: {err}") from None


def _parse(words: list[str]):
    parser = Parser(GROUPS, source="recipe or command line", help_command="python recipes/train.py --help")
    *groups, unknown = parser.parse_args_into_dataclasses(args=words, return_remaining_strings=True)
    if unknown:
        flags = [word.lstrip("-") for word in unknown if word.startswith("--")] or unknown
        raise ConfigError("\n".join(f"command line: unknown option {flag!r}{_closest(flag)}" for flag in flags))
    return groups
