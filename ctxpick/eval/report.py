"""Evaluation report: per-method aggregates, the Table-1-shaped markdown table with context-size
columns, the tables with confidence intervals and the pickers' collapse diagnostics."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

from ctxpick.eval.averaging import Averaging
from ctxpick.eval.methods import matched_picker
from ctxpick.eval.stats import Estimate, bootstrap_mean, stratified_mean
from ctxpick.picker.diagnostics import PREFIX_FLAG
from ctxpick.table import markdown_table

PREFIX_PERCENT = round(100 * PREFIX_FLAG)


@dataclass
class MethodResult:
    dataset: str
    method: str
    questions: int
    accuracy: float  # judged
    em: float
    f1: float
    evidence_recall: float | None  # against human gold, where the dataset has it
    evidence_precision: float | None
    passages: float  # mean passages sent to the generator
    context_tokens: float  # mean tokens of those passages (generator tokenizer)
    prompt_tokens: float  # mean tokens of the whole generator prompt
    select_s: float  # mean seconds per question: retrieval + selection
    generate_s: float
    judge_s: float
    budget_cut: float  # fraction of questions whose selection the token budget cut
    # pickers: fraction of questions whose output did not parse, so the fallback decided
    fallback_rate: float | None = None
    evidence_f1: float | None = None
    # 95% bootstrap intervals [lo, hi] (ctxpick/eval/stats.py)
    accuracy_ci: tuple[float, float] = (0.0, 0.0)
    evidence_f1_ci: tuple[float, float] | None = None
    context_tokens_ci: tuple[float, float] = (0.0, 0.0)


def _mean_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return mean(present) if present else None


def evidence_f1(rec: dict[str, Any]) -> float | None:
    """Evidence F1 of one record against the human gold (None where there is no gold)."""
    recall, precision = rec.get("evidence_recall"), rec.get("evidence_precision")
    if recall is None:
        return None
    if not precision or not recall:
        return 0.0
    return 2 * precision * recall / (precision + recall)


# Per-question values behind each metric with an interval.
METRICS = {
    "accuracy": lambda r: float(r["correct"]),
    "evidence_f1": evidence_f1,
    "evidence_recall": lambda r: r.get("evidence_recall"),
    "evidence_precision": lambda r: r.get("evidence_precision"),
    "context_tokens": lambda r: float(r["context_tokens"]),
}


def metric_values(rs: list[dict[str, Any]], metric: str) -> list[float]:
    """``metric``'s per-question values in ``rs``, without the questions that lack it."""
    return [v for v in map(METRICS[metric], rs) if v is not None]


def _ci(rs: list[dict[str, Any]], metric: str) -> tuple[float, float] | None:
    values = metric_values(rs, metric)
    if not values:
        return None
    e = bootstrap_mean(values)
    return (e.lo, e.hi)


def aggregate(
    records: list[dict[str, Any]], timings: dict[tuple[str, str], dict[str, float]]
) -> list[MethodResult]:
    """``records``: one per (question, method), as written to ``examples.jsonl``."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["dataset"], r["method"])].append(r)
    out = []
    for (dataset, method), rs in groups.items():
        t = timings.get((dataset, method), {})
        n = len(rs)
        picks = [r["pick_valid"] for r in rs if "pick_valid" in r]
        out.append(
            MethodResult(
                dataset=dataset,
                method=method,
                questions=n,
                accuracy=mean(float(r["correct"]) for r in rs),
                em=mean(float(r["em"]) for r in rs),
                f1=mean(r["f1"] for r in rs),
                evidence_recall=_mean_or_none([r["evidence_recall"] for r in rs]),
                evidence_precision=_mean_or_none([r["evidence_precision"] for r in rs]),
                passages=mean(r["passages"] for r in rs),
                context_tokens=mean(r["context_tokens"] for r in rs),
                prompt_tokens=mean(r["prompt_tokens"] for r in rs),
                select_s=mean(r["select_s"] for r in rs),
                generate_s=t.get("generate", 0.0) / n,
                judge_s=t.get("judge", 0.0) / n,
                budget_cut=mean(float(r["budget_cut"]) for r in rs),
                fallback_rate=1 - mean(map(float, picks)) if picks else None,
                evidence_f1=_mean_or_none([evidence_f1(r) for r in rs]),
                accuracy_ci=_ci(rs, "accuracy"),
                evidence_f1_ci=_ci(rs, "evidence_f1"),
                context_tokens_ci=_ci(rs, "context_tokens"),
            )
        )
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def main_table(
    results: list[MethodResult], methods: list[str], flags: dict[str, str] | None = None
) -> str:
    """Table 1 of the paper (judged accuracy per dataset) with the context each method sends:
    per dataset, accuracy (%) and mean context tokens; then the averages over the datasets
    every method has (the note under the table names them), and for a picker the share of
    questions its fallback decided. A method in ``flags`` (a collapsed or copying picker) is
    marked ``(!)``."""
    datasets = sorted({r.dataset for r in results})
    by = {(r.dataset, r.method): r for r in results}
    avg = Averaging.of(set(by), methods)
    header = ["method"]
    for d in datasets:
        header += [f"{d} acc", f"{d} tok"]
    header += ["avg acc", "avg tok", "avg passages", "fallback %"]
    rows = [header]
    for m in methods:
        if m not in avg.present:
            continue
        row = [f"{m} (!)" if (flags or {}).get(m) else m]
        for c in (by.get((d, m)) for d in datasets):
            row += ["-", "-"] if c is None else [_pct(c.accuracy), f"{c.context_tokens:.0f}"]
        over = [by[(d, m)] for d in avg.over(m)]
        rates = [c.fallback_rate for c in over if c.fallback_rate is not None]
        row += (
            [
                _pct(mean(c.accuracy for c in over)),
                f"{mean(c.context_tokens for c in over):.0f}",
                f"{mean(c.passages for c in over):.1f}",
            ]
            if over
            else ["-", "-", "-"]
        )
        row.append(_pct(mean(rates)) if rates else "-")
        rows.append(row)
    return f"{markdown_table(rows)}\n\n{avg.note()}"


def detail_table(results: list[MethodResult]) -> str:
    header = [
        "dataset",
        "method",
        "n",
        "acc %",
        "EM %",
        "F1",
        "ev. recall %",
        "ev. precision %",
        "passages",
        "context tok",
        "prompt tok",
        "select s/q",
        "generate s/q",
        "judge s/q",
        "budget cut %",
        "fallback %",
    ]
    rows = [header]
    for r in sorted(results, key=lambda r: (r.dataset, r.method)):
        rows.append(
            [
                r.dataset,
                r.method,
                str(r.questions),
                _pct(r.accuracy),
                _pct(r.em),
                f"{100 * r.f1:.1f}",
                _pct(r.evidence_recall),
                _pct(r.evidence_precision),
                f"{r.passages:.1f}",
                f"{r.context_tokens:.0f}",
                f"{r.prompt_tokens:.0f}",
                f"{r.select_s:.3f}",
                f"{r.generate_s:.3f}",
                f"{r.judge_s:.3f}",
                _pct(r.budget_cut),
                _pct(r.fallback_rate),
            ]
        )
    return markdown_table(rows)


def _interval_cell(e: Estimate | None, scale: float = 100, digits: int = 1) -> str:
    if e is None:
        return "n/a"
    mean, lo, hi = (rounded(scale * x, digits, sign=False) for x in (e.mean, e.lo, e.hi))
    return f"{mean} [{lo}, {hi}]"


def estimate(groups: list[list[float]]) -> Estimate | None:
    """One dataset: its bootstrap; several: the average over datasets, stratified."""
    groups = [g for g in groups if g]
    if not groups:
        return None
    return bootstrap_mean(groups[0]) if len(groups) == 1 else stratified_mean(groups)


def ci_table(records: list[dict[str, Any]], methods: list[str]) -> str:
    """Per dataset and method, and on the average over datasets (each dataset resampled on
    its own): judged accuracy, evidence F1, recall and precision (%), and context tokens,
    each with its 95% bootstrap interval, and the number of questions it rests on."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by[(r["dataset"], r["method"])].append(r)
    datasets = sorted({d for d, _ in by})
    avg = Averaging.of(set(by), methods)
    rows = [["dataset", "method", "n", "acc %", "ev. F1 %", "ev. recall %", "ev. prec. %", "tok"]]
    for d in [*datasets, "average"]:
        for m in methods:
            groups = [
                by[(x, m)] for x in (avg.over(m) if d == "average" else [d]) if by.get((x, m))
            ]
            if not groups:
                continue
            cells = [estimate([metric_values(g, metric) for g in groups]) for metric in METRICS]
            rows.append(
                [d, m, str(sum(map(len, groups)))]
                + [_interval_cell(e) for e in cells[:-1]]
                + [_interval_cell(cells[-1], scale=1, digits=0)]
            )
    return f"{markdown_table(rows)}\n\n{avg.note()}"


def ablation_table(records: list[dict[str, Any]], variants: dict[str, str]) -> str:
    """The paper's ablation layout: one row per variant (``variants``: method label -> row
    name), judged accuracy per dataset and on the average, then the average evidence F1 and
    context tokens; every cell with its 95% bootstrap interval."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by[(r["dataset"], r["method"])].append(r)
    datasets = sorted({d for d, _ in by})
    avg = Averaging.of(set(by), list(variants))
    rows = [["variant", "n", *(f"{d} acc %" for d in datasets), "avg acc %", "avg ev. F1 %", "tok"]]
    for label, name in variants.items():
        if label not in avg.present:
            continue
        groups = [by.get((d, label), []) for d in datasets]
        over = [by[(d, label)] for d in avg.over(label)]
        acc = [estimate([metric_values(g, "accuracy")]) for g in groups]
        means = [estimate([metric_values(g, m) for g in over]) for m in ("accuracy", "evidence_f1")]
        tokens = estimate([metric_values(g, "context_tokens") for g in over])
        rows.append(
            [name, str(sum(map(len, groups)))]
            + [_interval_cell(e) for e in [*acc, *means]]
            + [_interval_cell(tokens, scale=1, digits=0)]
        )
    return f"{markdown_table(rows)}\n\n{avg.note()}"


def _paired(pairs: list[tuple[dict[str, Any], dict[str, Any]]], metric: str) -> list[float]:
    """Per-question differences (first - second) where both have the metric."""
    f = METRICS[metric]
    return [f(x) - f(y) for x, y in pairs if f(x) is not None and f(y) is not None]


# The paired metrics: each one's name in a table, and its scale and digits as printed.
PAIRED = {
    "accuracy": ("acc %", 100, 1),
    "evidence_f1": ("ev. F1 %", 100, 1),
    "context_tokens": ("tok", 1, 0),
}


def paired_estimates(
    records: list[dict[str, Any]], picker: str, baseline: str, over: list[str] | None = None
) -> dict[str, dict[str, Estimate | None]]:
    """``picker`` minus ``baseline`` on the questions both answered: per dataset and on the
    average ("average", each dataset resampled on its own), each metric of :data:`PAIRED` with
    its paired 95% bootstrap interval (the questions resampled together). The average is over
    ``over``, or every dataset they share; none where they lack one of ``over``. Empty where
    they share no question."""
    by = {(r["dataset"], r["method"], r["example_id"]): r for r in records}
    per_dataset = {}
    for d in sorted({r["dataset"] for r in records}):
        qs = sorted(q for (x, m, q) in by if x == d and m == picker and (d, baseline, q) in by)
        if qs:
            per_dataset[d] = [(by[(d, picker, q)], by[(d, baseline, q)]) for q in qs]
    out = {}
    for d, chosen in per_dataset.items():
        out[d] = {m: estimate([_paired(chosen, m)]) for m in PAIRED}
    averaged = list(per_dataset) if over is None else over
    if per_dataset and set(averaged) <= set(per_dataset):
        chosen = [per_dataset[d] for d in averaged]
        out["average"] = {m: estimate([_paired(pairs, m) for pairs in chosen]) for m in PAIRED}
    return out


def paired_cell(e: Estimate | None, metric: str, interval: bool = True) -> str:
    """A paired difference as printed: mean [lo, hi] (or the mean alone), * where the interval
    excludes 0."""
    _, scale, digits = PAIRED[metric]
    if e is None:
        return "n/a"
    mark = "*" if e.excludes_zero() else ""
    return (
        _interval_cell(e, scale, digits) if interval else rounded(scale * e.mean, digits)
    ) + mark


def rounded(x: float, digits: int, sign: bool = True) -> str:
    """``x`` to ``digits`` places, with its sign unless ``sign`` is false, never "-0" for a
    value that rounds to zero."""
    return f"{round(x, digits) or 0.0:{'+' if sign else ''}.{digits}f}"


def paired_table(records: list[dict[str, Any]], pickers: list[str], baselines: list[str]) -> str:
    """Each picker against each baseline (:func:`paired_estimates`): the mean difference
    (picker - baseline) in judged accuracy, evidence F1 and context tokens, per dataset and on
    the average over datasets. A * marks an interval that excludes 0."""
    rows = [
        ["picker", "baseline", "dataset", "n", *(f"Δ {name}" for name, _, _ in PAIRED.values())]
    ]
    # A matched row takes one picker's set sizes: it is that picker's control only.
    for p in pickers:
        for b in baselines:
            if matched_picker(b) not in (None, p.removeprefix("picker:")):
                continue
            for d, cells in paired_estimates(records, p, b).items():
                n = str(cells["accuracy"].n if cells["accuracy"] else 0)
                rows.append([p, b, d, n, *(paired_cell(cells[m], m) for m in PAIRED)])
    return markdown_table(rows)


def _above(values: list[float], control: list[float]) -> bool:
    """The paired 95% interval of ``values - control`` lies above 0."""
    diff = [a - b for a, b in zip(values, control, strict=True)]
    return bool(diff) and bootstrap_mean(diff).lo > 0


def picker_diagnostics(
    records: list[dict[str, Any]], pickers: list[str]
) -> tuple[str, dict[str, str]]:
    """The collapse section of the report (see :mod:`ctxpick.picker.diagnostics`) and each
    flagged picker's reason. Controls: a random subset of the picker's size from the same
    shown passages, and the picker's most frequent id set for every question; "beats" means
    the paired 95% interval of the evidence-F1 difference lies above 0."""
    from ctxpick.picker.diagnostics import PickRecord, diagnose

    if not pickers:
        return "", {}
    rows = [
        [
            "picker",
            "n",
            "valid %",
            "distinct sets %",
            "most frequent set",
            "top-|S| prefix %",
            "ev. F1 %",
            "random ev. F1 %",
            "constant ev. F1 %",
            "flag",
        ]
    ]
    positions, flags = [], {}
    for label in pickers:
        picks = []
        for r in records:
            if r["method"] != label or "shown_pids" not in r:
                continue
            shown, gold = r["shown_pids"], set(r.get("gold_pids") or ())
            picks.append(
                PickRecord(
                    tuple(r["pick_ids"]) if r.get("pick_ids") is not None else None,
                    len(shown),
                    tuple(i for i, pid in enumerate(shown, 1) if pid in gold) if gold else None,
                    tuple(r.get("fallback_ids") or ()),
                )
            )
        if not picks:
            continue
        d = diagnose(picks)
        flag = d.flag(_above(d.f1, d.random_f1), _above(d.f1, d.constant_f1))
        if flag:
            flags[label] = flag
        f1s = [bootstrap_mean(x) if x else None for x in (d.f1, d.random_f1, d.constant_f1)]
        rows.append(
            [
                label,
                str(d.n),
                f"{100 * d.valid:.0f}",
                f"{100 * d.distinct_sets:.0f}",
                f"{list(d.top_set)} ({100 * d.top_set_share:.0f}%)",
                f"{100 * d.prefix_share:.0f}",
                *(_interval_cell(e) for e in f1s),
                flag or "ok",
            ]
        )
        picked = " ".join(f"{100 * x:.0f}" for x in d.picked_by_position)
        gold = " ".join(f"{100 * x:.0f}" for x in d.gold_by_position)
        positions.append(f"- `{label}` picks (% of valid picks holding position 1..N): {picked}")
        positions.append(f"  gold (% of questions with gold at position 1..N): {gold}")
    text = (
        "## Is each picker reading its input?\n\n"
        "Evidence F1 (%) over the questions with gold evidence, against two controls built from "
        "the picker's own picks: a random subset of the same size from the same shown passages, "
        "and its most frequent id set for every question. A picker whose paired interval does "
        "not lie above a control, or that copies the retriever's top-|S| in at least "
        f"{PREFIX_PERCENT}% of its picks, is flagged, and marked (!) in the main table.\n\n"
        f"{markdown_table(rows)}\n\n" + "\n".join(positions)
    )
    return text, flags


def write_report(
    path: Path,
    header: str,
    records: list[dict[str, Any]],
    results: list[MethodResult],
    labels: list[str],
) -> tuple[str, str]:
    """``report.md``: the main table, the same with confidence intervals, the pickers'
    collapse diagnostics, pickers against baselines (paired), and the details. Returns the
    main table and the interval table, for the console."""
    pickers = [m for m in labels if m.startswith("picker:")]
    baselines = [m for m in labels if not m.startswith("picker:") and m != "oracle"]
    diagnostics, flags = picker_diagnostics(records, pickers)
    table, with_ci = main_table(results, labels, flags), ci_table(records, labels)
    paired = paired_table(records, pickers, baselines) if pickers else "(no picker evaluated)"
    path.write_text(
        f"# ctxpick evaluation\n\n{header}\n"
        "acc = judged answer accuracy (%), tok = mean context tokens sent to the generator, "
        "fallback % = a picker's questions whose output did not parse, where the fallback "
        "chose (as the service does).\n\n"
        f"{table}\n\n## With 95% confidence intervals\n\n"
        "Percentile bootstrap over questions (2000 resamples); `n` is how many questions a row "
        "rests on; the average resamples each dataset on its own. Evidence metrics are against "
        "the human gold evidence, where a dataset has it.\n\n"
        f"{with_ci}\n\n{diagnostics}\n\n"
        "## Pickers against baselines (paired)\n\n"
        "Mean difference picker - baseline over the questions both answered, with the paired "
        "bootstrap 95% interval; * marks an interval that excludes 0.\n\n"
        f"{paired}\n\n## Details\n\n{detail_table(results)}\n",
        encoding="utf-8",
    )
    return table, with_ci
