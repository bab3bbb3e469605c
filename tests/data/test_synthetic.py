import random
from collections import Counter

import pytest
from datasets import Image, load_from_disk

from altscale.data.synthetic import COUNTS, ITEMS, PLATES, TABLES, caption_vocabulary, describe, draw, make_synthetic_dataset, sample_attributes


def _nearest(rgb: tuple, palette: dict) -> str:
    return min(palette, key=lambda name: sum((a - b) ** 2 for a, b in zip(rgb, palette[name])))


def _components(mask: set) -> int:
    """Count 4-connected groups of pixels."""
    seen, groups = set(), 0
    for start in mask:
        if start in seen:
            continue
        groups += 1
        stack = [start]
        seen.add(start)
        while stack:
            x, y = stack.pop()
            for n in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
                if n in mask and n not in seen:
                    seen.add(n)
                    stack.append(n)
    return groups


def test_same_seed_same_bytes(tmp_path):
    a = make_synthetic_dataset(tmp_path / "a", num_train=5, num_test=3, seed=7, size=32)
    b = make_synthetic_dataset(tmp_path / "b", num_train=5, num_test=3, seed=7, size=32)
    c = make_synthetic_dataset(tmp_path / "c", num_train=5, num_test=3, seed=8, size=32)
    for split in ("train", "test"):
        raw_a, raw_b = (d[split].cast_column("image", Image(decode=False)) for d in (a, b))
        assert [r["bytes"] for r in raw_a["image"]] == [r["bytes"] for r in raw_b["image"]]
        assert a[split]["text"] == b[split]["text"]
    raw_c = c["train"].cast_column("image", Image(decode=False))
    assert [r["bytes"] for r in raw_c["image"]] != [r["bytes"] for r in a["train"].cast_column("image", Image(decode=False))["image"]]


def test_round_trip_lab_format(tmp_path):
    made = make_synthetic_dataset(tmp_path / "food", num_train=4, num_test=2, seed=0, size=48)
    loaded = load_from_disk(str(tmp_path / "food"))
    assert list(loaded) == ["train", "test"]
    assert loaded["train"].column_names == ["image", "text"]
    assert isinstance(loaded["train"].features["image"], Image)
    assert loaded["train"]["text"] == made["train"]["text"]
    example = loaded["test"][0]
    assert example["image"].mode == "RGB" and example["image"].size == (48, 48)


@pytest.mark.parametrize(
    "attrs, caption",
    [
        ({"count": 1, "item": "tomato", "plate": "white", "table": "wood"}, "one tomato on a white plate"),
        ({"count": 2, "item": "lemon", "plate": "blue", "table": "gray"}, "two lemons on a blue plate"),
        ({"count": 3, "item": "blueberry", "plate": "black", "table": "pink"}, "three blueberries on a black plate"),
        ({"count": 1, "item": "broccoli", "plate": "black", "table": "pink"}, "one broccoli floret on a black plate"),
        ({"count": 2, "item": "cookie", "plate": "white", "table": "wood"}, "two cookies on a white plate"),
    ],
)
def test_describe_plural_rule(attrs, caption):
    assert describe(attrs) == caption


def test_caption_space():
    captions = {describe({"count": c, "item": i, "plate": p}) for c in COUNTS for i in ITEMS for p in PLATES}
    assert len(captions) == 45
    words = set(caption_vocabulary())
    assert all(set(caption.split()) <= words for caption in captions)
    assert words == {word for caption in captions for word in caption.split()}
    # The table colour varies the picture, never the caption.
    assert len({describe({"count": 2, "item": "lemon", "plate": "blue", "table": t}) for t in TABLES}) == 1


@pytest.mark.parametrize("seed", range(30))
def test_picture_matches_caption(seed):
    rng = random.Random(seed)
    attrs = sample_attributes(rng)
    image = draw(attrs, rng, size=64)
    assert image.mode == "RGB" and image.size == (64, 64)
    pixels = {(x, y): image.getpixel((x, y)) for x in range(64) for y in range(64)}
    table = pixels[(0, 0)]
    plate = Counter(rgb for rgb in pixels.values() if rgb != table).most_common(1)[0][0]
    assert _nearest(plate, PLATES) == attrs["plate"]
    food = {xy for xy, rgb in pixels.items() if rgb not in (table, plate)}
    assert _components(food) == attrs["count"]  # items are drawn apart and never touch
    main = Counter(pixels[xy] for xy in food).most_common(1)[0][0]
    assert _nearest(main, {item: rgb for item, (_, _, rgb) in ITEMS.items()}) == attrs["item"]
    caption = describe(attrs)
    assert caption.split()[0] == COUNTS[attrs["count"]]
    assert ITEMS[attrs["item"]][attrs["count"] > 1] in caption and f"{attrs['plate']} plate" in caption


def test_attributes_cover_every_caption():
    rng = random.Random(0)
    assert len({describe(sample_attributes(rng)) for _ in range(1000)}) == 45
