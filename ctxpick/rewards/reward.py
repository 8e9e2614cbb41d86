r"""The picker's reward (paper Eq. 8), in the two readings the equation admits.

``coverage = |S ∩ S_gold| / |S_gold|``; ``over = |S \ S_gold|``, the selected passages outside
the gold set; ``m`` is the redundancy margin red_i and ``γ`` its weight. Inside the margin
(``over <= m``):

* ``printed`` -- Eq. 8 as printed: ``coverage - γ·max(0, over - m)``. Inside its own branch the
  max is always 0, so this is plain coverage up to the margin.
* ``described`` -- the behaviour the text describes: a penalty proportional to over-selection,
  ``coverage - γ·over/m`` (``over/1`` when m = 0).

The paper writes over-selection as ``|S| - |S_gold|``. That equals ``|S \ S_gold|`` whenever S
holds all the gold, but not otherwise: with it, adding a gold passage to a selection that misses
some could push ``|S| - |S_gold|`` past the margin and *lower* the reward, which pays a
compressing picker to stop short of the gold on multi-hop questions. Counting the passages
outside the gold set makes the reward monotone both ways: a gold passage never lowers it, a
non-gold one never raises it (property-tested over every subset of 8 passages).

Beyond the margin the paper means "no reward for dumping the pool". A flat 0 does not say
that under ``described``: a small wrong pick inside the margin can score ``-γ``, so 0 would pay
the policy to dump every passage. Both readings therefore give a selection beyond the margin
the **floor**: the worst reward any valid selection inside the margin can get (``0`` for
``printed``, ``-γ`` for ``described``: no coverage, the whole margin used). And an invalid
output gets ``format_penalty``, which must lie strictly below that floor, so
``invalid < beyond margin <= every valid selection inside it``.

Worked example, ``|S_gold| = 2``, ``m = 3``, ``γ = 0.5``, S covers both gold passages:

====  ====  ========  ==================  ===================
|S|   over  coverage  printed             described
====  ====  ========  ==================  ===================
2     0     1.0       1.0                 1.0
4     2     1.0       1.0                 1 - 0.5·2/3 = 0.667
5     3     1.0       1.0                 1 - 0.5·3/3 = 0.5
6     4     1.0       0 (floor)           -0.5 (floor)
====  ====  ========  ==================  ===================

Under ``printed`` a picker gains nothing by dropping a redundant passage until it crosses the
margin; ``described`` rewards every passage dropped, which is what Stage II's compression is
for. Each stage names its reading (``stage.eq8``: Stage I ``printed``, recall; Stage II
``described``, compression).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ctxpick.picker.format import OUTPUT_FORMAT, InvalidPick, parse_pick

EQ8_READINGS = ("described", "printed")


@dataclass(frozen=True)
class RewardSpec:
    margin: int
    gamma: float
    eq8: str = "described"
    format_penalty: float = -1.0
    output_format: str = OUTPUT_FORMAT  # the picker's (ctxpick/picker/format.py)

    def __post_init__(self) -> None:
        if self.eq8 not in EQ8_READINGS:
            raise ValueError(f"eq8 must be one of {EQ8_READINGS}, not {self.eq8!r}")
        if self.margin < 0 or not 0 <= self.gamma <= 1:
            raise ValueError("reward needs margin >= 0 and gamma in [0, 1]")
        if not self.format_penalty < self.floor:
            raise ValueError(
                f"rewards.format_penalty={self.format_penalty} must be below the worst valid "
                f"reward ({self.floor} for eq8={self.eq8}, gamma={self.gamma}), or an invalid "
                "output would score as well as a valid one"
            )

    @property
    def floor(self) -> float:
        """The worst reward of a valid selection inside the margin, and so the reward of any
        selection beyond it."""
        return -self.gamma if self.eq8 == "described" and self.margin > 0 else 0.0


@dataclass(frozen=True)
class RewardTerms:
    reward: float
    coverage: float  # |S ∩ S_gold| / |S_gold| (0 for an invalid output)
    penalty: float  # coverage - reward for a valid output (beyond the margin: down to the floor)
    format_ok: bool
    size: int  # |S|
    over_margin: bool  # |S \ S_gold| > m
    reason: str = ""  # why the output is invalid
    timed_out: bool = False


def set_reward(selected: Sequence[int], gold: Sequence[int], spec: RewardSpec) -> RewardTerms:
    """Reward of a valid selection against the mined minimal set."""
    s, g = set(selected), set(gold)
    coverage = len(s & g) / len(g) if g else float(not s)
    over = len(s - g)
    if over > spec.margin:
        return RewardTerms(spec.floor, coverage, coverage - spec.floor, True, len(s), True)
    if spec.eq8 == "printed":
        penalty = spec.gamma * max(0, over - spec.margin)
    else:
        penalty = spec.gamma * over / max(spec.margin, 1)
    return RewardTerms(coverage - penalty, coverage, penalty, True, len(s), False)


def score_output(
    text: str, num_passages: int, gold: Sequence[int], spec: RewardSpec
) -> RewardTerms:
    try:
        pick = parse_pick(text, num_passages, spec.output_format)
    except InvalidPick as err:
        return RewardTerms(spec.format_penalty, 0.0, 0.0, False, 0, False, str(err))
    return set_reward(pick.ids, gold, spec)
