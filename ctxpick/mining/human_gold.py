"""Mined-dataset records whose "mined" set is the dataset's own gold evidence: real questions
and passages in the format training reads, without a mining run in front of them (tests,
benchmarks, and a quick start where human evidence is trusted)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctxpick.data.schema import Pool


def human_gold_records(pools: Sequence[Pool], splits: Sequence[str]) -> list[dict[str, Any]]:
    """One record per pool; a pool holding none of its gold passages is not kept."""
    records = []
    for pool, split in zip(pools, splits, strict=False):
        in_pool = [p.pid for p in pool.passages if p.pid in (pool.gold_pids or [])]
        records.append(
            {
                "id": pool.example_id,
                "dataset": pool.dataset,
                "question": pool.question,
                "answers": pool.answers,
                "pool": [{"pid": p.pid, "title": p.title, "text": p.text} for p in pool.passages],
                "kept": bool(in_pool),
                "gold_minimal": in_pool,
                "human_gold": in_pool,
                "human_gold_total": len(pool.gold_pids or []),
                "rewrites": [],
                "split": split,
                "stats": {"miner": "human", "calls": 0, "seconds": 0.0},
            }
        )
    return records
