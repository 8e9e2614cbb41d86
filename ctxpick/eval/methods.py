"""Selection methods compared in evaluation. Each turns a retrieved question into the passages
the generator will read; the token budget then caps what any of them may send.

* ``none``       -- no retrieval: the generator answers from the question alone.
* ``bm25``       -- Top-K by BM25 over the question, for each K in ``eval.topk``.
* ``dense``      -- Top-K by cosine similarity of the bundled MiniLM embeddings.
* ``adaptive``   -- the inference pool cut at its retriever's largest score gap (a classic
  adaptive cutoff).
* ``full_pool``  -- the whole inference pool (top ``retrieval.pool.k`` by
  ``retrieval.pool.retriever``: BM25 or dense).
* ``oracle``     -- the human gold evidence (datasets that annotate it).
* ``picker``     -- each picker checkpoint in ``eval.pickers`` reading the inference pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ctxpick.data.schema import ChunkedExample, Passage
from ctxpick.picker.inference import apply_budget  # noqa: F401  (the harness caps with it)
from ctxpick.retrieval.bm25 import top_k

METHODS = ("none", "bm25", "dense", "adaptive", "full_pool", "oracle", "picker")


@dataclass
class Retrieved:
    """One evaluation question after chunking and scoring every passage."""

    item: ChunkedExample
    bm25: np.ndarray  # BM25 score of each passage for the question
    pool: list[int]  # indices of the inference pool, best first
    dense: np.ndarray | None = None  # cosine similarity, when dense methods run
    pool_retriever: str = "bm25"  # what ranked the pool (retrieval.pool.retriever)

    @property
    def pool_scores(self) -> np.ndarray:
        """The pool retriever's scores, by passage index."""
        scores = self.dense if self.pool_retriever == "dense" else self.bm25
        assert scores is not None, "a dense pool is built from dense scores"
        return scores


@dataclass
class Selection:
    """What one method sends for one question."""

    passages: list[Passage] | None  # None: the method does not apply (oracle without gold)
    seconds: float = 0.0  # retrieval + selection time for this question
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the picker's raw output


def baseline(label: str, r: Retrieved, adaptive_min_k: int = 1) -> list[Passage] | None:
    """The passages of a non-picker method label (``none``, ``bm25@5``, ``dense@10``, ...)."""
    kind, _, k = label.partition("@")
    if kind == "none":
        return []
    if kind == "bm25":
        return top_passages(r, r.bm25, int(k))
    if kind == "dense":
        if r.dense is None:
            raise ValueError("dense Top-K needs dense scores: add 'dense' to eval.methods")
        return top_passages(r, r.dense, int(k))
    if kind == "adaptive":
        return adaptive(r, adaptive_min_k)
    if kind == "full_pool":
        return [r.item.passages[i] for i in r.pool]
    if kind == "oracle":
        return oracle(r)
    raise ValueError(f"unknown method label {label!r}")


def top_passages(r: Retrieved, scores: np.ndarray, k: int) -> list[Passage]:
    return [r.item.passages[i] for i in top_k(scores, k)]


def largest_gap_cutoff(scores: Sequence[float], min_k: int = 1) -> int:
    """How many of ``scores`` (sorted, best first) to keep: up to the largest drop between
    neighbours, and at least ``min_k``."""
    if len(scores) <= min_k:
        return len(scores)
    gaps = [scores[i] - scores[i + 1] for i in range(min_k - 1, len(scores) - 1)]
    return min_k + int(np.argmax(gaps))


def adaptive(r: Retrieved, min_k: int = 1) -> list[Passage]:
    keep = largest_gap_cutoff([float(r.pool_scores[i]) for i in r.pool], min_k)
    return [r.item.passages[i] for i in r.pool[:keep]]


def oracle(r: Retrieved) -> list[Passage] | None:
    gold = r.item.gold_pids
    if gold is None:
        return None
    return [p for p in r.item.passages if p.pid in set(gold)]
