"""The one place a run changes a TrainingArguments value after parsing, and records why.

A recipe's value is never changed silently (tests/test_architecture.py fails if a TrainingArguments field is
assigned anywhere else). Each change becomes `config.adjusted` in the run record as {asked, used, why}, and is
printed once on rank 0.
"""

from __future__ import annotations

import copy

from transformers import TrainingArguments

from altscale.config.arguments import Arguments
from altscale.strategies.launch import LaunchPlan


def adjust_training_args(args: Arguments, plan: LaunchPlan) -> tuple[TrainingArguments, dict]:
    """Applies the adjustments the recipe and the plan call for; returns the TrainingArguments the Trainer gets and
    the record of every change.

    - learning_rate under `lr_scaling: linear`: scaled by the global batch over `lr_reference_batch_size`;
    - gradient_checkpointing under FSDP: off, because FSDP's own checkpointing runs instead (the plan's choice);
    - push_to_hub: off in the Trainer's copy only, because the recipe publishes the adapter or model and a card
      itself after training (artifacts/publish.py); the Trainer would upload all of output_dir.
    """
    training, changes = args.training, {}
    if args.strategy.lr_scaling == "linear":
        global_batch = training.per_device_train_batch_size * training.gradient_accumulation_steps * training.world_size
        asked = training.learning_rate
        training.learning_rate = asked * global_batch / args.strategy.lr_reference_batch_size
        changes["learning_rate"] = {
            "asked": asked, "used": training.learning_rate,
            "why": f"lr_scaling: linear, global batch {global_batch} / lr_reference_batch_size "
                   f"{args.strategy.lr_reference_batch_size}"}
        _say(training, f"learning_rate: asked {asked:g}, using {training.learning_rate:g} "
                       f"({changes['learning_rate']['why']})")
    if plan.checkpointing == "fsdp" and training.gradient_checkpointing:
        training.gradient_checkpointing = False
        changes["gradient_checkpointing"] = {
            "asked": True, "used": "false: FSDP activation checkpointing instead (fsdp_activation_checkpointing)",
            "why": "transformers' checkpointing under FSDP all-gathers every layer a second time in backward"}
        _say(training, "gradient_checkpointing: asked true, using FSDP's activation checkpointing "
                       f"({changes['gradient_checkpointing']['why']})")
    trainer_args = training
    if training.push_to_hub:
        trainer_args = copy.copy(training)
        trainer_args.push_to_hub = False
        changes["push_to_hub"] = {
            "asked": True, "used": "recipes/publish.py after training (the Trainer's copy has false)",
            "why": "the Trainer would upload all of output_dir; we upload the adapter or model and a card"}
    return trainer_args, changes


def _say(training: TrainingArguments, line: str) -> None:
    if training.process_index == 0:
        print(line)
