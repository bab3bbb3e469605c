"""Tests never touch the network: CI reaches the package index only, and the Hub not at all."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def synthetic_photos(tmp_path_factory):
    """Draws synthetic food photos (`make data`'s kind) into a folder and returns its path, once per session for
    each set of parameters: `synthetic_photos(num_train=48, num_test=8, seed=2, size=64)`. Test modules that ask for
    the same set share the folder, so treat it as read-only. Each module keeps its own numbers (its assertions
    count steps and epochs on them) in a one-line `photos` fixture."""
    drawn: dict[tuple[int, int, int, int], str] = {}

    def draw(*, num_train: int, num_test: int, seed: int, size: int) -> str:
        key = (num_train, num_test, seed, size)
        if key not in drawn:
            from altscale.data.synthetic import make_synthetic_dataset  # here: most test runs never need datasets

            path = tmp_path_factory.mktemp("data") / "food"
            make_synthetic_dataset(path, num_train=num_train, num_test=num_test, seed=seed, size=size)
            drawn[key] = str(path)
        return drawn[key]

    return draw
