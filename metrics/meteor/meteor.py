"""METEOR with the exact-match module only, in plain python: an `evaluate` module that needs no download.

Banerjee & Lavie (2005), parameters alpha = 0.9, beta = 3, gamma = 0.5 as in NLTK's meteor_score:
    m = words matched exactly (each word of either side used once), P = m / |prediction|, R = m / |reference|
    Fmean = P R / (alpha P + (1 - alpha) R) = 10 P R / (R + 9 P)
    penalty = gamma * (chunks / m) ** beta, where a chunk is a run of matches adjacent and in the same
              order on both sides
    METEOR = Fmean * (1 - penalty)
Left out on purpose: the stemming and WordNet-synonym modules, because WordNet data cannot be
downloaded offline; scores are therefore at or below NLTK's. Matching goes left to right over the
prediction; a word takes the reference occurrence that continues the current chunk if there is one,
else the first unused one. The best reference counts; the scores are averaged over captions.
"""

import re

import datasets
import evaluate

_WORD = re.compile(r"[a-z0-9']+")
ALPHA, BETA, GAMMA = 0.9, 3.0, 0.5


def tokenize(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def align(words: list[str], ref: list[str]) -> list[tuple[int, int]]:
    """(prediction index, reference index) of each exact match."""
    used, pairs = set(), []
    for i, word in enumerate(words):
        options = [j for j, other in enumerate(ref) if other == word and j not in used]
        if not options:
            continue
        follows = pairs and pairs[-1][0] == i - 1 and pairs[-1][1] + 1 in options
        j = pairs[-1][1] + 1 if follows else options[0]
        used.add(j)
        pairs.append((i, j))
    return pairs


def meteor_exact(prediction: str, reference: str) -> float:
    words, ref = tokenize(prediction), tokenize(reference)
    pairs = align(words, ref)
    matches = len(pairs)
    if matches == 0:
        return 0.0
    precision, recall = matches / len(words), matches / len(ref)
    fmean = precision * recall / (ALPHA * precision + (1 - ALPHA) * recall)
    chunks = 1 + sum(1 for (i0, j0), (i1, j1) in zip(pairs, pairs[1:]) if not (i1 == i0 + 1 and j1 == j0 + 1))
    return fmean * (1 - GAMMA * (chunks / matches) ** BETA)


class Meteor(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Banerjee, Lavie. METEOR: An Automatic Metric for MT Evaluation with Improved Correlation with Human Judgments. 2005.",
            inputs_description="predictions: list of str; references: list of list of str (one or more per prediction)",
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
            ),
        )

    def _compute(self, predictions, references):
        scores = [max(meteor_exact(p, r) for r in refs) for p, refs in zip(predictions, references)]
        return {"meteor": sum(scores) / len(scores) if scores else 0.0}
