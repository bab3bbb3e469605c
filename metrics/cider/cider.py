"""CIDEr-D (Vedantam, Zitnick, Parikh 2015) in plain python: an `evaluate` module that needs no download.

The coco-caption definition. For n = 1..4, each sentence becomes a vector of tf-idf weights
g(w) = count(w in sentence) * log(N / max(1, df(w))), where N is the number of captioned images and
df(w) the number of images whose references contain n-gram w (so idf comes from the references only).
For a prediction c and a reference s:
    sim_n(c, s) = sum_w min(g_c(w), g_s(w)) * g_s(w) / (|g_c| |g_s|) * exp(-(l_c - l_s)^2 / (2 sigma^2))
with sigma = 6 and l a sentence's length in words (coco-caption counts bigrams, one fewer, which
gives the same difference for sentences of two or more words). CIDEr-D(c) = 10 * mean over n and over
the references of sim_n; the corpus score is the mean over images. With one image, every idf is log(1) = 0
and so is the score: CIDEr needs a set of images.
"""

import math
import re
from collections import Counter

import datasets
import evaluate

_WORD = re.compile(r"[a-z0-9']+")
MAX_N = 4
SIGMA = 6.0


def tokenize(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngram_counts(words: list[str]) -> Counter:
    return Counter(tuple(words[i : i + n]) for n in range(1, MAX_N + 1) for i in range(len(words) - n + 1))


def document_frequency(references: list[list[str]]) -> Counter:
    df = Counter()
    for refs in references:
        df.update(set().union(*(ngram_counts(tokenize(ref)) for ref in refs)))
    return df


def tfidf(counts: Counter, df: Counter, log_images: float) -> tuple[list[dict], list[float]]:
    """Per-n weight vectors and their norms."""
    vectors = [{} for _ in range(MAX_N)]
    for gram, count in counts.items():
        vectors[len(gram) - 1][gram] = count * (log_images - math.log(max(1.0, df[gram])))
    norms = [math.sqrt(sum(w * w for w in vec.values())) for vec in vectors]
    return vectors, norms


def cider_d(predictions: list[str], references: list[list[str]], sigma: float = SIGMA) -> list[float]:
    """CIDEr-D of each prediction."""
    df = document_frequency(references)
    log_images = math.log(len(references)) if references else 0.0
    scores = []
    for prediction, refs in zip(predictions, references):
        words = tokenize(prediction)
        vec, norm = tfidf(ngram_counts(words), df, log_images)
        total = 0.0
        for ref in refs:
            ref_words = tokenize(ref)
            ref_vec, ref_norm = tfidf(ngram_counts(ref_words), df, log_images)
            penalty = math.exp(-((len(words) - len(ref_words)) ** 2) / (2 * sigma**2))
            for n in range(MAX_N):
                if norm[n] and ref_norm[n]:
                    # min() is CIDEr-D's clipping: repeating an n-gram cannot raise the score.
                    overlap = sum(min(w, ref_vec[n].get(g, 0.0)) * ref_vec[n].get(g, 0.0) for g, w in vec[n].items())
                    total += overlap / (norm[n] * ref_norm[n]) * penalty
        scores.append(10.0 * total / MAX_N / len(refs))
    return scores


class Cider(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Vedantam, Zitnick, Parikh. CIDEr: Consensus-based Image Description Evaluation. CVPR 2015.",
            inputs_description="predictions: list of str, one per image; references: list of list of str (the image's references)",
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
            ),
        )

    def _compute(self, predictions, references, sigma: float = SIGMA):
        per_caption = cider_d(predictions, references, sigma=sigma)
        return {"cider": sum(per_caption) / len(per_caption) if per_caption else 0.0, "cider_per_caption": per_caption}
