"""Bad examples are found before training, named, and skipped or refused; see docs/data.md."""

import io
import json

import datasets
import pytest
from datasets import Dataset, Features, Image, Value
from PIL import Image as PILImage

from altscale.data.loading import load_caption_dataset
from altscale.data.validate import find_bad_examples, validate_splits
from altscale.config.errors import DataError

FEATURES = Features({"image": Image(), "text": Value("string")})


@pytest.fixture(autouse=True)
def hf_cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


def encoded(image: PILImage.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


GOOD = encoded(PILImage.new("RGB", (16, 16), (200, 30, 30)))
JPEG = encoded(PILImage.new("RGB", (64, 64), (20, 130, 30)), "JPEG")


def dataset(rows: list[tuple[bytes, str | None]]) -> Dataset:
    return Dataset.from_dict({"image": [{"bytes": b, "path": None} for b, _ in rows], "text": [t for _, t in rows]},
                             features=FEATURES)


BAD_ROWS = {
    "corrupt": (b"this is not an image at all", "a plate"),
    "zero_bytes": (b"", "a plate"),
    "truncated_png": (GOOD[: len(GOOD) // 2], "a plate"),
    "truncated_jpeg": (JPEG[: len(JPEG) - 200], "a plate"),
    "empty_caption": (GOOD, ""),
    "whitespace_caption": (GOOD, " \n\t "),
    "missing_caption": (GOOD, None),
    "too_many_pixels": (encoded(PILImage.new("L", (300, 300))), "a huge plate"),
}
ODD_MODES = {mode: encoded(PILImage.new(mode, (16, 16)), "TIFF" if mode == "CMYK" else "PNG")
             for mode in ("L", "LA", "P", "RGBA", "CMYK", "I;16")}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_each_kind_of_bad_example_is_found_and_named(case):
    rows = [(GOOD, "one tomato"), BAD_ROWS[case], (GOOD, "two tomatoes")]
    bad = find_bad_examples(dataset(rows), "train", max_image_pixels=250 * 250)
    assert [(b.split, b.index) for b in bad] == [("train", 1)]
    assert bad[0].reason


def test_odd_modes_and_large_images_under_the_cap_are_good():
    rows = [(data, f"mode {mode}") for mode, data in ODD_MODES.items()]
    rows.append((encoded(PILImage.new("RGB", (2000, 1500))), "a big photo"))
    assert find_bad_examples(dataset(rows), "train", max_image_pixels=64_000_000) == []


def test_skip_drops_bad_examples_and_reports_them():
    rows = [(GOOD, f"good {i}") for i in range(6)] + list(BAD_ROWS.values())
    kept, report = validate_splits({"train": dataset(rows), "eval": dataset([(GOOD, "ok"), (b"", "x")])},
                                   skip_bad_examples=True, max_image_pixels=250 * 250, min_train_examples=4)
    assert kept["train"]["text"] == [f"good {i}" for i in range(6)]
    assert len(kept["eval"]) == 1
    assert report.checked == {"train": 14, "eval": 2}
    assert len(report.bad) == len(BAD_ROWS) + 1
    assert "skipped 9 of 16 examples" in report.summary() and "train index 6" in report.summary()
    assert json.loads(json.dumps(report.to_dict()))["skipped"] == 9


def test_stop_names_every_bad_example_at_once():
    rows = [(GOOD, "good")] + list(BAD_ROWS.values())
    with pytest.raises(DataError) as err:
        validate_splits({"train": dataset(rows)}, skip_bad_examples=False, max_image_pixels=250 * 250)
    message = str(err.value)
    assert message.startswith(f"dataset has {len(BAD_ROWS)} bad examples")
    assert all(f"train index {i}" in message for i in range(1, len(BAD_ROWS) + 1))
    assert "skip_bad_examples: true" in message


def test_fewer_examples_than_one_batch_is_an_error_naming_the_fix():
    rows = [(GOOD, "good")] * 3 + [(b"", "bad")]
    with pytest.raises(DataError, match=r"has 3 usable examples \(1 skipped as bad\), fewer than one batch of 8"):
        validate_splits({"train": dataset(rows)}, skip_bad_examples=True, max_image_pixels=10**6, min_train_examples=8)


def test_all_bad_is_an_error_listing_them():
    with pytest.raises(DataError, match="every train example is bad"):
        validate_splits({"train": dataset([(b"", "x"), (GOOD, "")])}, skip_bad_examples=True, max_image_pixels=10**6)


def test_imagefolder_bad_files_are_named_by_path(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    PILImage.new("RGB", (8, 8)).save(folder / "good.png")
    (folder / "empty.png").write_bytes(b"")
    (folder / "cut.png").write_bytes(GOOD[:40])
    rows = [{"file_name": name, "text": "a plate"} for name in ("good.png", "empty.png", "cut.png")]
    (folder / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    split = load_caption_dataset(folder)["train"]
    bad = find_bad_examples(split, "train", max_image_pixels=10**6)
    assert sorted(b.file.rsplit("/", 1)[-1] for b in bad) == ["cut.png", "empty.png"]
    assert "empty.png" in bad[0].describe() or "empty.png" in bad[1].describe()
