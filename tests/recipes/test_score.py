"""recipes/score.py: metrics over a split, from a model or a file of captions, and its messages."""

import json

import pytest

from altscale.data.synthetic import make_synthetic_dataset
from recipes import score
from altscale.config.errors import ConfigError, DataError
from tests.recipes.alt_text_models import save_tiny_model


def test_scores_through_the_metric_modules():
    scores = score.compute_scores(["two lemons on a blue plate", "one cookie"], ["two lemons on a blue plate", "three tomatoes"])
    assert scores["exact_match"] == pytest.approx(0.5) and scores["token_f1"] == pytest.approx(0.5)
    assert set(scores) >= {"bleu", "rougeL", "cider", "meteor"}


def test_predictions_file_and_its_messages(tmp_path, capsys):
    path = tmp_path / "alt.jsonl"
    path.write_text(json.dumps({"alt_text": "one tomato on a white plate", "reference": "one tomato on a white plate"}) + "\n")
    result = score.main(["--predictions", str(path), "--output", str(tmp_path / "scores.json")])
    assert result["scores"]["exact_match"] == 1.0 and json.loads((tmp_path / "scores.json").read_text())["scores"] == result["scores"]
    assert "exact_match  1.0000" in capsys.readouterr().out
    with pytest.raises(DataError, match="predictions: .*missing.jsonl does not exist"):
        score.main(["--predictions", str(tmp_path / "missing.jsonl")])
    path.write_text(json.dumps({"image": "a.png", "alt_text": "x"}) + "\n")
    with pytest.raises(DataError, match=r"needs lines with alt_text and reference \(lines \[1\]\)"):
        score.main(["--predictions", str(path)])
    with pytest.raises(ConfigError, match="model_name_or_path: not given"):
        score.main([])


def test_a_model_is_scored_on_a_split(tmp_path):
    make_synthetic_dataset(tmp_path / "food", num_train=4, num_test=4, size=32)
    model = save_tiny_model(tmp_path / "model")
    result = score.main(["--model_name_or_path", model, "--dataset_path", str(tmp_path / "food"), "--num_samples", "3"])
    assert len(result["captions"]) == 3 and result["scores"]["exact_match"] == 0.0  # untrained
    with pytest.raises(DataError, match="split: 'dev' is not in"):
        score.main(["--model_name_or_path", model, "--dataset_path", str(tmp_path / "food"), "--split", "dev"])

