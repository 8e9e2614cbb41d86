"""Selection methods compared in evaluation. Each turns a retrieved question into the passages
the generator will read; the token budget then caps what any of them may send.

* ``none``       -- no retrieval: the generator answers from the question alone.
* ``bm25``       -- Top-K by BM25 over the question, for each K in ``eval.topk``.
* ``dense``      -- Top-K by cosine similarity of the bundled MiniLM embeddings.
* ``crossenc``   -- Top-K of the bundled cross-encoder over the first stage's top
  ``retrieval.pool.rerank_n`` (what a RAG pipeline puts between retriever and generator).
* ``crossenc_threshold`` -- the cross-encoder's passages scoring at least
  ``eval.crossenc_threshold`` (chosen on validation questions), at least one.
* ``matched``    -- for each picker and each of bm25, dense and crossenc, that ranking's top
  |S| on every question, |S| the picker's own set size there: paired with the picker, it
  separates reading from sizing.
* ``adaptive``   -- the inference pool cut at its retriever's largest score gap (a classic
  adaptive cutoff).
* ``full_pool``  -- the whole inference pool (top ``retrieval.pool.k`` by
  ``retrieval.pool.retriever``: BM25 or dense).
* ``oracle``     -- the human gold evidence (datasets that annotate it).
* ``picker``     -- each picker checkpoint in ``eval.pickers``, reading the top
  ``retrieval.pool.k`` in the order its ``picker.json`` names (ctxpick/eval/picking.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ctxpick.data.schema import ChunkedExample, Passage
from ctxpick.retrieval.bm25 import top_k

METHODS = (
    "none",
    "bm25",
    "dense",
    "crossenc",
    "crossenc_threshold",
    "adaptive",
    "full_pool",
    "oracle",
    "picker",
    "matched",
)
RANKINGS = ("bm25", "dense", "crossenc")  # the Top-K methods, and the matched rows' rankings
MATCHED = "@size:"  # a matched row's label: f"{ranking}@size:{picker name}"


def matched_label(ranking: str, picker: str) -> str:
    return f"{ranking}{MATCHED}{picker}"


def matched_picker(label: str) -> str | None:
    """The picker whose set sizes a matched row takes, or None for any other label."""
    return label.partition(MATCHED)[2] or None


@dataclass
class Retrieved:
    """One evaluation question after chunking and scoring every passage."""

    item: ChunkedExample
    bm25: np.ndarray  # BM25 score of each passage for the question
    pool: list[int]  # indices of the inference pool, best first
    dense: np.ndarray | None = None  # cosine similarity, when dense methods run
    pool_retriever: str = "bm25"  # what ranked the pool (retrieval.pool.retriever)
    crossenc: np.ndarray | None = None  # cross-encoder logits (PoolBuilder.crossenc_scores)
    reranked: int = 0  # how many passages the cross-encoder read (retrieval.pool.rerank_n)

    def scores(self, ranking: str) -> np.ndarray:
        """A ranking's scores (bm25, dense, crossenc), by passage index."""
        scores = getattr(self, ranking)
        if scores is None:
            raise ValueError(f"{ranking} scores were not computed for this evaluation")
        return scores

    @property
    def pool_scores(self) -> np.ndarray:
        """The pool retriever's scores, by passage index."""
        return self.scores(self.pool_retriever)

    def top(self, ranking: str, k: int | None = None) -> list[int]:
        """The indices of a ranking's first ``k`` passages (default: as many as the pool)."""
        return [int(i) for i in top_k(self.scores(ranking), len(self.pool) if k is None else k)]


@dataclass
class Selection:
    """What one method sends for one question."""

    passages: list[Passage] | None  # None: the method does not apply (oracle without gold)
    seconds: float = 0.0  # retrieval + selection time for this question
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the picker's raw output


def baseline(
    label: str, r: Retrieved, adaptive_min_k: int = 1, threshold: float = 0.0
) -> list[Passage] | None:
    """The passages of a non-picker method label (``none``, ``bm25@5``, ``crossenc@2``, ...);
    a matched row's (``dense@size:NAME``) are :func:`top_passages` at the picker's size."""
    kind, _, k = label.partition("@")
    if kind == "none":
        return []
    if kind in RANKINGS:
        return top_passages(r, r.scores(kind), int(k))
    if kind == "crossenc_threshold":  # a score cut of what the cross-encoder read
        scores = r.scores("crossenc")
        read = top_k(scores, r.reranked)
        return top_passages(r, scores, max(1, int((scores[read] >= threshold).sum())))
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
