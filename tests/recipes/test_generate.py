"""recipes/generate.py: alt text for an image, a folder, a dataset split and HTML pages, and its messages."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from altscale.data import pages
from altscale.data.synthetic import make_synthetic_dataset
from recipes import generate
from altscale.config.errors import ConfigError, DataError
from tests.recipes.alt_text_models import save_tiny_model

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample_page"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model"))


@pytest.fixture
def site(tmp_path):
    shutil.copytree(SAMPLE, tmp_path / "site")
    return tmp_path / "site"


def run(model_dir, *argv):
    return generate.main(["--model_name_or_path", model_dir, "--batch_size", "3", *argv])


def test_one_image_and_a_folder_give_jsonl(model_dir, site, tmp_path, capsys):
    rows = run(model_dir, "--images", str(site / "images" / "tomato.png"), "--output", str(tmp_path / "one.jsonl"))
    assert [json.loads(line) for line in (tmp_path / "one.jsonl").read_text().splitlines()] == rows
    assert rows[0]["image"].endswith("tomato.png") and 0 < len(rows[0]["alt_text"]) <= 125
    rows = run(model_dir, "--images", str(site / "images"))
    assert sorted(Path(row["image"]).name for row in rows) == ["broccoli.png", "three-cookies.png", "tomato.png", "two-lemons.png"]
    captured = capsys.readouterr()
    assert "skipped" in captured.err and "not-an-image.png: not a readable image" in captured.err
    assert len(captured.out.splitlines()) == 4  # JSONL on stdout, messages on stderr


def test_dataset_split_rows_carry_the_reference(model_dir, tmp_path):
    make_synthetic_dataset(tmp_path / "food", num_train=4, num_test=5, size=32)
    rows = run(model_dir, "--dataset_path", str(tmp_path / "food"), "--split", "test", "--num_samples", "3", "--num_beams", "2")
    assert len(rows) == 3 and all(row["alt_text"] and row["reference"] for row in rows)
    with pytest.raises(DataError, match=r"split: 'validation' is not in .* has splits \['train', 'test'\]"):
        run(model_dir, "--dataset_path", str(tmp_path / "food"), "--split", "validation")
    with pytest.raises(DataError, match="num_samples: 9, but split 'test' has 5 examples"):
        run(model_dir, "--dataset_path", str(tmp_path / "food"), "--num_samples", "9")


def without_alts(text: str) -> str:
    """The page with every <img>'s alt attribute and the one character before it removed."""
    for tag in reversed([tag for tag in pages.find_img_tags(text) if tag and tag.alt_span]):
        text = text[: tag.alt_span[0] - 1] + text[tag.alt_span[1] :]
    return text


def test_html_page_gets_alt_text_in_a_new_file_and_nothing_else_changes(model_dir, site, capsys):
    before = (site / "index.html").read_bytes()
    rows = run(model_dir, "--html", str(site / "index.html"), "--max_alt_chars", "40")
    assert (site / "index.html").read_bytes() == before  # the input is never overwritten unless asked
    written = pages.read_page(site / "index.alt.html")
    assert without_alts(written) == without_alts(before.decode())
    status = {(row["src"], row["status"]) for row in rows}
    assert {("images/two-lemons.png", "done"), ("images/tomato.png", "done"), ("images/salad.png", "skipped"),
            ("images/not-an-image.png", "skipped"), ("https://example.com/photos/soup.jpg", "skipped")} <= status
    done = [row for row in rows if row["status"] == "done"]
    alts = [tag.attrs.get("alt") for tag in pages.find_img_tags(written)]
    assert all(row["alt_text"] in alts and 0 < len(row["alt_text"]) <= 40 for row in done)
    assert "unreadable image" in capsys.readouterr().err


def test_html_keep_existing_folder_mode_and_in_place(model_dir, site, tmp_path):
    rows = run(model_dir, "--html", str(site), "--keep_existing", "true", "--html_out", str(tmp_path / "out"))
    assert sorted(row["src"] for row in rows if row["status"] == "kept") == ["images/broccoli.png", "images/three-cookies.png", "images/tomato.png"]
    written = (tmp_path / "out" / "index.html").read_text()
    assert 'ALT="IMG_0412.png"' in written and 'alt="Two broccoli florets on a white plate, freshly steamed"' in written
    run(model_dir, "--html", str(site / "index.html"), "--in_place", "true", "--output", str(tmp_path / "report.jsonl"))
    assert '<img src="images/two-lemons.png" alt="' in (site / "index.html").read_text()
    assert len((tmp_path / "report.jsonl").read_text().splitlines()) == 9


@pytest.mark.parametrize("argv, error, message", [
    ([], ConfigError, "exactly one of --images, --dataset_path, --html; got none"),
    (["--images", "a.png", "--html", "b.html"], ConfigError, "exactly one of .* got \\['images', 'html'\\]"),
    (["--images", "x", "--keep_existing", "true"], ConfigError, "apply to --html pages only"),
    (["--html", "p.html", "--in_place", "true", "--html_out", "q.html"], ConfigError, "both say where pages go"),
    (["--html", "p.html", "--html_out", "p.html"], ConfigError, "is the input; to overwrite it say --in_place true"),
    (["--html", "missing.html"], DataError, "html: missing.html does not exist"),
    (["--images", "x", "--num_beams", "0"], ConfigError, "num_beams: 0; use 1 or more"),
    (["--images", "x", "--max_alt_chars", "5"], ConfigError, "max_alt_chars: 5 leaves no room"),
    (["--images", "x", "--beams", "2"], ConfigError, "command line"),
    pytest.param(["--images", "x", "--load_in_4bit", "true"], ConfigError, "load_in_4bit: bitsandbytes' 4-bit kernels need a CUDA GPU",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU-only message")),
])
def test_user_mistakes_fail_before_loading_with_one_message(argv, error, message):
    with pytest.raises(error, match=message):
        generate.main(["--model_name_or_path", "does-not-matter", *argv])


def test_image_path_mistakes_fail_before_the_model_loads(site, tmp_path):
    no_model = str(tmp_path / "no-model")  # loading it would raise a different error
    with pytest.raises(DataError, match="images: .*nope.png does not exist"):
        run(no_model, "--images", str(tmp_path / "nope.png"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="images: folder .*empty holds no images"):
        run(no_model, "--images", str(tmp_path / "empty"))
    with pytest.raises(DataError, match="is not an image that PIL can read"):
        run(no_model, "--images", str(site / "images" / "not-an-image.png"))
    with pytest.raises(DataError, match="dataset path .*nodata does not exist"):
        run(no_model, "--dataset_path", str(tmp_path / "nodata"))
    with pytest.raises(ConfigError, match="model_name_or_path: not given"):
        generate.main(["--images", str(site / "images")])


def test_run_turns_mistakes_into_one_line_and_exit_code_2(capsys):
    assert generate.run(["--model_name_or_path", "x"]) == 2
    assert capsys.readouterr().err.startswith("error: say what to describe")
