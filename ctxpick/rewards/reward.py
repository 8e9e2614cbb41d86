"""The picker's reward (paper Eq. 8), in the two readings the equation admits.

``coverage = |S ∩ S_gold| / |S_gold|``; ``over = max(0, |S| - |S_gold|)``; ``m`` is the
redundancy margin red_i and ``γ`` its weight.

* ``printed`` -- Eq. 8 as printed: ``coverage - γ·max(0, |S| - |S_gold| - m)`` when
  ``|S| <= |S_gold| + m``, else 0. Inside its own branch the max is always 0, so this is plain
  coverage up to the margin and nothing beyond it.
* ``described`` -- the behaviour the text describes: a penalty proportional to over-selection,
  ``coverage - γ·over/m`` (``over/1`` when m = 0), and 0 once ``over > m``.

Worked example, ``|S_gold| = 2``, ``m = 3``, ``γ = 0.5``, S covers both gold passages:

====  ====  ========  ==================  ========
|S|   over  coverage  printed             described
====  ====  ========  ==================  ========
2     0     1.0       1.0                 1.0
4     2     1.0       1.0                 1 - 0.5·2/3 = 0.667
5     3     1.0       1.0                 1 - 0.5·3/3 = 0.5
6     4     1.0       0 (beyond margin)   0
====  ====  ========  ==================  ========

Under ``printed`` a picker gains nothing by dropping a redundant passage until it crosses the
margin; ``described`` rewards every passage dropped, which is what Stage II's compression is
for. ``described`` is the default. Any output that fails :func:`~ctxpick.picker.format.parse_pick`
gets the format penalty (-1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ctxpick.picker.format import InvalidPick, parse_pick

EQ8_READINGS = ("described", "printed")


@dataclass(frozen=True)
class RewardSpec:
    margin: int
    gamma: float
    eq8: str = "described"
    format_penalty: float = -1.0

    def __post_init__(self) -> None:
        if self.eq8 not in EQ8_READINGS:
            raise ValueError(f"eq8 must be one of {EQ8_READINGS}, not {self.eq8!r}")
        if self.margin < 0 or not 0 <= self.gamma <= 1:
            raise ValueError("reward needs margin >= 0 and gamma in [0, 1]")


@dataclass(frozen=True)
class RewardTerms:
    reward: float
    coverage: float  # |S ∩ S_gold| / |S_gold| (0 for an invalid output)
    penalty: float  # the redundancy term subtracted (0 beyond the margin, where reward is 0)
    format_ok: bool
    size: int  # |S|
    over_margin: bool  # |S| > |S_gold| + m
    reason: str = ""  # why the output is invalid
    timed_out: bool = False


def set_reward(selected: Sequence[int], gold: Sequence[int], spec: RewardSpec) -> RewardTerms:
    """Reward of a valid selection against the mined minimal set."""
    s, g = set(selected), set(gold)
    coverage = len(s & g) / len(g) if g else float(not s)
    over = max(0, len(s) - len(g))
    if over > spec.margin:
        return RewardTerms(0.0, coverage, 0.0, True, len(s), True)
    if spec.eq8 == "printed":
        penalty = spec.gamma * max(0, len(s) - len(g) - spec.margin)
    else:
        penalty = spec.gamma * over / max(spec.margin, 1)
    return RewardTerms(coverage - penalty, coverage, penalty, True, len(s), False)


def score_output(
    text: str, num_passages: int, gold: Sequence[int], spec: RewardSpec
) -> RewardTerms:
    try:
        pick = parse_pick(text, num_passages)
    except InvalidPick as err:
        return RewardTerms(spec.format_penalty, 0.0, 0.0, False, 0, False, str(err))
    return set_reward(pick.ids, gold, spec)
