"""Summary of a mined dataset and its agreement with human gold evidence."""

from __future__ import annotations

from collections import defaultdict
from statistics import mean
from typing import Any

from ctxpick.table import markdown_table


def _agreement(rec: dict[str, Any]) -> tuple[float, float] | None:
    if not rec["kept"] or rec["human_gold"] is None or not rec["human_gold_total"]:
        return None
    mined, gold = set(rec["gold_minimal"]), set(rec["human_gold"])
    hit = len(mined & gold)
    # Recall against all annotated gold passages, also those the pool missed.
    return hit / max(len(mined), 1), hit / rec["human_gold_total"]


def summarize(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        by[rec["dataset"]].append(rec)
        by["all"].append(rec)
    out = {}
    for name, recs in by.items():
        kept = [r for r in recs if r["kept"]]
        agree = [a for a in map(_agreement, recs) if a is not None]
        out[name] = {
            "examples": len(recs),
            "kept": len(kept),
            "kept_rate": len(kept) / len(recs),
            "mean_gold_size": mean(len(r["gold_minimal"]) for r in kept) if kept else None,
            "calls_per_example": mean(r["stats"]["calls"] for r in recs),
            "seconds_per_example": mean(r["stats"]["seconds"] for r in recs),
            "with_human_gold": len(agree),
            "precision_vs_human": mean(a[0] for a in agree) if agree else None,
            "recall_vs_human": mean(a[1] for a in agree) if agree else None,
        }
    return out


def render(summary: dict[str, dict[str, Any]]) -> str:
    def fmt(v: Any, pct: bool = False) -> str:
        if v is None:
            return "n/a"
        return f"{100 * v:.1f}%" if pct else (f"{v:.2f}" if isinstance(v, float) else str(v))

    head = [
        "dataset",
        "examples",
        "kept",
        "kept rate",
        "mean size of S_gold",
        "calls/example",
        "s/example",
        "with human gold",
        "precision vs human",
        "recall vs human",
    ]
    rows = [head]
    for name, s in sorted(summary.items(), key=lambda kv: (kv[0] == "all", kv[0])):
        rows.append(
            [
                name,
                fmt(s["examples"]),
                fmt(s["kept"]),
                fmt(s["kept_rate"], True),
                fmt(s["mean_gold_size"]),
                fmt(s["calls_per_example"]),
                fmt(s["seconds_per_example"]),
                fmt(s["with_human_gold"]),
                fmt(s["precision_vs_human"], True),
                fmt(s["recall_vs_human"], True),
            ]
        )
    return markdown_table(rows)
