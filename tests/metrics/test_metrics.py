"""Each caption metric, loaded through evaluate.load(path) as the recipes do, against numbers worked by hand."""

import math
from pathlib import Path

import evaluate
import pytest

METRICS = Path(__file__).resolve().parents[2] / "metrics"
LEMONS = ["two lemons on a blue plate", "one cookie on a black plate"]
LEMON_REFS = [["two lemons on a white plate"], ["one cookie on a black plate"]]


def load(name: str):
    return evaluate.load(str(METRICS / name))


@pytest.mark.parametrize("name", sorted(p.name for p in METRICS.iterdir() if p.is_dir() and not p.name.startswith("_")))
def test_every_module_loads_offline_and_scores_right_captions_above_wrong_ones(name):
    metric = load(name)
    key = {"rouge_l": "rougeL", "caption_match": "token_f1"}.get(name, name)
    right = metric.compute(predictions=[refs[0] for refs in LEMON_REFS], references=LEMON_REFS)[key]
    wrong = metric.compute(predictions=["three tomatoes", "pink table"], references=LEMON_REFS)[key]
    assert wrong == 0.0 and right > 0.9


def test_bleu_by_hand():
    result = load("bleu").compute(predictions=LEMONS, references=LEMON_REFS)
    # n-gram matches over both captions: 1-grams 5+6 of 6+6, 2-grams 3+5 of 5+5, 3-grams 2+4 of 4+4, 4-grams 1+3 of 3+3.
    assert result["precisions"] == pytest.approx([11 / 12, 8 / 10, 6 / 8, 4 / 6])
    assert result["brevity_penalty"] == 1.0
    assert result["bleu"] == pytest.approx((11 / 12 * 8 / 10 * 6 / 8 * 4 / 6) ** 0.25)


def test_bleu_brevity_penalty_uses_the_closest_reference_length():
    short = load("bleu").compute(predictions=["one two three four"], references=[["one two three four five six"]])
    assert short["bleu"] == pytest.approx(math.exp(1 - 6 / 4))  # all precisions 1; BP = exp(1 - r/c)
    closest = load("bleu").compute(predictions=["one two three four"], references=[["one two three four five six", "one two three"]])
    assert closest["reference_length"] == 3 and closest["bleu"] == pytest.approx(1.0)


def test_bleu_without_a_matching_4gram_is_zero():
    assert load("bleu").compute(predictions=["the cat sat on the mat"], references=[["the cat is on the mat"]])["bleu"] == 0.0


def test_rouge_l_by_hand():
    rouge = load("rouge_l")
    assert rouge.compute(predictions=["the cat sat on the mat"], references=[["the cat is on the mat"]])["rougeL"] == pytest.approx(5 / 6)
    # LCS("a b c d", "a c e") = "a c": P = 2/4, R = 2/3, F1 = 4/7; the better reference wins.
    result = rouge.compute(predictions=["a b c d"], references=[["a c e", "x"]])
    assert result["rougeL"] == pytest.approx(4 / 7)
    assert (result["rougeL_precision"], result["rougeL_recall"]) == pytest.approx((1 / 2, 2 / 3))


def test_cider_d_by_hand():
    # "on a plate" is in both images' references, so its idf is log(2/2) = 0; every other n-gram has idf log 2.
    # Caption 1 shares 2 of 3 weighted unigrams, 2 of 4 bigrams, 2 of 4 trigrams, 1 of 3 4-grams (cosines 2/3, 1/2, 1/2, 1/3).
    result = load("cider").compute(predictions=LEMONS, references=LEMON_REFS)
    assert result["cider_per_caption"] == pytest.approx([10 * (2 / 3 + 1 / 2 + 1 / 2 + 1 / 3) / 4, 10.0])
    assert result["cider"] == pytest.approx(7.5)


def test_cider_d_length_penalty_and_missing_ngram_orders():
    # "a b" has no 3- or 4-grams, so a perfect two-word caption scores 10 * (1 + 1 + 0 + 0) / 4 = 5.
    # "a b c" against "a b": unigram cosine 2/sqrt(3*2), bigram 1/sqrt(2*1), lengths differ by 1 (sigma 6).
    same = load("cider").compute(predictions=["a b", "a b"], references=[["a b"], ["a b"]])
    assert same["cider"] == 0.0  # n-grams in every image's references carry no information: idf log(2/2) = 0
    result = load("cider").compute(predictions=["a b", "a b c"], references=[["a b"], ["c d"]])
    assert result["cider_per_caption"][0] == pytest.approx(5.0)
    expected = 10 * (2 / math.sqrt(6) + 1 / math.sqrt(2)) / 4 * math.exp(-1 / 72)
    assert load("cider").compute(predictions=["a b c", "c d"], references=[["a b"], ["c d"]])["cider_per_caption"][0] == pytest.approx(expected)


def test_cider_d_clips_repeated_ngrams():
    once = load("cider").compute(predictions=["a b", "c d"], references=[["a b"], ["c d"]])["cider_per_caption"][0]
    repeated = load("cider").compute(predictions=["a a b b", "c d"], references=[["a b"], ["c d"]])["cider_per_caption"][0]
    assert repeated < once


def test_meteor_exact_by_hand():
    meteor = load("meteor")
    # 4 matches in 2 chunks ("a b", "c d"): P = 1, R = 4/5, Fmean = PR / (0.9P + 0.1R), penalty 0.5 * (2/4)^3.
    fmean = 0.8 / (0.9 + 0.08)
    assert meteor.compute(predictions=["a b c d"], references=[["a b x c d"]])["meteor"] == pytest.approx(fmean * (1 - 0.0625))
    assert meteor.compute(predictions=["c d a b"], references=[["a b c d"]])["meteor"] == pytest.approx(1 - 0.0625)
    identical = meteor.compute(predictions=LEMON_REFS[1], references=[LEMON_REFS[1]])["meteor"]
    assert identical == pytest.approx(1 - 0.5 * (1 / 6) ** 3)  # one chunk of six: METEOR never quite reaches 1


def test_caption_match_by_hand():
    result = load("caption_match").compute(
        predictions=["Two lemons, on a blue plate.", "one cookie on a black plate"], references=LEMON_REFS
    )
    assert result["exact_match"] == pytest.approx(0.5)  # case and punctuation do not count; blue != white does
    assert result["token_f1"] == pytest.approx((5 / 6 + 1) / 2)
