"""DeepSpeed, as this project reads it: nothing is changed. Names checked in DeepSpeed 0.19.8 (GPU image; DeepSpeed is
not installed on the CPU machines, where tests/patches skips these entries).

What is read, and why: under ZeRO the module's parameters are views into the engine's flat buffers (stage 1/2) or
empty placeholders (stage 3), so the memory breakdown (callbacks/memory.py `_zero_tensors`, `zero_stage`) and the
effective configuration (callbacks/effective_config.py) read the ZeRO optimizer's own fields, which DeepSpeed sets in
its optimizers' __init__ and documents nowhere:
- stage 1/2 (`DeepSpeedZeroOptimizer`): `bit16_groups_flat` (every bf16/fp16 parameter),
  `single_partition_of_fp32_groups` (this rank's fp32 master partition, its `.grad` the fp32 gradient partition),
  `averaged_gradients`, `ipg_buckets[*].buffer`, `grads_in_partition`, `accumulated_grads_in_cpu` (gradients on
  their way to the partition), `param_buffer_of_bit16_for_cpu_offload_groups` (the host copy sent back as weights),
  and `partition_gradients`, `cpu_offload`, `optimizer` (the stage, the offload, the torch optimizer inside);
- stage 3 (`DeepSpeedZeroOptimizer_Stage3`): `fp16_partitioned_groups_flat`, `lp_param_buffer` (this rank's bf16
  partition), `fp32_partitioned_groups_flat` (the fp32 master partition), `grad_partitions_flat_buffer`,
  `lp_grad_partitions_flat_pin_buffers`, `averaged_gradients`, `ipg_buckets[*].buffer` (gradients), and
  `offload_optimizer`, `offload_param`, `optimizer`;
- on each parameter under ZeRO-3 (set by `deepspeed.zero.Init`): `ds_tensor` (this rank's partition) and `ds_numel`
  (the parameter's real size; the placeholder has none).
The code reading them tolerates their absence (getattr with a default): a rename shows as a memory breakdown that
misses bytes, not as an error, which is why each is checked here.
"""

# What the engine reads of DeepSpeed's internals; tests/patches checks each where DeepSpeed is installed.
# (owner, attribute, "instance"): set on instances only; the owner's source sets it (or declares it as a field).
_STAGE_1_2 = "deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer"
_STAGE_3 = "deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3"
PATCHED = (
    *((_STAGE_1_2, name, "instance") for name in (
        "bit16_groups_flat", "single_partition_of_fp32_groups", "averaged_gradients", "ipg_buckets",
        "grads_in_partition", "accumulated_grads_in_cpu", "param_buffer_of_bit16_for_cpu_offload_groups",
        "partition_gradients", "cpu_offload", "optimizer")),
    ("deepspeed.runtime.zero.stage_1_and_2.IPGBucket", "buffer", "instance"),
    *((_STAGE_3, name, "instance") for name in (
        "fp16_partitioned_groups_flat", "lp_param_buffer", "fp32_partitioned_groups_flat",
        "grad_partitions_flat_buffer", "lp_grad_partitions_flat_pin_buffers", "averaged_gradients", "ipg_buckets", "offload_optimizer",
        "offload_param", "optimizer")),
    ("deepspeed.runtime.zero.stage3.IPGBucketZ3", "buffer", "instance"),
    ("deepspeed.runtime.zero.partition_parameters.Init", "ds_tensor", "instance"),
    ("deepspeed.runtime.zero.partition_parameters.Init", "ds_numel", "instance"),
)
