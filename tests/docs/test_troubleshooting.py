"""docs/troubleshooting.md cannot rot: every message it lists still occurs in the source."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "troubleshooting.md"
# Where messages are printed from: the scripts and the engine (pyproject.toml installs each engine folder).
SOURCE_FOLDERS = ("recipes", "config", "strategies", "families", "models", "data", "callbacks", "metrics", "artifacts",
                  "patches")
PLACEHOLDER = "…"  # stands for a value filled in at run time


def documented_messages() -> list[str]:
    """The backticked spans of the first column of every table whose first header is 'Message ...'."""
    messages, in_message_table = [], False
    for line in DOC.read_text().splitlines():
        if not line.startswith("|"):
            in_message_table = False
            continue
        first_cell = line.split("|")[1].strip()
        if first_cell.startswith("Message"):
            in_message_table = True
        elif in_message_table and not first_cell.startswith("---"):
            messages += re.findall(r"`([^`]+)`", first_cell)
    return messages


def sources() -> dict[str, str]:
    return {str(path.relative_to(ROOT)): path.read_text() for folder in SOURCE_FOLDERS
            for path in sorted((ROOT / folder).rglob("*.py"))}


def occurs_in(message: str, text: str) -> bool:
    """The message's fixed parts appear in this order in `text`."""
    position = 0
    for part in (part.strip() for part in message.split(PLACEHOLDER)):
        if not part:
            continue
        position = text.find(part, position)
        if position < 0:
            return False
        position += len(part)
    return True


def test_the_doc_lists_messages():
    assert len(documented_messages()) > 50


@pytest.mark.parametrize("message", documented_messages())
def test_documented_message_still_exists(message):
    files = sources()
    assert any(occurs_in(message, text) for text in files.values()), (
        f"docs/troubleshooting.md lists {message!r}, which no file under {', '.join(SOURCE_FOLDERS)} says any more; "
        "update the doc's row to the message the code now prints"
    )
