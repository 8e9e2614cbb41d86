"""Prompt groups that carry signal (DAPO's dynamic sampling). GRPO's advantages are rewards
relative to their group: a group whose samples all earn the same reward has every advantage
zero and adds no gradient. Their share is logged every step (when it nears 1 the policy has
collapsed onto one answer per prompt); with ``rl.dynamic_sampling`` such groups are dropped
and more prompts drawn in their place."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def carries_signal(rewards: Sequence[float]) -> bool:
    """Not all equal: some advantage of the group is non-zero."""
    return len(set(rewards)) > 1


def zero_variance_share(signal: Sequence[bool]) -> float:
    """The share of groups without signal."""
    return 1 - sum(signal) / len(signal) if signal else 0.0


def draw_signal_groups(
    draw: Callable[[int, int], list[T]], signal: Callable[[T], bool], want: int, cap: int
) -> tuple[list[T], list[T]]:
    """``draw(n, d)`` samples and scores ``n`` more prompt groups (``d``: which draw of the
    step, so each draws its own samples). Groups without signal are dropped and the shortfall
    drawn again, until ``want`` groups carry signal or ``cap`` prompts have been drawn.
    Returns the groups to train on, in draw order, and every group drawn. If none carries
    signal the first draw is trained on as it is: a zero policy gradient, as without dynamic
    sampling."""
    drawn = draw(want, 0)
    kept = [g for g in drawn if signal(g)]
    draws = 1
    while len(kept) < want and len(drawn) < cap:
        more = draw(min(want - len(kept), cap - len(drawn)), draws)
        draws += 1
        drawn += more
        kept += [g for g in more if signal(g)]
    return kept or drawn[:want], drawn
