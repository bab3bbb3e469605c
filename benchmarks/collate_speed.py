"""Time the input pipeline's per-batch work on this machine: fetching examples and `CaptionCollator` on them.

    python benchmarks/collate_speed.py [--model blip2-opt-2.7b] [--dataset_path data/synthetic_food-224] [--batch 16]

Runs in one thread, as a DataLoader worker does, for each image-processor backend installed (torchvision, PIL).
"""

import argparse
import json
import sys
import time
from pathlib import Path


import altscale.patches.bitsandbytes  # noqa: F401  (first: it quiets a bitsandbytes import-time warning)

import torch
from transformers import Blip2Processor, BlipImageProcessorPil

from altscale.families.blip2.collate import CaptionCollator
from altscale.data.loading import load_caption_dataset
from altscale.families import random_init_config
from altscale.families.blip2.processor import build_offline_processor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="blip2-opt-2.7b")
    parser.add_argument("--dataset_path", default="data/synthetic_food-224")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as in a DataLoader worker
    config = random_init_config(args.model)
    default = build_offline_processor(config)
    image_processor = default.image_processor
    pil = Blip2Processor(BlipImageProcessorPil(**{k: getattr(image_processor, k) for k in ("size", "image_mean", "image_std")},
                                               do_convert_rgb=True), default.tokenizer, num_query_tokens=config.num_query_tokens)
    train = load_caption_dataset(args.dataset_path)["train"]
    for name, processor in ((type(image_processor).__name__, default), ("BlipImageProcessorPil", pil)):
        collator = CaptionCollator(processor, decoder_only=config.use_decoder_only_language_model)
        fetch, collate = [], []
        for r in range(args.repeats + 1):
            start = time.perf_counter()
            examples = [train[(r * args.batch + i) % len(train)] for i in range(args.batch)]
            middle = time.perf_counter()
            collator(examples)
            end = time.perf_counter()
            if r:  # the first batch warms caches
                fetch.append(middle - start)
                collate.append(end - middle)
        print(json.dumps({"bench": "collate_speed", "image_processor": name, "batch": args.batch,
                          "fetch_ms": 1000 * sum(fetch) / len(fetch), "collate_ms": 1000 * sum(collate) / len(collate)}))


if __name__ == "__main__":
    main()
