"""ROUGE-L (Lin 2004) in plain python: an `evaluate` module that needs no download.

Per caption, with LCS the longest common subsequence of words: precision = LCS / prediction length,
recall = LCS / reference length, F1 = 2PR / (P + R) (beta = 1, as in Google's rouge_score). The best
reference by F1 counts; the scores are averaged over captions.
"""

import re

import datasets
import evaluate

_WORD = re.compile(r"[a-z0-9']+")


def tokenize(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def lcs_length(a: list[str], b: list[str]) -> int:
    previous = [0] * (len(b) + 1)
    for word in a:
        current = [0]
        for j, other in enumerate(b):
            current.append(previous[j] + 1 if word == other else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def rouge_l_scores(prediction: str, reference: str) -> tuple[float, float, float]:
    """(precision, recall, F1) of one prediction against one reference."""
    words, ref = tokenize(prediction), tokenize(reference)
    lcs = lcs_length(words, ref)
    if lcs == 0:
        return 0.0, 0.0, 0.0
    precision, recall = lcs / len(words), lcs / len(ref)
    return precision, recall, 2 * precision * recall / (precision + recall)


class RougeL(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Lin. ROUGE: A Package for Automatic Evaluation of Summaries. ACL Workshop 2004.",
            inputs_description="predictions: list of str; references: list of list of str (one or more per prediction)",
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
            ),
        )

    def _compute(self, predictions, references):
        best = [max((rouge_l_scores(p, r) for r in refs), key=lambda s: s[2]) for p, refs in zip(predictions, references)]
        count = max(len(best), 1)
        return {
            "rougeL": sum(s[2] for s in best) / count,
            "rougeL_precision": sum(s[0] for s in best) / count,
            "rougeL_recall": sum(s[1] for s in best) / count,
        }
