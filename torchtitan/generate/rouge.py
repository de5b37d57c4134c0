"""ROUGE-1 F1 (Lin 2004, "ROUGE: A Package for Automatic Evaluation of Summaries"): unigram overlap.

    overlap   = sum over words w of min(count of w in candidate, count of w in reference)
    precision = overlap / words in candidate,  recall = overlap / words in reference
    F1        = 2 * precision * recall / (precision + recall)     (0 when nothing overlaps)

Tokenisation: lowercase, then words are the maximal runs of [a-z0-9]; everything else (punctuation,
whitespace, other characters) only separates words. This is the default tokenisation of Google's `rouge-score`
package (use_stemmer=False), the usual reference implementation, so the figures are comparable to it.
"""

from __future__ import annotations

import re
from collections import Counter

_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def rouge1_f1(candidate: str, reference: str) -> float:
    cand, ref = Counter(words(candidate)), Counter(words(reference))
    overlap = sum((cand & ref).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / sum(cand.values()), overlap / sum(ref.values())
    return 2 * precision * recall / (precision + recall)
