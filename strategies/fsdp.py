"""FSDP2 (accelerate_configs/fsdp4.yaml): what cannot run under it, and the setup that needs the built model.

The units (each tower's repeated block, `fsdp_layers_per_unit` consecutive layers to a unit: strategies/fsdp_units.py)
and the checkpointing are the plan's (strategies/launch.py); `configure_fsdp` carries them out on the Trainer's
plugin before the Trainer wraps the model, and returns what it did for the run record.
"""

from __future__ import annotations

import torch

from altscale.config.errors import ConfigError
from altscale.strategies.launch import BITSANDBYTES_OPTIMS, FSDP_CONFIG, LaunchPlan, optim_name


def fsdp_problems(args, plan: LaunchPlan, machine) -> list[str]:
    training, fsdp = args.training, plan.fsdp
    if training.deepspeed:
        return [f"fsdp and deepspeed: {training.deepspeed} both shard the model; launch with one of them "
                f"({FSDP_CONFIG}, or a DeepSpeed config with accelerate_configs/single.yaml)"]
    if fsdp.version != 2:
        return [f"fsdp_version: {fsdp.version}: FSDP1 is deprecated in transformers 5.17 and its flat parameters "
                f"are not what the memory breakdown counts; set fsdp_version: 2 (as {FSDP_CONFIG} does)"]
    problems = []
    if plan.world_size < 2:
        problems.append(f"FSDP with one process (world size {plan.world_size}) shards nothing and only adds "
                        f"all-gathers; launch several processes ({FSDP_CONFIG}: 4 GPUs), or for one GPU that lacks "
                        "memory use deepspeed: ds_configs/zero3_offload.json")
    if (training.use_cpu or not machine.cuda) and not machine.fsdp_on_cpu:
        problems.append("FSDP on the CPU: accelerate applies FSDP on GPUs only, so this launch would silently train "
                        "plain DDP; run it on GPUs, or launch with accelerate_configs/ddp4.yaml")
    optim = optim_name(training)
    if optim in BITSANDBYTES_OPTIMS:
        problems.append(f"optim: {optim} under FSDP: bitsandbytes' optimizer kernels take whole tensors, not FSDP2's "
                        "sharded DTensors (NotImplementedError: no sharding strategy registered, docs/compatibility.md); "
                        "use optim: adamw_torch_fused, or 8-bit Adam under accelerate_configs/ddp4.yaml")
    if fsdp.auto_wrap_policy == "NO_WRAP":
        problems.append(f"fsdp_auto_wrap_policy: NO_WRAP makes the whole model one unit, gathered in full on every "
                        f"GPU: nothing saved; set fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP (as {FSDP_CONFIG} does)")
    if fsdp.auto_wrap_policy == "SIZE_BASED_WRAP" and args.strategy.fsdp_layers_per_unit > 1:
        problems.append(f"fsdp_layers_per_unit: {args.strategy.fsdp_layers_per_unit} "
                        "groups the layers that TRANSFORMER_BASED_WRAP finds, but the launch wraps by size "
                        f"(SIZE_BASED_WRAP); set fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP (as {FSDP_CONFIG} does) "
                        "or drop the key")
    if fsdp.state_dict_type != "FULL_STATE_DICT" and args.strategy.save_model:
        problems.append(f"fsdp_state_dict_type: {fsdp.state_dict_type} saves a distributed checkpoint, not a model "
                        "folder that from_pretrained and recipes/generate.py read; set fsdp_state_dict_type: "
                        "FULL_STATE_DICT (rank 0 writes model.safetensors) or save_model: false")
    return problems


def configure_fsdp(trainer, plan: LaunchPlan, family, layers_per_unit: int = 1, forward_prefetch: bool = True) -> dict:
    """The FSDP choices that need the built model, made on the Trainer's plugin before it wraps the model.
    Returns what was done, for the run record's `config.launch.fsdp` (empty when FSDP is off).

    - units: the family's repeated blocks, unless the launch named classes itself, sharded here `layers_per_unit`
      consecutive layers to a unit, each prefetching the next (strategies/fsdp_units.py);
    - activation checkpointing as planned, with the language model's KV cache off: FSDP's checkpoint wrapper re-runs
      a layer in backward, and a cache filled in forward would be appended to again (OPT then fails on a 2x-long
      attention mask, T5 saves a different number of tensors); transformers' own checkpointing switches it off per
      layer;
    - one module per tied embedding (`share_tied_embeddings`);
    - every rank must start from the same weights: FSDP2 shards what each rank built and broadcasts nothing;
    - an elementwise optimizer steps the local shards (`step_local_shards`).
    """
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if plugin is None or plan.fsdp is None:
        return {}
    from accelerate.utils.dataclasses import get_module_class_from_name

    from altscale.patches.accelerate import set_fsdp_plugin

    model, fsdp = trainer.model, plan.fsdp
    names = list(fsdp.transformer_cls_names_to_wrap or family.layer_class_names(model))
    if fsdp.auto_wrap_policy == "TRANSFORMER_BASED_WRAP":
        unknown = [name for name in names if get_module_class_from_name(model, name) is None]
        if unknown:
            raise ConfigError(f"fsdp_transformer_layer_cls_to_wrap: {', '.join(unknown)} not in this model, whose "
                              f"layers are {', '.join(family.layer_class_names(model))}; drop the key (the layers are "
                              "then read from the model)")
    else:
        names = plugin.transformer_cls_names_to_wrap
    done = {"transformer_cls_names_to_wrap": names}
    language = family.language_model(model)
    if fsdp.activation_checkpointing:
        # Every config of the language model: T5's encoder and decoder stacks hold copies of their own.
        for module in language.modules():
            if hasattr(getattr(module, "config", None), "use_cache"):
                module.config.use_cache = False
    done["tied_embeddings_shared"] = share_tied_embeddings(language)
    done["weights_broadcast_from_rank0"] = align_weights(model)
    if fsdp.auto_wrap_policy == "TRANSFORMER_BASED_WRAP":  # last: it shards the weights just compared
        from altscale.strategies.fsdp_units import shard_towers

        done |= shard_towers(model, plugin, names, fsdp.activation_checkpointing, layers_per_unit, forward_prefetch)
        # The layers are sharded and checkpointed: accelerate must neither look for them (fully_shard renamed their
        # classes) nor wrap them again; it still shards the rest and builds the root unit.
        set_fsdp_plugin(plugin, transformer_cls_names_to_wrap=names, auto_wrap_policy=None, activation_checkpointing=False)
    else:
        set_fsdp_plugin(plugin, activation_checkpointing=fsdp.activation_checkpointing)
    done["optimizer"] = step_local_shards(trainer)
    return done


def step_local_shards(trainer) -> str:
    """Has the Trainer build the shard-local variant of its optimizer (strategies/sharded_optim.py), through its
    `optimizer_cls_and_kwargs` (read when it creates the optimizer: patches/transformers.py); returns its name.

    An optimizer that is not elementwise (or not torch's) keeps stepping the DTensors as they are.
    """
    from transformers import Trainer

    from altscale.strategies.sharded_optim import shard_local_class

    if trainer.optimizer_cls_and_kwargs is not None:
        optimizer_cls, kwargs = trainer.optimizer_cls_and_kwargs
    else:
        optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(trainer.args, trainer.model)
    local_cls = shard_local_class(optimizer_cls)
    if local_cls is None:
        return f"{getattr(optimizer_cls, '__name__', optimizer_cls)} on the DTensors (not elementwise)"
    trainer.optimizer_cls_and_kwargs = (local_cls, kwargs)
    return local_cls.__name__


def share_tied_embeddings(language_model) -> list[str]:
    """Makes every nn.Embedding that holds the input embedding's weight that very module; returns their names.

    transformers 5 gives T5's encoder and decoder their own embed_tokens modules tied to `shared` by weight.
    accelerate puts `shared` and the tied LM head in one FSDP unit and the stacks' embed_tokens in the root unit:
    one parameter in two units, which torch 2.13 refuses ("shared with a parameter already managed by another FSDP
    group"). One module, seen from three places, is in one unit only.
    OPT has a single embed_tokens: nothing changes.
    """
    embedding = language_model.get_input_embeddings()
    names = [name for name, module in language_model.named_modules()
             if module is not embedding and isinstance(module, torch.nn.Embedding) and module.weight is embedding.weight]
    for name in names:
        language_model.set_submodule(name, embedding)
    return names


def align_weights(model) -> bool:
    """Compares every parameter's sum across ranks; if any differ, broadcasts rank 0's weights. True if it had to.

    Ranks build a random-init model from one seed, so they should agree; a stray random draw on one rank would
    otherwise train shards of different models, silently.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return False
    params = [p for p in model.parameters() if p.device.type != "meta"]
    sums = torch.stack([p.detach().double().sum() for p in params])
    low, high = sums.clone(), sums.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if torch.equal(low, high):
        return False
    with torch.no_grad():
        for p in params:
            dist.broadcast(p.data, src=0)
    return True
