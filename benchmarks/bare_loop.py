"""The speed ceiling the Trainer run is compared with: a bare eager loop, no Trainer, no data loading.

    python benchmarks/bare_loop.py [--model blip2-opt-2.7b] [--precision bf16-true] [--batch 16] [--accumulation 4]

The same model build as the recipe (random init, SDPA), real preprocessed batches from the dataset put on
the GPU once, fused AdamW, `use_cache=False`, no gradient clipping and no host syncs inside the timed
steps. What the recipe loses against this number is the price of its input pipeline, the Trainer and the
callbacks (issue 7 allows 5 %). Prints one JSON line and appends it to --out.
"""

import argparse
import json
import sys
import time
from pathlib import Path


import altscale.patches.bitsandbytes  # noqa: F401  (first: it quiets a bitsandbytes import-time warning)

import torch

from altscale.families.blip2.collate import CaptionCollator
from altscale.data.loading import load_caption_dataset
from altscale.families.blip2.model import build_model
from altscale.strategies.precision import model_dtype


def sync() -> None:
    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="blip2-opt-2.7b")
    parser.add_argument("--dataset_path", default="data/synthetic_food-224")
    parser.add_argument("--precision", default="bf16-true", choices=["bf16-true", "bf16-mixed", "32-true"])
    parser.add_argument("--tf32", action="store_true", help="Allow TF32 matmuls (32-true).")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=3, help="Untimed optimizer steps first.")
    parser.add_argument("--steps", type=int, default=10, help="Timed optimizer steps.")
    parser.add_argument("--no_cudnn_attention", action="store_true",
                        help="Keep SDPA off cuDNN's attention kernels (flash instead): the ablation in BENCHMARKS.md.")
    parser.add_argument("--out", default="runs/bare_loop.jsonl")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32

    torch.backends.cuda.enable_cudnn_sdp(not args.no_cudnn_attention)
    model, processor, _ = build_model(args.model, init="random", dtype=model_dtype(args.precision))
    model.config.use_cache = model.config.text_config.use_cache = False
    model.train()
    collator = CaptionCollator(processor, decoder_only=model.config.use_decoder_only_language_model)
    train = load_caption_dataset(args.dataset_path)["train"]
    batches = [collator([train[i] for i in range(start, start + args.batch)])
               for start in range(0, args.batch * args.accumulation, args.batch)]
    batches = [{k: v.cuda() for k, v in b.items()} for b in batches]
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16-mixed")

    def step() -> None:
        for batch in batches:
            with autocast:
                loss = model(**batch).loss / args.accumulation
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    sync()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    elapsed = time.perf_counter() - start
    samples = args.steps * args.batch * args.accumulation
    result = {"bench": "bare_loop", "model": args.model, "precision": args.precision, "tf32": args.tf32, "cudnn_attention": not args.no_cudnn_attention,
              "batch": args.batch, "accumulation": args.accumulation, "steps": args.steps,
              "samples_per_s": samples / elapsed, "step_s": elapsed / args.steps,
              "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
              "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    print(json.dumps(result))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
