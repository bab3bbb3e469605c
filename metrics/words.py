"""What "the same caption" means everywhere in altscale: the same words, lower-cased, punctuation dropped.

One definition for the count the run prints after training and for the caption_match metric (exact_match),
so "92/100 exactly right" and exact_match 0.92 say the same thing.
"""

import re

_WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def exact_match(prediction: str, reference: str) -> bool:
    return words(prediction) == words(reference)
