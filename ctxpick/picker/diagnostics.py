"""Is a picker reading its input, or answering the same thing whatever the question?

A picker that collapses to a constant (the same id set for most questions) or copies the
retriever's top-|S| prefix can still post a respectable evidence F1, because the pool is
ranked. These diagnostics make that visible: where its picks fall against where the gold
passages are, how many distinct sets it uses, how often it copies the prefix, and its
evidence F1 against two controls built from its own picks -- a random subset of the same size
from the same shown passages, and its most frequent id set used for every question.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

# A picker is flagged as copying when this share of its valid picks is the top-|S| prefix.
PREFIX_FLAG = 0.9


@dataclass(frozen=True)
class PickRecord:
    ids: tuple[int, ...] | None  # 1-based positions picked; None: the output did not parse
    shown: int  # passages shown
    gold: tuple[int, ...] | None  # 1-based positions of the gold evidence among those shown
    fallback: tuple[int, ...] = ()  # 1-based positions the fallback sent when ids is None


def set_f1(picked: Sequence[int], gold: Sequence[int]) -> float:
    hit = len(set(picked) & set(gold))
    if not hit:
        return 0.0
    p, r = hit / len(set(picked)), hit / len(set(gold))
    return 2 * p * r / (p + r)


@dataclass(frozen=True)
class Diagnostics:
    n: int
    valid: float
    distinct_sets: float  # distinct id sets / valid picks
    top_set: tuple[int, ...]
    top_set_share: float
    prefix_share: float  # valid picks that are exactly {1..|S|}
    picked_by_position: list[float]  # share of valid picks holding position i (1..max shown)
    gold_by_position: list[float]  # share of gold-annotated questions with gold at position i
    f1: list[float]  # per question with gold: the evidence F1 of what was sent (invalid: fallback)
    random_f1: list[float]  # the same questions: a random subset of the picker's size
    constant_f1: list[float]  # the same questions: the most frequent set, cut to the pool

    def flag(self, beats_random: bool, beats_constant: bool) -> str:
        """Empty when the picker reads its input; otherwise what is wrong."""
        reasons = []
        if self.prefix_share >= PREFIX_FLAG:
            reasons.append(f"copies the retriever's top-|S| in {self.prefix_share:.0%}")
        if self.f1 and not beats_random:
            reasons.append("not above random")
        if self.f1 and not beats_constant:
            reasons.append("not above its constant set")
        return "; ".join(reasons)


def diagnose(records: Sequence[PickRecord], seed: int = 0) -> Diagnostics:
    rng = random.Random(seed)
    valid = [r for r in records if r.ids is not None]
    sets = Counter(tuple(sorted(r.ids)) for r in valid)  # type: ignore[arg-type]
    top_set, top_count = sets.most_common(1)[0] if sets else ((), 0)
    width = max((r.shown for r in records), default=0)
    picked = [0] * width
    for r in valid:
        for i in r.ids or ():
            picked[i - 1] += 1
    with_gold = [r for r in records if r.gold]
    gold = [0] * width
    for r in with_gold:
        for i in r.gold or ():
            gold[i - 1] += 1
    f1, rand, const = [], [], []
    for r in with_gold:
        ids = r.ids if r.ids is not None else r.fallback
        f1.append(set_f1(ids, r.gold or ()))
        size = min(len(ids), r.shown)
        rand.append(set_f1(rng.sample(range(1, r.shown + 1), size), r.gold or ()))
        const.append(set_f1([i for i in top_set if i <= r.shown], r.gold or ()))
    return Diagnostics(
        n=len(records),
        valid=len(valid) / len(records) if records else 0.0,
        distinct_sets=len(sets) / len(valid) if valid else 0.0,
        top_set=top_set,
        top_set_share=top_count / len(valid) if valid else 0.0,
        prefix_share=(
            sum(bool(r.ids) and set(r.ids) == set(range(1, len(r.ids) + 1)) for r in valid)
            / len(valid)
            if valid
            else 0.0
        ),
        picked_by_position=[c / len(valid) if valid else 0.0 for c in picked],
        gold_by_position=[c / len(with_gold) if with_gold else 0.0 for c in gold],
        f1=f1,
        random_f1=rand,
        constant_f1=const,
    )
