"""Synthetic food photos whose alt text is fully determined by what is drawn: the default dataset."""

import argparse
import io
import math
import random
from pathlib import Path

from datasets import Dataset, DatasetDict, Features, Image, Value, disable_progress_bars
from PIL import Image as PILImage
from PIL import ImageDraw

COUNTS = {1: "one", 2: "two", 3: "three"}
# item -> (singular, plural, main RGB); the main colour covers most of the item's pixels.
ITEMS = {
    "tomato": ("tomato", "tomatoes", (210, 40, 35)),
    "lemon": ("lemon", "lemons", (245, 215, 50)),
    "blueberry": ("blueberry", "blueberries", (40, 45, 120)),
    "broccoli": ("broccoli floret", "broccoli florets", (60, 150, 50)),
    "cookie": ("cookie", "cookies", (175, 120, 65)),
}
PLATES = {"white": (240, 240, 240), "black": (25, 25, 25), "blue": (70, 130, 215)}
# The table is a nuisance: it varies the picture but never appears in the caption.
TABLES = {"wood": (150, 105, 70), "gray": (135, 135, 135), "pink": (225, 185, 185)}

# Geometry as fractions of the image side. Items stand in a row across the plate, in fixed slots
# (one: the middle; two: left and right; three: all), so the count is a local, visible signal that a
# small vision tower learns in minutes (counting items scattered at random angles takes it far longer).
# These bounds keep a gap between neighbours, even when both shift towards each other
# (0.29 - 2 * 0.12 - 2 * 0.015 = 0.02), and every item on the plate (0.29 + 0.12 + 0.015 < 0.44).
ITEM_EXTENT = 0.12
SLOT_SPACING = 0.29
SLOTS = {1: (0,), 2: (-1, 1), 3: (-1, 0, 1)}
ITEM_SHIFT = 0.015
PLATE_RADIUS = (0.44, 0.47)
PLATE_SHIFT = 0.04
COLOR_JITTER = 10


def sample_attributes(rng: random.Random) -> dict:
    """Draw the count, item, plate colour and (uncaptioned) table colour of one photo."""
    return {
        "count": rng.choice(sorted(COUNTS)),
        "item": rng.choice(sorted(ITEMS)),
        "plate": rng.choice(sorted(PLATES)),
        "table": rng.choice(sorted(TABLES)),
    }


def describe(attrs: dict) -> str:
    """The alt text of a photo with these attributes, e.g. 'two lemons on a blue plate'."""
    singular, plural, _ = ITEMS[attrs["item"]]
    noun = singular if attrs["count"] == 1 else plural
    return f"{COUNTS[attrs['count']]} {noun} on a {attrs['plate']} plate"


# The lab's photos are 512x384 JPEGs with captions of 8-25 words: a longer caption says the same thing and adds the
# table and how the photo was taken, so token counts (and the language model's work) match the lab's data.
LAB_SIZE = (512, 384)
LAB_SHOTS = ("photographed from above", "seen from a low angle", "in soft window light", "under bright kitchen light",
             "close up with a blurred background", "ready to be eaten at a small cafe")
TABLE_WORDS = {"wood": "a wooden table", "gray": "a gray stone counter", "pink": "a pink tablecloth"}


def describe_long(attrs: dict, rng: random.Random) -> str:
    """A lab-length alt text (8-25 words), e.g. 'two lemons on a blue plate resting on a wooden table, seen from a
    low angle'."""
    caption = f"{describe(attrs)} resting on {TABLE_WORDS[attrs['table']]}"
    shots = rng.sample(LAB_SHOTS, rng.randint(0, 2))
    while shots and len(f"{caption}, {' and '.join(shots)}".split()) > 25:
        shots.pop()
    return f"{caption}, {' and '.join(shots)}" if shots else caption


def caption_vocabulary() -> list[str]:
    """Every word a caption can contain, each once, in a fixed order."""
    captions = [
        describe({"count": c, "item": i, "plate": p}) for c in sorted(COUNTS) for i in sorted(ITEMS) for p in sorted(PLATES)
    ]
    return list(dict.fromkeys(word for caption in captions for word in caption.split()))


def _jitter(rgb: tuple, rng: random.Random) -> tuple:
    return tuple(min(255, max(0, v + rng.randint(-COLOR_JITTER, COLOR_JITTER))) for v in rgb)


def _disc(draw: ImageDraw.ImageDraw, x: float, y: float, r: float, fill: tuple) -> None:
    draw.ellipse((x - r, y - r, x + r, y + r), fill=fill)


def _draw_item(draw: ImageDraw.ImageDraw, item: str, x: float, y: float, e: float, rng: random.Random) -> None:
    """Draw one item centred at (x, y) that stays inside a circle of radius e."""
    main = _jitter(ITEMS[item][2], rng)
    if item == "tomato":
        _disc(draw, x, y + 0.1 * e, 0.88 * e, main)
        draw.rectangle((x - 0.1 * e, y - 0.95 * e, x + 0.1 * e, y - 0.6 * e), fill=(40, 110, 40))
    elif item == "lemon":
        draw.ellipse((x - e, y - 0.65 * e, x + e, y + 0.65 * e), fill=main)
    elif item == "blueberry":
        _disc(draw, x, y, 0.7 * e, main)
        _disc(draw, x, y, 0.15 * e, (90, 95, 160))  # the crown, a lighter dot
    elif item == "broccoli":
        draw.rectangle((x - 0.15 * e, y, x + 0.15 * e, y + 0.95 * e), fill=(150, 190, 110))
        for dx, dy in ((-0.4, -0.1), (0.4, -0.1), (0.0, -0.45)):
            _disc(draw, x + dx * e, y + dy * e, 0.5 * e, main)
    elif item == "cookie":
        _disc(draw, x, y, 0.9 * e, main)
        for _ in range(4):
            angle, dist = rng.uniform(0, 2 * math.pi), rng.uniform(0.15, 0.55) * e
            _disc(draw, x + dist * math.cos(angle), y + dist * math.sin(angle), 0.12 * e, (75, 45, 25))


def draw(attrs: dict, rng: random.Random, size: int = 128) -> PILImage.Image:
    """Draw an RGB photo of attrs['count'] items on a plate on a table; rng sets positions and jitter."""
    image = PILImage.new("RGB", (size, size), _jitter(TABLES[attrs["table"]], rng))
    canvas = ImageDraw.Draw(image)
    cx = size * (0.5 + rng.uniform(-PLATE_SHIFT, PLATE_SHIFT))
    cy = size * (0.5 + rng.uniform(-PLATE_SHIFT, PLATE_SHIFT))
    _disc(canvas, cx, cy, size * rng.uniform(*PLATE_RADIUS), _jitter(PLATES[attrs["plate"]], rng))
    for slot in SLOTS[attrs["count"]]:
        x = cx + size * (slot * SLOT_SPACING + rng.uniform(-ITEM_SHIFT, ITEM_SHIFT))
        y = cy + size * rng.uniform(-ITEM_SHIFT, ITEM_SHIFT)
        _draw_item(canvas, attrs["item"], x, y, size * ITEM_EXTENT * rng.uniform(0.85, 1.0), rng)
    return image


def draw_lab(attrs: dict, rng: random.Random) -> PILImage.Image:
    """A 512x384 photo: the square scene, drawn 384 px high, centred on a wider strip of the same table."""
    width, height = LAB_SIZE
    image = PILImage.new("RGB", LAB_SIZE, _jitter(TABLES[attrs["table"]], rng))
    image.paste(draw(attrs, rng, height), ((width - height) // 2, 0))
    return image


def _encoded(image: PILImage.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def _make_split(num: int, rng: random.Random, size: int, lab: bool) -> Dataset:
    images, texts = [], []
    for _ in range(num):
        attrs = sample_attributes(rng)
        photo = draw_lab(attrs, rng) if lab else draw(attrs, rng, size)
        images.append({"bytes": _encoded(photo, "JPEG" if lab else "PNG"), "path": None})
        texts.append(describe_long(attrs, rng) if lab else describe(attrs))
    return Dataset.from_dict({"image": images, "text": texts}, features=Features({"image": Image(), "text": Value("string")}))


def make_synthetic_dataset(out_dir: str | Path, num_train: int = 1000, num_test: int = 100, seed: int = 0, size: int = 128,
                           lab: bool = False) -> DatasetDict:
    """Write train/test splits of synthetic photos in the lab's save_to_disk format and return them.

    `lab`: photos as the lab's own data has them, 512x384 JPEGs with 8-25-word captions (`size` is then unused);
    otherwise square PNGs of `size` px with 6-word captions, which flatter speed and memory.
    """
    # One stream for both splits: test photos are new drawings of captions the train split already covers.
    rng = random.Random(seed)
    dataset = DatasetDict({"train": _make_split(num_train, rng, size, lab), "test": _make_split(num_test, rng, size, lab)})
    dataset.save_to_disk(str(out_dir))
    return dataset


def main() -> None:
    parser = argparse.ArgumentParser(description="Write the synthetic food-photo caption dataset.")
    parser.add_argument("--out", default="data/synthetic_food", help="Directory for DatasetDict.save_to_disk.")
    parser.add_argument("--num-train", type=int, default=1000, help="Photos in the train split.")
    parser.add_argument("--num-test", type=int, default=100, help="Photos in the test split.")
    parser.add_argument("--seed", type=int, default=0, help="Same seed, same bytes.")
    parser.add_argument("--size", type=int, default=128, help="Image side in pixels.")
    parser.add_argument("--lab", action="store_true", help="The lab's format: 512x384 JPEGs, captions of 8-25 words.")
    args = parser.parse_args()
    disable_progress_bars()  # the CLI promises one line of output
    make_synthetic_dataset(args.out, args.num_train, args.num_test, args.seed, args.size, lab=args.lab)
    if args.lab:
        print(f"wrote {args.num_train} train + {args.num_test} test photos (512x384 JPEG, 8-25-word captions) to {args.out}")
        return
    num_captions = len(COUNTS) * len(ITEMS) * len(PLATES)
    print(f"wrote {args.num_train} train + {args.num_test} test photos ({args.size} px, {num_captions} distinct captions) to {args.out}")


if __name__ == "__main__":
    main()
