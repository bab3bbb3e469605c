"""Check every example before training: an image that cannot be decoded must not crash a DataLoader worker mid-epoch.

`datasets` decodes images lazily, inside the workers, so a corrupt file would otherwise surface as a
worker crash hours into a run. This pass opens each image once with PIL, in the main process, and
either drops the bad examples (with a report naming them) or stops with a message naming them all.
The rules are written down in docs/data.md.
"""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from datasets import Dataset, Image
from PIL import Image as PILImage

from altscale.config.errors import DataError

MAX_LISTED = 20  # bad examples named in a message; the report file holds them all
VALIDATION_THREADS = 8  # PIL releases the GIL while decoding, so threads overlap the work


@dataclass
class BadExample:
    split: str
    index: int  # position in the split as selected for training (after shuffle and num_*_samples)
    file: str | None  # the image's path where the dataset keeps one (imagefolder), else None
    reason: str

    def describe(self) -> str:
        where = f"{self.file} (index {self.index})" if self.file else f"index {self.index}"
        return f"{self.split} {where}: {self.reason}"


@dataclass
class DataReport:
    """What validation found, per split: how many examples were checked and which were bad."""

    checked: dict[str, int] = field(default_factory=dict)
    bad: list[BadExample] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"checked": self.checked, "skipped": len(self.bad), "bad_examples": [vars(b) for b in self.bad]}

    def summary(self) -> str:
        if not self.bad:
            return f"data: {sum(self.checked.values())} examples checked, none bad"
        return f"data: skipped {len(self.bad)} of {sum(self.checked.values())} examples:\n{listed(self.bad)}"


def listed(bad: list[BadExample]) -> str:
    """The first MAX_LISTED bad examples, one per line, and how many more there are."""
    lines = [f"  {example.describe()}" for example in bad[:MAX_LISTED]]
    if len(bad) > MAX_LISTED:
        lines.append(f"  ... and {len(bad) - MAX_LISTED} more")
    return "\n".join(lines)


def image_problem(image: dict, max_image_pixels: int) -> str | None:
    """Why this stored image ({"bytes", "path"}) cannot be trained on, or None if it decodes."""
    try:
        source = io.BytesIO(image["bytes"]) if image.get("bytes") else image.get("path")
        if source is None:
            return "no image bytes and no path"
        with PILImage.open(source) as img:
            # The header gives the size before any pixel is decoded: the guard against decompression bombs.
            pixels = img.width * img.height
            if pixels > max_image_pixels:
                return f"{img.width}x{img.height} = {pixels} pixels, more than max_image_pixels={max_image_pixels}"
            img.verify()  # checksums and structure; cheap, but blind to a JPEG cut short
        if not isinstance(source, str):
            source.seek(0)
        with PILImage.open(source) as img:
            img.load()  # a full decode catches truncated files that verify() passes
    except FileNotFoundError:
        return "file not found"
    except Exception as err:  # PIL raises many types (OSError, SyntaxError, ValueError, DecompressionBombError)
        return f"cannot decode image ({type(err).__name__}: {err})"
    return None


def caption_problem(text) -> str | None:
    if not isinstance(text, str):
        return f"caption is {type(text).__name__}, not text"
    if not text.strip():
        return "caption is empty or whitespace"
    return None


def find_bad_examples(split: Dataset, name: str, max_image_pixels: int) -> list[BadExample]:
    """Every example of `split` (columns "image", "text") whose caption is empty or whose image does not decode."""
    raw = split.cast_column("image", Image(decode=False))  # bytes and paths, so PIL opens each file exactly once
    images, texts = raw["image"], raw["text"]
    with ThreadPoolExecutor(VALIDATION_THREADS) as pool:
        image_problems = list(pool.map(lambda image: image_problem(image, max_image_pixels), images))
    bad = []
    for index, (image, text, problem) in enumerate(zip(images, texts, image_problems)):
        problem = caption_problem(text) or problem
        if problem:
            bad.append(BadExample(name, index, image.get("path"), problem))
    return bad


def validate_splits(
    splits: dict[str, Dataset | None], *, skip_bad_examples: bool, max_image_pixels: int, min_train_examples: int = 1
) -> tuple[dict[str, Dataset | None], DataReport]:
    """Drop (or refuse) bad examples from every split; then the train split must still fill one batch.

    `min_train_examples` is one global batch: per-device batch size × processes.
    """
    report = DataReport()
    kept = {}
    for name, split in splits.items():
        if split is None:
            kept[name] = None
            continue
        bad = find_bad_examples(split, name, max_image_pixels)
        report.checked[name] = len(split)
        report.bad.extend(bad)
        drop = {b.index for b in bad}
        kept[name] = split.select([i for i in range(len(split)) if i not in drop]) if drop else split
    if report.bad and not skip_bad_examples:
        raise DataError(
            f"dataset has {len(report.bad)} bad examples:\n{listed(report.bad)}\n"
            "fix or remove these files, or set skip_bad_examples: true to train without them"
        )
    train = kept.get("train")
    if train is not None and len(train) == 0:
        raise DataError(
            f"every train example is bad, so none is left to train on:\n{listed(report.bad)}\nfix these files or captions"
        )
    if train is not None and len(train) < min_train_examples:
        skipped = sum(1 for bad in report.bad if bad.split == "train")
        raise DataError(
            f"the train set has {len(train)} usable examples ({skipped} skipped as bad), fewer than one batch of "
            f"{min_train_examples} (per_device_train_batch_size x processes); lower per_device_train_batch_size "
            f"to {len(train)} or less, or add examples"
        )
    return kept, report
