"""Draw the sample page's photos with data/synthetic.py: python data/sample_page/draw.py

The PNGs are committed (a few KB each) so the page works without running this; it documents where
they came from and redraws the same bytes.
"""

import random
import sys
from pathlib import Path


from altscale.data.synthetic import describe, draw

HERE = Path(__file__).parent
# file name -> what is drawn; the model's right answer is describe(attrs).
PHOTOS = {
    "two-lemons.png": {"count": 2, "item": "lemon", "plate": "blue", "table": "wood"},
    "tomato.png": {"count": 1, "item": "tomato", "plate": "white", "table": "gray"},
    "three-cookies.png": {"count": 3, "item": "cookie", "plate": "black", "table": "pink"},
    "broccoli.png": {"count": 2, "item": "broccoli", "plate": "white", "table": "wood"},
}


def main() -> None:
    for name, attrs in PHOTOS.items():
        draw(attrs, random.Random(name), size=128).save(HERE / "images" / name, optimize=True)
        print(f"{name}: {describe(attrs)}")
    # A file that only looks like an image, so the page shows what a skipped <img> reports.
    (HERE / "images" / "not-an-image.png").write_text("this is text, not a PNG\n")


if __name__ == "__main__":
    main()
