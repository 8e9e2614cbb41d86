"""Independent runs of one recipe (different seeds) side by side, from one evaluation's
records: each run's averages and its paired differences against each baseline, then the mean,
standard deviation and range over the runs. One run's bootstrap interval is over questions;
this is the spread over training runs, which it does not show."""

from __future__ import annotations

from collections import defaultdict
from statistics import mean, stdev
from typing import Any

from ctxpick.eval.averaging import Averaging
from ctxpick.eval.report import PAIRED, estimate, metric_values, paired_estimates
from ctxpick.table import markdown_table

NAMES = {"accuracy": "acc %", "evidence_f1": "ev. F1 %", "context_tokens": "tok"}


def _summary(values: list[float | None], scale: float, digits: int, sign: str = "") -> list[str]:
    """Mean, standard deviation and range over the runs; n/a unless every run has a value.
    ``sign``: "+" for differences."""
    if None in values:
        return ["n/a"] * 3
    xs = [scale * v for v in values]
    f = f"{sign}.{digits}f"
    return [f"{mean(xs):{f}}", f"{stdev(xs):.{digits}f}", f"{min(xs):{f}} – {max(xs):{f}}"]


def seed_table(records: list[dict[str, Any]], runs: list[str], baselines: list[str]) -> str:
    """``runs``: the method labels of the runs (``picker:seed0``...); ``baselines``: labels to
    pair each run with. Rows: each metric, then each difference against each baseline, on the
    average over datasets and per dataset; a * marks a run whose paired interval excludes 0."""
    if len(runs) < 2:
        raise ValueError(f"a spread needs at least 2 runs, got {runs}")
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by[(r["dataset"], r["method"])].append(r)
    if missing := [m for m in [*runs, *baselines] if not any(x == m for _, x in by)]:
        raise ValueError(f"no records of {missing} (methods here: {sorted({m for _, m in by})})")
    datasets = sorted({d for d, _ in by})
    avg = Averaging.of(set(by), runs)
    rows = [["quantity", "dataset", *runs, "mean", "sd", "range"]]
    for metric, (scale, digits) in PAIRED.items():
        for d in ["average", *datasets]:
            ests = [
                estimate([metric_values(by[(x, r)], metric) for x in avg.over(r)])
                if d == "average"
                else estimate([metric_values(by.get((d, r), []), metric)])
                for r in runs
            ]
            points = [e.mean if e else None for e in ests]
            cells = ["n/a" if p is None else f"{scale * p:.{digits}f}" for p in points]
            rows.append([NAMES[metric], d, *cells, *_summary(points, scale, digits)])
    for b in baselines:
        paired = [paired_estimates(records, r, b) for r in runs]
        for metric, (scale, digits) in PAIRED.items():
            for d in ["average", *datasets]:
                ests = [p.get(d, {}).get(metric) for p in paired]
                cells = [
                    "n/a" if e is None else f"{scale * e.mean:+.{digits}f}{'*' * e.excludes_zero()}"
                    for e in ests
                ]
                points = [e.mean if e else None for e in ests]
                name = f"Δ {NAMES[metric]} vs {b}"
                rows.append([name, d, *cells, *_summary(points, scale, digits, "+")])
    return f"{markdown_table(rows)}\n\n{avg.note()}"
