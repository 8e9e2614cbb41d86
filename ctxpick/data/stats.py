"""Counts for a dataset file: what ``ctxpick data stats`` prints."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ctxpick.data.loaders import LoadResult


@dataclass
class DataStats:
    path: str
    format: str
    records: int
    questions: int
    rejects: int
    documents: int
    corpora: int
    with_gold: int
    gold_complete: int
    gold_units: Counter = field(default_factory=Counter)
    datasets: Counter = field(default_factory=Counter)
    reject_examples: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [
            f"file            {self.path}",
            f"format          {self.format}",
            f"records read    {self.records}",
            f"questions       {self.questions}",
            f"rejects         {self.rejects}",
            f"passages        {self.documents} source units in {self.corpora} corpora "
            f"({self.documents / max(self.corpora, 1):.1f} per corpus)",
            f"gold evidence   {self.with_gold} questions annotated, {self.gold_complete} with "
            "every gold unit resolved in the context",
        ]
        if self.gold_units:
            hist = ", ".join(f"{k}: {v}" for k, v in sorted(self.gold_units.items()))
            lines.append(f"gold units/q    {hist}")
        for r in self.reject_examples:
            lines.append(f"  reject: {r}")
        if self.rejects > len(self.reject_examples):
            lines.append(f"  ... and {self.rejects - len(self.reject_examples)} more rejects")
        return "\n".join(lines)


def compute_stats(result: LoadResult, show_rejects: int = 10) -> DataStats:
    exs = result.examples
    # LoCoMo questions share their conversation's turns: count each corpus once.
    corpora = {ex.corpus_id: len(ex.documents) for ex in exs}
    return DataStats(
        path=result.path,
        format=result.format,
        records=result.records,
        questions=len(exs),
        rejects=len(result.rejects),
        documents=sum(corpora.values()),
        corpora=len(corpora),
        with_gold=sum(ex.evidence is not None for ex in exs),
        gold_complete=sum(ex.gold_complete for ex in exs),
        gold_units=Counter(ex.gold_units for ex in exs if ex.evidence is not None),
        datasets=Counter(ex.dataset for ex in exs),
        reject_examples=[str(r) for r in result.rejects[:show_rejects]],
    )
