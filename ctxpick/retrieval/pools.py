"""Candidate pools: an example's passages ranked by BM25 or by the bundled dense embedder,
queried with the question (inference) or the question plus its gold answer (mining, so the
pool very likely holds the evidence)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ctxpick.data.schema import ChunkedExample, Pool
from ctxpick.retrieval.bm25 import BM25Index, build_index, tokenize, top_k

RETRIEVERS = ("bm25", "dense")


@dataclass
class PoolConfig:
    k: int = 20
    query: str = "question"  # question | question_answer
    # What ranks the pool, and so the order the picker reads it in: bm25 | dense (cosine
    # similarity under `embedder`, which sees the passages BM25's word overlap misses).
    retriever: str = "bm25"
    embedder: str = "all-minilm-l6-v2"
    backend: str = "sparse"
    k1: float = 1.5
    b: float = 0.75

    def __post_init__(self) -> None:
        if self.k <= 0:
            raise ValueError(f"pool k must be positive, got {self.k}")
        if self.query not in ("question", "question_answer"):
            raise ValueError(f"pool query must be question or question_answer, not {self.query!r}")
        if self.retriever not in RETRIEVERS:
            raise ValueError(f"pool retriever must be bm25 or dense, not {self.retriever!r}")
        if self.backend not in ("sparse", "rank_bm25"):
            raise ValueError(f"pool backend must be sparse or rank_bm25, not {self.backend!r}")


class PoolBuilder:
    def __init__(self, cfg: PoolConfig) -> None:
        self.cfg = cfg
        self._index: tuple[str, BM25Index] | None = None
        self._dense = None

    def _corpus_index(self, item: ChunkedExample) -> BM25Index:
        # Examples of one corpus arrive together (LoCoMo questions per conversation): keep the
        # last index rather than rebuilding it for each question.
        cid = item.example.corpus_id
        if self._index is None or self._index[0] != cid:
            corpus = [tokenize(f"{p.title} {p.text}") for p in item.passages]
            index = build_index(corpus, self.cfg.backend, k1=self.cfg.k1, b=self.cfg.b)
            self._index = (cid, index)
        return self._index[1]

    def _query(self, item: ChunkedExample) -> str:
        ex = item.example
        if self.cfg.query == "question_answer":
            return ex.question + " " + " ".join(ex.answers)
        return ex.question

    def bm25_scores(self, item: ChunkedExample) -> np.ndarray:
        """BM25 score of every passage of ``item`` for the configured query."""
        return np.asarray(self._corpus_index(item).get_scores(tokenize(self._query(item))))

    def dense_scores(self, item: ChunkedExample) -> np.ndarray:
        """Cosine similarity of every passage of ``item`` to the configured query."""
        if self._dense is None:
            from ctxpick.retrieval.embed import DenseRetriever  # loads torch: only when used

            self._dense = DenseRetriever(self.cfg.embedder)
        return np.asarray(self._dense.scores(item, self._query(item)))

    def scores(self, item: ChunkedExample) -> np.ndarray:
        """The pool retriever's score of every passage of ``item``."""
        if self.cfg.retriever == "dense":
            return self.dense_scores(item)
        return self.bm25_scores(item)

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
