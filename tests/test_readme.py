"""The README stays true: every key a recipe can use beyond TrainingArguments is listed, every named file exists."""

import re
from dataclasses import fields
from pathlib import Path

import pytest

from altscale.config.arguments import DataArguments, ModelArguments, StrategyArguments

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


@pytest.mark.parametrize("group", [ModelArguments, DataArguments, StrategyArguments], ids=lambda g: g.__name__)
def test_every_project_key_is_in_the_readme(group):
    missing = [f.name for f in fields(group) if f"`{f.name}`" not in README]
    assert not missing, f"add to README.md's key table: {missing}"


# The repository's folders whose files the README names (the engine's too: the layout table points into them).
FOLDERS = ("recipes", "config", "strategies", "families", "models", "data", "callbacks", "metrics", "artifacts",
           "patches", "benchmarks", "docs", "ds_configs", "accelerate_configs", "tests")
# Paths a user brings or a run writes, named as examples.
USER_PATHS = {"data/gourmetgram_caption", "data/synthetic_food", "data/synthetic_food-224", "data/synthetic_food-lab"}


def test_every_repo_path_the_readme_names_exists():
    named = set(re.findall(rf"`((?:{'|'.join(FOLDERS)})/[\w./-]+)`", README))
    missing = [path for path in named - USER_PATHS if "*" not in path and "<" not in path and not (ROOT / path).exists()]
    assert not missing, missing


def test_the_first_screen_has_the_two_commands():
    first_screen = "\n".join(README.splitlines()[:12])
    assert "make demo" in first_screen and "make test" in first_screen
