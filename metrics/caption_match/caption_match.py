"""Exact match and token F1 of captions, in plain python: an `evaluate` module that needs no download.

exact_match: 1 when the prediction's words equal a reference's words (lower-cased, punctuation dropped).
token_f1: SQuAD's bag-of-words F1, with common = the multiset intersection of the two word lists,
P = common / |prediction|, R = common / |reference|, F1 = 2PR / (P + R). Best reference, mean over captions.
"""

from collections import Counter

import datasets
import evaluate

from altscale.metrics.words import exact_match, words as tokenize


def token_f1(prediction: str, reference: str) -> float:
    words, ref = tokenize(prediction), tokenize(reference)
    common = sum((Counter(words) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(words), common / len(ref)
    return 2 * precision * recall / (precision + recall)


class CaptionMatch(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Rajpurkar et al. SQuAD: 100,000+ Questions for Machine Comprehension of Text. EMNLP 2016 (token F1).",
            inputs_description="predictions: list of str; references: list of list of str (one or more per prediction)",
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
            ),
        )

    def _compute(self, predictions, references):
        exact = [max(float(exact_match(p, r)) for r in refs) for p, refs in zip(predictions, references)]
        f1 = [max(token_f1(p, r) for r in refs) for p, refs in zip(predictions, references)]
        count = max(len(exact), 1)
        return {"exact_match": sum(exact) / count, "token_f1": sum(f1) / count}
