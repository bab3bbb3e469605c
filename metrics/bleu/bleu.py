"""Corpus BLEU-4 (Papineni et al. 2002) in plain python: an `evaluate` module that needs no download.

Clipped n-gram counts (n = 1..4) are summed over the whole corpus, their precisions combined by a
geometric mean, times the brevity penalty exp(1 - r/c) when the predictions (length c) are shorter
than the references (length r: for each prediction, the reference length closest to it, the shorter
one on ties). No smoothing: a corpus with no matching 4-gram scores 0, as in the original definition.
"""

import math
import re
from collections import Counter

import datasets
import evaluate

_WORD = re.compile(r"[a-z0-9']+")


def tokenize(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngrams(words: list[str], n: int) -> Counter:
    return Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def corpus_bleu(predictions: list[str], references: list[list[str]], max_order: int = 4) -> dict:
    matches, possible = [0] * max_order, [0] * max_order
    prediction_length = reference_length = 0
    for prediction, refs in zip(predictions, references):
        words = tokenize(prediction)
        ref_words = [tokenize(ref) for ref in refs]
        prediction_length += len(words)
        reference_length += min((abs(len(r) - len(words)), len(r)) for r in ref_words)[1]
        for n in range(1, max_order + 1):
            counts = ngrams(words, n)
            most = Counter()
            for ref in ref_words:
                most |= ngrams(ref, n)  # the most times each n-gram occurs in any one reference
            matches[n - 1] += sum(min(count, most[gram]) for gram, count in counts.items())
            possible[n - 1] += max(len(words) - n + 1, 0)
    precisions = [m / p if p else 0.0 for m, p in zip(matches, possible)]
    if min(precisions) > 0:
        geometric_mean = math.exp(sum(math.log(p) for p in precisions) / max_order)
    else:
        geometric_mean = 0.0
    ratio = prediction_length / reference_length if reference_length else 0.0
    brevity_penalty = 1.0 if ratio > 1.0 else (math.exp(1 - 1 / ratio) if ratio > 0 else 0.0)
    return {
        "bleu": geometric_mean * brevity_penalty,
        "precisions": precisions,
        "brevity_penalty": brevity_penalty,
        "length_ratio": ratio,
        "translation_length": prediction_length,
        "reference_length": reference_length,
    }


class Bleu(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Papineni, Roukos, Ward, Zhu. BLEU: a method for automatic evaluation of machine translation. ACL 2002.",
            inputs_description="predictions: list of str; references: list of list of str (one or more per prediction)",
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
            ),
        )

    def _compute(self, predictions, references, max_order: int = 4):
        return corpus_bleu(predictions, references, max_order=max_order)
