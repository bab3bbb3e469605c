"""Time batched alt-text generation: images/s of `write_alt_text` on a dataset split, after a warm-up batch.

    python benchmarks/generate_speed.py --model_name_or_path FOLDER [--adapter FOLDER] --dataset_path DATA \
        [--batch_size 32] [--dtype bfloat16] [--repeats 3]
"""

import argparse
import json
import sys
import time
from pathlib import Path


import torch

from altscale.data.loading import load_caption_dataset
from altscale.families.blip2.captioner import build_collator, load_captioner, resolve_dtype, write_alt_text


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_name_or_path", required=True)
    parser.add_argument("--adapter")
    parser.add_argument("--dataset_path", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max_new_tokens", type=int, default=30)
    parser.add_argument("--min_new_tokens", type=int, default=0,
                        help="Decode at least this many tokens: random weights end captions at once, real ones do not.")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    model, processor, loaded = load_captioner(args.model_name_or_path, adapter=args.adapter, dtype=resolve_dtype(args.dtype))
    collator = build_collator(model, processor)
    images = list(load_caption_dataset(args.dataset_path)[args.split]["image"])
    options = {"batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens}
    if args.min_new_tokens:
        options["min_new_tokens"] = args.min_new_tokens
    write_alt_text(model, collator, images[: args.batch_size], **options)  # warm-up: kernels, allocator
    times = []
    for _ in range(args.repeats):
        sync()
        start = time.perf_counter()
        texts = write_alt_text(model, collator, images, **options)
        sync()
        times.append(time.perf_counter() - start)
    best = sorted(times)[len(times) // 2]
    print(json.dumps({
        "loaded": loaded, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "dtype": args.dtype, "images": len(images), "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens,
        "min_new_tokens": args.min_new_tokens, "median_s": round(best, 3), "images_per_s": round(len(images) / best, 1), "times_s": [round(t, 3) for t in times],
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None,
        "sample": texts[:2],
    }))


if __name__ == "__main__":
    main()
