"""Fine-tune BLIP-2 to write alt text, with the Hugging Face Trainer.

    python recipes/train.py recipes/blip2/tiny-opt-demo.yaml [--key value ...]
    accelerate launch --config_file accelerate_configs/single.yaml recipes/train.py recipes/blip2/opt27-bf16.yaml

The recipe YAML says what to train and how to save memory; the launch config says how many processes
run and how they shard. Every run appends one record to the results file (see callbacks/).
"""

import sys
import time
from dataclasses import asdict
from pathlib import Path

import altscale.patches.bitsandbytes  # noqa: F401  (first: it quiets a bitsandbytes import-time warning)
import psutil
import torch
from transformers import Trainer, set_seed

from altscale.callbacks import (
    build_callbacks,
    format_summary,
    log_memory_before_reporters,
    memory_callback,
    oom_report,
    write_run_record,
)
from altscale.callbacks.caption_metrics import build_caption_metrics_callbacks
from altscale.callbacks.interrupt import InterruptCallback, TrainingInterrupted
from altscale.callbacks.profiler import ProfilerCallback
from altscale.artifacts.output_dir import prepare_output_dir, write_json_atomic
from altscale.artifacts.publish import publish_run
from altscale.config.adjust import adjust_training_args
from altscale.config.arguments import Arguments, parse_args
from altscale.config.checks import check_compatible
from altscale.config.errors import EXIT_USER_ERROR, AltscaleError
from altscale.config.machine import Machine
from altscale.data.loading import load_caption_dataset, select_splits
from altscale.data.validate import validate_splits
from altscale.families import Family, family_for
from altscale.models.adapters import apply_lora, build_lora_config
from altscale.models.build import build_quantization_config
from altscale.strategies.cuda_graphs import GraphedRun, GraphedTrainer
from altscale.strategies.ddp import configure_ddp
from altscale.strategies.fsdp import configure_fsdp
from altscale.strategies.launch import LaunchPlan, plan_launch
from altscale.strategies.precision import model_dtype

# When this process started (the run record's startup times count from it), and when its imports were done.
PROCESS_START = psutil.Process().create_time()
IMPORTS_DONE = time.time()

EXIT_OOM = 3
EXIT_SIGINT = 130  # 128 + SIGINT, as a shell reports a Ctrl-C; a SIGTERM exits 143 (see TrainingInterrupted)


class OutOfMemory(AltscaleError):
    """Training ran out of accelerator memory; the message holds the breakdown and advice."""


def main(argv: list[str] | None = None, machine: Machine | None = None) -> dict:
    """Train as the recipe and command line say; `machine`: what to check against (default: this one)."""
    startup = {"imports": IMPORTS_DONE - PROCESS_START}  # seconds since process start, into the run record
    args = parse_args(argv)
    plan = plan_launch(args)  # single, DDP, FSDP or DeepSpeed as launched, and every decision that follows
    check_compatible(args, plan, machine or Machine.detect())  # fails before any weight is loaded
    set_seed(args.training.seed)
    trainer_args, adjustments = adjust_training_args(args, plan)
    train_set, eval_set = build_datasets(args)  # bad data stops the run before a large model is built
    startup["data"] = time.time() - PROCESS_START
    family = family_for(args.model.model_name_or_path)
    model, processor, model_report = build_model(args, family, plan)
    startup["model"] = time.time() - PROCESS_START
    collator = family.build_collator(model, processor, args.data)
    trainer = build_trainer(args, trainer_args, family, model, processor, collator, train_set, eval_set, startup)
    # FSDP units and checkpointing from the built model, DDP's buckets: before the Trainer wraps the model
    done = {"fsdp": configure_fsdp(trainer, plan, family, args.strategy.fsdp_layers_per_unit,
                                   args.strategy.fsdp_forward_prefetch),
            "ddp": configure_ddp(trainer, plan)}
    startup["trainer"] = time.time() - PROCESS_START
    record = train(args, trainer, model_report, adjustments, plan.to_record(done))
    if args.strategy.save_model:
        trainer.save_model()
    result = {"record": record, "log_history": trainer.state.log_history, "output_dir": args.training.output_dir}
    if args.training.push_to_hub and trainer.is_world_process_zero():
        result["published"] = publish_run(args, trainer.model, processor, record)  # adapter + model card only
    if eval_set is not None and args.strategy.num_sample_captions and trainer.is_world_process_zero():
        result["captions"] = family.show_samples(trainer.model, collator, eval_set, args.strategy.max_new_tokens,
                                                 args.strategy.num_sample_captions)
    return result


def build_model(args: Arguments, family: Family, plan: LaunchPlan):
    """The family's model and processor in the precision's dtype, quantized for QLoRA, with LoRA adapters if asked."""
    dtype = model_dtype(args.strategy.precision)
    model, processor, report = family.build_model(
        args.model.model_name_or_path,
        init=args.model.init,
        dtype=dtype,
        attn_implementation=args.model.attn_implementation,
        processor_name_or_path=args.model.processor_name_or_path,
        quantization=build_quantization_config(
            args.strategy.load_in_4bit, args.strategy.bnb_4bit_use_double_quant, compute_dtype=torch.bfloat16,
            quant_storage=plan.quant_storage(dtype),
        ),
    )
    return apply_adapters(args, family, model), processor, report


def apply_adapters(args: Arguments, family: Family, model):
    """LoRA (use_peft) or QLoRA (use_peft + load_in_4bit); the full model otherwise."""
    if not args.strategy.use_peft:
        return model
    lora = build_lora_config(
        r=args.strategy.lora_r,
        alpha=args.strategy.lora_alpha,
        dropout=args.strategy.lora_dropout,
        targets=args.strategy.lora_target_modules or family.default_lora_targets(model.config),
    )
    return apply_lora(
        model, lora, quantized=args.strategy.load_in_4bit, gradient_checkpointing=args.training.gradient_checkpointing
    )


def build_datasets(args: Arguments):
    data = args.data
    dataset = load_caption_dataset(data.dataset_path, image_column=data.image_column, text_column=data.text_column)
    train_set, eval_set = select_splits(
        dataset,
        train_split=data.train_split,
        eval_split=data.eval_split,
        eval_size=data.eval_size,
        num_train_samples=data.num_train_samples,
        num_eval_samples=data.num_eval_samples,
        seed=args.training.seed,
    )
    # Open every image now: in a DataLoader worker a corrupt one would crash the run mid-epoch (docs/data.md).
    splits, report = validate_splits(
        {"train": train_set, "eval": eval_set},
        skip_bad_examples=data.skip_bad_examples,
        max_image_pixels=data.max_image_pixels,
        min_train_examples=args.training.per_device_train_batch_size * args.training.world_size,
    )
    if args.training.process_index == 0:
        print(report.summary())
        if report.bad:
            write_json_atomic(Path(args.training.output_dir) / "bad_examples.json", report.to_dict())
    return splits["train"], splits["eval"]


def build_trainer(args: Arguments, trainer_args, family: Family, model, processor, collator, train_set, eval_set,
                  startup: dict[str, float] | None = None) -> Trainer:
    # What CUDA graph replays count and hold, which no hook sees: the trainer fills it, the callbacks read it.
    graphed_run = GraphedRun() if args.strategy.cuda_graphs else None
    callbacks = build_callbacks(
        memory_log_steps=args.strategy.memory_log_steps,
        results_file=args.strategy.results_file,
        flops_per_sample=family.flops_per_sample(model.config, collator, train_set),
        process_start_time=PROCESS_START,
        startup=startup,
        graphed_run=graphed_run,
    )
    if args.strategy.profile_steps:
        callbacks.append(ProfilerCallback(args.strategy.profile_steps, args.training.output_dir))
    graphs = {}
    if graphed_run is not None:  # strategies/cuda_graphs.py; checks.cuda_graph_problems refused what it cannot run
        graphs = {"cuda_graph_max_shapes": args.strategy.cuda_graph_max_shapes, "graphed_run": graphed_run}
    trainer = (GraphedTrainer if graphs else Trainer)(
        **graphs,
        model=model,
        args=trainer_args,  # push_to_hub off in its copy: publish_run pushes after training (config/adjust.py)
        data_collator=collator,
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=processor,
        callbacks=[*callbacks, InterruptCallback(), *build_caption_metrics_callbacks(
            args.strategy.caption_metrics_samples, collator, eval_set, args.strategy.max_new_tokens)],
    )
    log_memory_before_reporters(trainer)
    return trainer


def train(args: Arguments, trainer: Trainer, model_report, adjustments: dict, launch: dict | None = None) -> dict:
    """Run the Trainer and append the run's record; an OOM is recorded, then raised as one message."""
    config = {
        "model": asdict(args.model),
        "data": asdict(args.data),
        "strategy": asdict(args.strategy),
        "model_build": asdict(model_report),
        "adjusted": adjustments,
        "launch": launch,
    }
    recipe = Path(args.recipe).stem if args.recipe else "command-line"
    try:
        trainer.train(resume_from_checkpoint=prepare_output_dir(args))
    except torch.cuda.OutOfMemoryError as err:
        report = oom_report(memory_callback(trainer), err)
        write_run_record(trainer, status="oom", recipe=recipe, config=config, error=err)
        raise OutOfMemory(report) from None
    except BaseException as err:
        write_run_record(trainer, status="error", recipe=recipe, config=config, error=err)
        raise
    interrupt = next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, InterruptCallback)), None)
    if interrupt is not None and interrupt.signal_received is not None:
        write_run_record(trainer, status="interrupted", recipe=recipe, config=config)
        raise TrainingInterrupted(interrupt, args.training)
    record = write_run_record(trainer, status="ok", recipe=recipe, config=config)
    if trainer.is_world_process_zero():
        print(format_summary(record["summary"]))
        saved = f"saving to {args.training.output_dir}; " if args.strategy.save_model else ""
        print(f"{saved}run record appended to {args.strategy.results_file}")
    return record


def run(argv: list[str] | None = None, machine: Machine | None = None) -> int:
    """`main`, with every mistake a user can make ending in one message and an exit code."""
    try:
        main(argv, machine)
    except OutOfMemory as err:
        print(f"error: out of GPU memory\n{err}", file=sys.stderr)
        return EXIT_OOM
    except AltscaleError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except TrainingInterrupted as err:
        print(f"stopped: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (loading, saving, captioning): nothing to save
        print("stopped: interrupted before or after training; nothing was checkpointed", file=sys.stderr)
        return EXIT_SIGINT
    return 0


if __name__ == "__main__":
    sys.exit(run())
