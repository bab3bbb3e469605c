import csv
import io
import json

import datasets
import pytest
from datasets import Dataset, DatasetDict, Features, Image, Value
from PIL import Image as PILImage

from altscale.data.loading import load_caption_dataset, select_splits
from altscale.data.synthetic import make_synthetic_dataset
from altscale.config.errors import DataError


@pytest.fixture(autouse=True)
def hf_cache_in_tmp(tmp_path, monkeypatch):
    # imagefolder caches Arrow files; keep them out of the user's ~/.cache.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


def _write_imagefolder(folder, captions, fmt="jsonl", text_key="text"):
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, caption in enumerate(captions):
        PILImage.new("RGB", (8, 8), (40 * i, 0, 0)).save(folder / f"{i}.png")
        rows.append({"file_name": f"{i}.png", text_key: caption})
    if fmt == "jsonl":
        (folder / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        with open(folder / "metadata.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["file_name", text_key])
            writer.writeheader()
            writer.writerows(rows)


def _toy_dict(num_train=20, num_test=None):
    features = Features({"image": Image(), "text": Value("string")})
    pixel = io.BytesIO()
    PILImage.new("RGB", (1, 1)).save(pixel, format="PNG")
    blank = {"bytes": pixel.getvalue(), "path": None}

    def split(n, prefix):
        return Dataset.from_dict({"image": [blank] * n, "text": [f"{prefix}{i}" for i in range(n)]}, features=features)

    splits = {"train": split(num_train, "train")}
    if num_test:
        splits["test"] = split(num_test, "test")
    return DatasetDict(splits)


def test_lab_format(tmp_path):
    made = make_synthetic_dataset(tmp_path / "food", num_train=6, num_test=2, size=32)
    loaded = load_caption_dataset(tmp_path / "food")
    assert list(loaded) == ["train", "test"]
    assert loaded["train"]["text"] == made["train"]["text"]
    assert isinstance(loaded["train"].features["image"], Image)
    assert isinstance(loaded["test"][0]["image"], PILImage.Image)


def test_single_saved_dataset_becomes_train(tmp_path):
    make_synthetic_dataset(tmp_path / "food", num_train=3, num_test=1, size=32)["train"].save_to_disk(str(tmp_path / "one"))
    assert list(load_caption_dataset(tmp_path / "one")) == ["train"]


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_imagefolder_at_root(tmp_path, fmt):
    _write_imagefolder(tmp_path / "photos", ["a soup", "a salad", "a pie"], fmt=fmt)
    loaded = load_caption_dataset(tmp_path / "photos")
    assert list(loaded) == ["train"]
    assert loaded["train"].column_names == ["image", "text"]
    assert sorted(loaded["train"]["text"]) == ["a pie", "a salad", "a soup"]
    assert loaded["train"][0]["image"].size == (8, 8)


def test_imagefolder_split_folders(tmp_path):
    _write_imagefolder(tmp_path / "photos" / "train", ["a soup", "a salad", "a pie"])
    _write_imagefolder(tmp_path / "photos" / "test", ["a cake"])
    loaded = load_caption_dataset(tmp_path / "photos")
    assert sorted(loaded) == ["test", "train"]
    assert loaded["test"]["text"] == ["a cake"]


def test_imagefolder_mixed_metadata(tmp_path):
    _write_imagefolder(tmp_path / "photos" / "train", ["a soup"])
    _write_imagefolder(tmp_path / "photos" / "test", ["a cake"], fmt="csv")
    with pytest.raises(DataError, match=r"mixes metadata formats: found \['test/metadata.csv', 'train/metadata.jsonl'\]; .* convert them all"):
        load_caption_dataset(tmp_path / "photos")


def test_rename_columns(tmp_path):
    _write_imagefolder(tmp_path / "photos", ["a soup", "a salad"], text_key="caption")
    loaded = load_caption_dataset(tmp_path / "photos", text_column="caption")
    assert loaded["train"].column_names == ["image", "text"]
    ds = _toy_dict(3).rename_column("image", "photo").rename_column("text", "alt")
    ds.save_to_disk(str(tmp_path / "saved"))
    loaded = load_caption_dataset(tmp_path / "saved", image_column="photo", text_column="alt")
    assert loaded["train"].column_names == ["image", "text"] and loaded["train"]["text"] == ["train0", "train1", "train2"]


def test_missing_path(tmp_path):
    with pytest.raises(DataError, match=r"does not exist; make it with `python -m data\.synthetic"):
        load_caption_dataset(tmp_path / "nowhere")


def test_unknown_layout(tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hi")
    with pytest.raises(DataError, match=r"unknown layout: found \['notes.txt'\]; expected a datasets.save_to_disk directory"):
        load_caption_dataset(tmp_path / "junk")
    with pytest.raises(DataError, match="found a file, not a directory"):
        load_caption_dataset(tmp_path / "junk" / "notes.txt")


def test_missing_column(tmp_path):
    _write_imagefolder(tmp_path / "photos", ["a soup"], text_key="caption")
    with pytest.raises(DataError, match=r"found \['image', 'caption'\]; pass image_column=/text_column="):
        load_caption_dataset(tmp_path / "photos")


def test_image_column_without_images(tmp_path):
    Dataset.from_dict({"image": ["a.png"], "text": ["a soup"]}).save_to_disk(str(tmp_path / "paths"))
    with pytest.raises(DataError, match=r"column 'image' should hold images, found Value\('string'\); store the pictures with the datasets.Image\(\)"):
        load_caption_dataset(tmp_path / "paths")


def test_given_eval_split():
    train, eval_set = select_splits(_toy_dict(10, 4))
    assert len(train) == 10 and sorted(eval_set["text"]) == [f"test{i}" for i in range(4)]
    train, eval_set = select_splits(_toy_dict(10, 4), eval_split="train")
    assert len(eval_set) == 10


def test_carved_split_is_seeded_and_disjoint():
    train, eval_set = select_splits(_toy_dict(20), eval_size=0.25, seed=1)
    again_train, again_eval = select_splits(_toy_dict(20), eval_size=0.25, seed=1)
    assert len(eval_set) == 5 and len(train) == 15
    assert set(train["text"]).isdisjoint(eval_set["text"])
    assert set(train["text"]) | set(eval_set["text"]) == {f"train{i}" for i in range(20)}
    assert (train["text"], eval_set["text"]) == (again_train["text"], again_eval["text"])
    assert select_splits(_toy_dict(20), eval_size=0.25, seed=2)[1]["text"] != eval_set["text"]
    assert len(select_splits(_toy_dict(20), eval_size=3)[1]) == 3
    assert select_splits(_toy_dict(20), eval_size=0)[1] is None


def test_num_samples():
    train, eval_set = select_splits(_toy_dict(10, 4), num_train_samples=3, num_eval_samples=2, seed=0)
    assert len(train) == 3 and len(eval_set) == 2
    assert train["text"] == select_splits(_toy_dict(10, 4), seed=0)[0]["text"][:3]  # the first N after the shuffle


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_train_samples": 11}, r"num_train_samples=11 but the train set has 10 examples; ask for between 1 and 10"),
        ({"num_train_samples": 0}, r"num_train_samples=0 but the train set has 10 examples"),
        ({"num_eval_samples": 5}, r"num_eval_samples=5 but the eval set has 4 examples"),
        ({"train_split": "training"}, r"train_split='training' is not in the dataset, which has splits \['train', 'test'\]"),
        ({"eval_split": "dev"}, r"eval_split='dev' is not in the dataset, which has splits \['train', 'test'\]"),
    ],
)
def test_selection_errors(kwargs, message):
    with pytest.raises(DataError, match=message):
        select_splits(_toy_dict(10, 4), **kwargs)


def test_bad_eval_size_and_empty_train():
    with pytest.raises(DataError, match=r"eval_size=10 asks for 10 of the 10 examples in split 'train'"):
        select_splits(_toy_dict(10), eval_size=10)
    with pytest.raises(DataError, match=r"split 'train' has no examples"):
        select_splits(_toy_dict(0), eval_size=0)
