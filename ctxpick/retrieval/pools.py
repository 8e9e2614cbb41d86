"""Candidate pools: BM25 over an example's passages, queried with the question (inference) or
the question plus its gold answer (mining, so the pool very likely holds the evidence)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ctxpick.data.schema import ChunkedExample, Pool
from ctxpick.retrieval.bm25 import BM25Index, build_index, tokenize, top_k


@dataclass
class PoolConfig:
    k: int = 20
    query: str = "question"  # question | question_answer
    backend: str = "sparse"
    k1: float = 1.5
    b: float = 0.75

    def __post_init__(self) -> None:
        if self.k <= 0:
            raise ValueError(f"pool k must be positive, got {self.k}")
        if self.query not in ("question", "question_answer"):
            raise ValueError(f"pool query must be question or question_answer, not {self.query!r}")
        if self.backend not in ("sparse", "rank_bm25"):
            raise ValueError(f"pool backend must be sparse or rank_bm25, not {self.backend!r}")


class PoolBuilder:
    def __init__(self, cfg: PoolConfig) -> None:
        self.cfg = cfg
        self._index: tuple[str, BM25Index] | None = None

    def _corpus_index(self, item: ChunkedExample) -> BM25Index:
        # Examples of one corpus arrive together (LoCoMo questions per conversation): keep the
        # last index rather than rebuilding it for each question.
        cid = item.example.corpus_id
        if self._index is None or self._index[0] != cid:
            corpus = [tokenize(f"{p.title} {p.text}") for p in item.passages]
            index = build_index(corpus, self.cfg.backend, k1=self.cfg.k1, b=self.cfg.b)
            self._index = (cid, index)
        return self._index[1]

    def scores(self, item: ChunkedExample) -> np.ndarray:
        """BM25 score of every passage of ``item`` for the configured query."""
        ex = item.example
        query = ex.question
        if self.cfg.query == "question_answer":
            query += " " + " ".join(ex.answers)
        return np.asarray(self._corpus_index(item).get_scores(tokenize(query)))

    def build(self, item: ChunkedExample) -> Pool:
        ex = item.example
        scores = self.scores(item)
        best = top_k(scores, self.cfg.k)
        return Pool(
            example_id=ex.id,
            dataset=ex.dataset,
            question=ex.question,
            answers=ex.answers,
            passages=[item.passages[i] for i in best],
            scores=[float(scores[i]) for i in best],
            gold_pids=item.gold_pids,
            meta=dict(ex.meta),
        )
