"""Caption metrics as `evaluate` modules, one folder each (see metrics/README.md); compute_scores runs them all."""

from pathlib import Path

HERE = Path(__file__).resolve().parent
METRICS = ("bleu", "rouge_l", "cider", "meteor", "caption_match")


def compute_scores(predictions: list[str], references: list[str], names: tuple[str, ...] = METRICS) -> dict:
    """Every metric through evaluate's interface, loaded by path (evaluate.load("bleu") would download);
    references hold one caption per prediction. Per-caption lists are left out."""
    import evaluate

    refs = [[reference] for reference in references]
    scores = {}
    for name in names:
        result = evaluate.load(str(HERE / name)).compute(predictions=predictions, references=refs)
        scores.update({key: value for key, value in result.items() if not key.endswith("_per_caption")})
    return scores
