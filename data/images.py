"""Images as the engine reads them: any file PIL opens, in any mode, as 8-bit RGB."""

from pathlib import Path

import numpy as np
from PIL import Image

from altscale.config.errors import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff")


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode as 8-bit RGB, the same under both image-processor backends (PIL and torchvision).

    PIL's own convert("RGB") clips 16-bit greyscale at 255, turning most of a 16-bit PNG white, so
    those are rescaled first; transparent pixels are laid on white, as a browser shows them.
    """
    if image.mode == "RGB":
        return image
    if image.mode.startswith("I;16"):
        image = Image.fromarray((np.asarray(image, dtype=np.float32) / 257).round().astype(np.uint8))
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        image = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", image.size, (255, 255, 255, 255)), image).convert("RGB")
    return image.convert("RGB")


def open_image(path: Path) -> Image.Image | None:
    """The picture as RGB, converted as in training (to_rgb), or None if PIL cannot read it."""
    try:
        with Image.open(path) as image:
            return to_rgb(image) if image.mode != "RGB" else image.copy()
    except (OSError, ValueError, Image.DecompressionBombError):
        return None


def load_images(path: Path) -> tuple[list[str], list, list[str]]:
    """(names, RGB images, problems) for an image file or every image under a folder."""
    if not path.exists():
        raise DataError(f"images: {path} does not exist; give an image file or a folder of images")
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise DataError(f"images: folder {path} holds no images ({', '.join(IMAGE_SUFFIXES)})")
    names, images, problems = [], [], []
    for file in files:
        image = open_image(file)
        if image is None:
            problems.append(f"skipped {file}: not a readable image")
        else:
            names.append(str(file))
            images.append(image)
    if path.is_file() and not images:
        raise DataError(f"images: {path} is not an image that PIL can read; give a PNG, JPEG, WebP, GIF, BMP or TIFF file")
    return names, images, problems
