"""The pages under docs/ and the folder READMEs name files that exist: a moved module fails here, not a reader."""

import re
from pathlib import Path

import pytest

from tests.test_readme import FOLDERS, USER_PATHS

ROOT = Path(__file__).resolve().parents[2]
# docs/compatibility.md is rendered from recorded runs (tracebacks name the files of their day) and has its own test.
PAGES = sorted(path for path in (ROOT / "docs").glob("*.md") if path.name != "compatibility.md") + [
    ROOT / "ds_configs" / "README.md", ROOT / "metrics" / "README.md"]
WRITTEN_BY_RUNS = ("runs/", "outputs/")


def named_paths(text: str) -> set[str]:
    """Backticked repo paths, without a `:function` suffix; patterns and placeholders (`*`, `<name>`) left out."""
    named = set(re.findall(rf"`((?:{'|'.join(FOLDERS)})/[\w./-]+)", text))
    return {path for path in named if "*" not in path and "<" not in path}


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_repo_path_the_page_names_exists(page):
    missing = sorted(path for path in named_paths(page.read_text()) - USER_PATHS
                     if not path.startswith(WRITTEN_BY_RUNS) and not (ROOT / path).exists())
    assert not missing, f"{page.relative_to(ROOT)} names {missing}, which do not exist; name the files they moved to"


def test_a_moved_path_is_caught():
    assert named_paths("see `recipes/launch.py` and `data/images.py:to_rgb`, `recipes/<family>/*.yaml`") == {
        "recipes/launch.py", "data/images.py"}
