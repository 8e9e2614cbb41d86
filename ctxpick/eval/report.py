"""Evaluation report: per-method aggregates, the Table-1-shaped markdown table with context-size
columns, and an accuracy-vs-tokens plot per dataset."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

from ctxpick.table import markdown_table


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
    invalid_picks: float | None = None  # pickers: fraction of outputs that did not parse


def _mean_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return mean(present) if present else None


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
                invalid_picks=1 - mean(map(float, picks)) if picks else None,
            )
        )
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def main_table(results: list[MethodResult], methods: list[str]) -> str:
    """Table 1 of the paper (judged accuracy per dataset) with the context each method sends:
    per dataset, accuracy (%) and mean context tokens; then the averages."""
    datasets = sorted({r.dataset for r in results})
    by = {(r.dataset, r.method): r for r in results}
    header = ["method"]
    for d in datasets:
        header += [f"{d} acc", f"{d} tok"]
    header += ["avg acc", "avg tok", "avg passages"]
    rows = [header]
    for m in methods:
        cells = [by.get((d, m)) for d in datasets]
        if not any(cells):
            continue
        row = [m]
        for c in cells:
            row += ["-", "-"] if c is None else [_pct(c.accuracy), f"{c.context_tokens:.0f}"]
        present = [c for c in cells if c is not None]
        row += [
            _pct(mean(c.accuracy for c in present)),
            f"{mean(c.context_tokens for c in present):.0f}",
            f"{mean(c.passages for c in present):.1f}",
        ]
        rows.append(row)
    return markdown_table(rows)


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
        "invalid picks %",
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
                _pct(r.invalid_picks),
            ]
        )
    return markdown_table(rows)


def plot_accuracy_vs_tokens(results: list[MethodResult], out_dir: Path) -> list[Path]:
    """One PNG per dataset: judged accuracy against mean context tokens, one point per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for dataset in sorted({r.dataset for r in results}):
        rs = [r for r in results if r.dataset == dataset]
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in rs:
            ax.scatter(r.context_tokens, 100 * r.accuracy, s=30)
            ax.annotate(
                r.method,
                (r.context_tokens, 100 * r.accuracy),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
        ax.set_xlabel("mean context tokens sent to the generator")
        ax.set_ylabel("judged accuracy (%)")
        ax.set_title(f"{dataset}: accuracy vs context ({rs[0].questions} questions)")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / f"accuracy_vs_tokens_{dataset}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths
