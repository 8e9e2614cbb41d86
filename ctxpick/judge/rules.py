"""Deterministic answer judges: normalised exact match, token F1, alias containment, and
"not answerable" detection (LoCoMo category 5, unanswerable MuSiQue)."""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
_ABSTAIN = re.compile(
    r"\b(not (mentioned|stated|specified|provided|given|available|known|answerable)|"
    r"no (information|mention|answer)|unknown|cannot (be )?(determined|answered)|"
    r"(does|do) not (say|mention|specify)|doesn't (say|mention)|unanswerable)\b"
)


def normalize(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation or articles, single spaces."""
    text = _ARTICLES.sub(" ", str(text).lower().translate(_PUNCT))
    return " ".join(text.split())


def exact_match(prediction: str, answers: list[str]) -> bool:
    pred = normalize(prediction)
    return any(pred == normalize(a) for a in answers)


def token_f1(prediction: str, answers: list[str]) -> float:
    pred = normalize(prediction).split()
    best = 0.0
    for answer in answers:
        gold = normalize(answer).split()
        common = sum((Counter(pred) & Counter(gold)).values())
        if common:
            p, r = common / len(pred), common / len(gold)
            best = max(best, 2 * p * r / (p + r))
    return best


def contains_answer(prediction: str, answers: list[str]) -> bool:
    """A gold answer (or alias) appears as whole words inside the prediction."""
    pred = f" {normalize(prediction)} "
    return any(norm and f" {norm} " in pred for norm in map(normalize, answers))


def abstains(prediction: str) -> bool:
    return bool(_ABSTAIN.search(str(prediction).lower()))


def rule_judge(prediction: str, answers: list[str], unanswerable: bool = False) -> bool:
    """Binary verdict from the deterministic rules alone."""
    if unanswerable:
        return abstains(prediction)
    if abstains(prediction) and not contains_answer(prediction, answers):
        return False
    return exact_match(prediction, answers) or contains_answer(prediction, answers)
