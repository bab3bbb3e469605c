"""Read image/caption datasets from disk and pick the train and eval sets."""

import math
from pathlib import Path

from datasets import Dataset, DatasetDict, Image, load_dataset, load_from_disk

from altscale.config.errors import DataError

METADATA_FILES = ("metadata.jsonl", "metadata.csv")
EXPECTED_LAYOUTS = (
    "a datasets.save_to_disk directory (dataset_dict.json or state.json at its root), "
    "or an imagefolder with metadata.jsonl or metadata.csv (columns file_name, text) at its root or in split folders"
)


def _is_saved_dataset(path: Path) -> bool:
    return (path / "dataset_dict.json").exists() or (path / "state.json").exists()


def _metadata_files(path: Path) -> list[Path]:
    return [folder / name for folder in [path, *path.iterdir()] for name in METADATA_FILES if (folder / name).exists()]


def _canonical_columns(split: Dataset, name: str, path: Path, image_column: str, text_column: str) -> Dataset:
    """Keep only the image and caption columns, renamed to 'image' and 'text'."""
    missing = [column for column in (image_column, text_column) if column not in split.column_names]
    if missing:
        raise DataError(
            f"dataset {path}, split {name!r}: asked for columns {image_column!r} (image) and {text_column!r} (text), "
            f"found {split.column_names}; pass image_column=/text_column= (--image_column/--text_column) "
            "naming the columns that hold the image and its caption"
        )
    if not isinstance(split.features[image_column], Image):
        raise DataError(
            f"dataset {path}, split {name!r}: column {image_column!r} should hold images, found {split.features[image_column]}; "
            "store the pictures with the datasets.Image() feature, or point image_column at the column that does"
        )
    # Other columns are dropped because the collator expects exactly {"image", "text"} per example.
    split = split.select_columns([image_column, text_column])
    return split.rename_columns({image_column: "image", text_column: "text"})


def load_caption_dataset(path: str | Path, *, image_column: str = "image", text_column: str = "text") -> DatasetDict:
    """Load a save_to_disk or imagefolder dataset as a DatasetDict with columns 'image' and 'text'."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"dataset path {path} does not exist; make it with `python -m data.synthetic --out {path}` or point to {EXPECTED_LAYOUTS}")
    if path.is_dir() and _is_saved_dataset(path):
        dataset = load_from_disk(str(path))
        if isinstance(dataset, Dataset):
            dataset = DatasetDict({"train": dataset})
    elif path.is_dir() and _metadata_files(path):
        found = sorted(str(p.relative_to(path)) for p in _metadata_files(path))
        if len({Path(name).suffix for name in found}) > 1:
            raise DataError(f"imagefolder {path} mixes metadata formats: found {found}; imagefolder reads one format, so convert them all to metadata.jsonl or all to metadata.csv")
        # A packaged builder that reads local files only, so it also works with HF_DATASETS_OFFLINE=1.
        dataset = load_dataset("imagefolder", data_dir=str(path))
    else:
        found = sorted(p.name for p in path.iterdir())[:10] if path.is_dir() else "a file, not a directory"
        raise DataError(f"dataset path {path} has an unknown layout: found {found or 'an empty directory'}; expected {EXPECTED_LAYOUTS}")
    return DatasetDict({name: _canonical_columns(split, name, path, image_column, text_column) for name, split in dataset.items()})


def _take(split: Dataset, num_samples: int | None, what: str, option: str) -> Dataset:
    if num_samples is None:
        return split
    if not 1 <= num_samples <= len(split):
        raise DataError(f"{option}={num_samples} but the {what} set has {len(split)} examples; ask for between 1 and {len(split)}, or leave it unset to use all")
    return split.select(range(num_samples))


def select_splits(
    dataset_dict: DatasetDict,
    *,
    train_split: str = "train",
    eval_split: str | None = None,
    eval_size: float = 0.1,
    num_train_samples: int | None = None,
    num_eval_samples: int | None = None,
    seed: int = 42,
) -> tuple[Dataset, Dataset | None]:
    """Return a seeded-shuffled train set and an eval set (named, found, carved from train, or None)."""
    splits = list(dataset_dict)
    if train_split not in dataset_dict:
        raise DataError(f"train_split={train_split!r} is not in the dataset, which has splits {splits}; set train_split to one of them")
    if eval_split is not None and eval_split not in dataset_dict:
        raise DataError(f"eval_split={eval_split!r} is not in the dataset, which has splits {splits}; set eval_split to one of them, or leave it unset to carve eval_size out of train")
    train_set = dataset_dict[train_split]
    if eval_split is None:
        # validation before test: a held-out test split stays untouched when both exist.
        eval_split = next((name for name in ("validation", "test") if name in dataset_dict), None)
    if eval_split is not None:
        eval_set = dataset_dict[eval_split]
    elif eval_size == 0:
        eval_set = None
    else:
        # Fractions round up, as in Dataset.train_test_split, so a small dataset still gets one eval example.
        num_eval = math.ceil(eval_size * len(train_set)) if eval_size < 1 else int(eval_size)
        if not 0 < num_eval < len(train_set):
            raise DataError(
                f"eval_size={eval_size} asks for {num_eval} of the {len(train_set)} examples in split {train_split!r}; "
                "choose a fraction in (0, 1) or a count that leaves at least one training example, or 0 for no eval set"
            )
        parts = train_set.train_test_split(test_size=num_eval, seed=seed)
        train_set, eval_set = parts["train"], parts["test"]
    if len(train_set) < 1:
        raise DataError(f"split {train_split!r} has no examples; point to a dataset whose {train_split!r} split holds image/caption pairs")
    train_set = _take(train_set.shuffle(seed=seed), num_train_samples, "train", "num_train_samples")
    if eval_set is not None:
        eval_set = _take(eval_set.shuffle(seed=seed), num_eval_samples, "eval", "num_eval_samples")
    return train_set, eval_set


def load_split(dataset_path: str, split: str, num_samples: int | None = None, *, image_column: str = "image",
               text_column: str = "text") -> tuple[list[str], list, list[str]]:
    """(names, images, reference captions) of a dataset split."""
    dataset = load_caption_dataset(dataset_path, image_column=image_column, text_column=text_column)
    if split not in dataset:
        raise DataError(f"split: {split!r} is not in {dataset_path}, which has splits {list(dataset)}; pass --split with one of them")
    rows = dataset[split]
    if num_samples is not None:
        if not 1 <= num_samples <= len(rows):
            raise DataError(f"num_samples: {num_samples}, but split {split!r} has {len(rows)} examples; ask for 1 to {len(rows)}")
        rows = rows.select(range(num_samples))
    names = [f"{dataset_path}:{split}[{i}]" for i in range(len(rows))]
    return names, list(rows["image"]), list(rows["text"])  # the collator converts to RGB as in training
