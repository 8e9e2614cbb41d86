"""Confidence intervals for evaluation numbers: percentile bootstrap over questions.

Every interval is a 95% percentile bootstrap (``n_boot`` resamples, seeded, so a report is
reproducible). An average over datasets resamples each dataset's questions on its own and
averages the per-dataset means (a stratified bootstrap: each dataset keeps its size). A paired
comparison is the bootstrap of the per-question differences over the questions both methods
answered (:func:`ctxpick.eval.report.paired_estimates`), so the pairing is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

N_BOOT = 2000


@dataclass(frozen=True)
class Estimate:
    mean: float
    lo: float
    hi: float
    n: int  # the questions it rests on

    def excludes_zero(self) -> bool:
        return self.lo > 0 or self.hi < 0


def _interval(samples: np.ndarray, alpha: float) -> tuple[float, float]:
    lo, hi = np.quantile(samples, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def bootstrap_mean(
    values: Sequence[float], n_boot: int = N_BOOT, seed: int = 0, alpha: float = 0.05
) -> Estimate:
    """Mean of ``values`` with its bootstrap interval."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("bootstrap of no values")
    idx = np.random.default_rng(seed).integers(0, x.size, size=(n_boot, x.size))
    return Estimate(float(x.mean()), *_interval(x[idx].mean(axis=1), alpha), int(x.size))


def stratified_mean(
    groups: Sequence[Sequence[float]], n_boot: int = N_BOOT, seed: int = 0, alpha: float = 0.05
) -> Estimate:
    """Mean of the group means (e.g. the average over datasets), each group resampled alone."""
    arrays = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not arrays:
        raise ValueError("bootstrap of no values")
    rng = np.random.default_rng(seed)
    boots = np.zeros(n_boot)
    for x in arrays:
        boots += x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    boots /= len(arrays)
    point = float(np.mean([x.mean() for x in arrays]))
    return Estimate(point, *_interval(boots, alpha), sum(x.size for x in arrays))
