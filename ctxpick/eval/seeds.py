"""Independent runs of one recipe (different seeds) side by side, from one evaluation's
records: each run's averages and its paired differences against each baseline, then the mean,
standard deviation and range over the runs. One run's bootstrap interval is over questions;
this is the spread over training runs, which it does not show."""

from __future__ import annotations

from collections import defaultdict
from statistics import mean, stdev
from typing import Any

from ctxpick.eval.averaging import Averaging
from ctxpick.eval.methods import matched_picker
from ctxpick.eval.report import (
    PAIRED,
    estimate,
    metric_values,
    paired_cell,
    paired_estimates,
    rounded,
)
from ctxpick.table import markdown_table


def _summary(values: list[float | None], digits: int, sign: bool) -> list[str]:
    """Mean, standard deviation and range over the runs; n/a unless every run has a value."""
    if None in values:
        return ["n/a"] * 3
    lo, hi = rounded(min(values), digits, sign), rounded(max(values), digits, sign)
    return [rounded(mean(values), digits, sign), f"{stdev(values):.{digits}f}", f"{lo} – {hi}"]


def _check(runs: list[str], baselines: list[str], methods: set[str]) -> None:
    if len(runs) < 2 or len(set(runs)) < len(runs):
        raise ValueError(f"a spread needs at least 2 distinct runs, got {runs}")
    if missing := [m for m in [*runs, *baselines] if m not in methods]:
        raise ValueError(f"no records of {missing} (methods here: {sorted(methods)})")
    # A matched row takes one picker's set sizes: pairing the other runs with it is no control.
    if matched := [b for b in baselines if matched_picker(b) is not None]:
        raise ValueError(f"{matched} take one run's set sizes: pair each run with its own")


def seed_table(records: list[dict[str, Any]], runs: list[str], baselines: list[str]) -> str:
    """``runs``: the method labels of the runs (``picker:seed0``...); ``baselines``: labels to
    pair each run with. Rows: each metric, then each difference against each baseline, on the
    average over datasets (the same datasets for every row, as in the report) and per dataset;
    a * marks a run whose paired interval excludes 0."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by[(r["dataset"], r["method"])].append(r)
    _check(runs, baselines, {m for _, m in by})
    datasets = sorted({d for d, _ in by})
    avg = Averaging.of(set(by), [*runs, *baselines])
    rows = [["quantity", "dataset", *runs, "mean", "sd", "range"]]
    for metric, (name, scale, digits) in PAIRED.items():
        for d in ["average", *datasets]:
            ests = [
                estimate(
                    [
                        metric_values(by.get((x, r), []), metric)
                        for x in (avg.over(r) if d == "average" else [d])
                    ]
                )
                for r in runs
            ]
            points = [scale * e.mean if e else None for e in ests]
            cells = ["n/a" if p is None else rounded(p, digits, sign=False) for p in points]
            rows.append([name, d, *cells, *_summary(points, digits, sign=False)])
    for b in baselines:
        paired = [paired_estimates(records, r, b, over=avg.common) for r in runs]
        for metric, (name, scale, digits) in PAIRED.items():
            for d in ["average", *datasets]:
                ests = [p.get(d, {}).get(metric) for p in paired]
                cells = [paired_cell(e, metric, interval=False) for e in ests]
                points = [scale * e.mean if e else None for e in ests]
                rows.append([f"Δ {name} vs {b}", d, *cells, *_summary(points, digits, sign=True)])
    return f"{markdown_table(rows)}\n\n{avg.note()}"
