"""Candidate pools: an example's passages ranked by BM25, by the bundled dense embedder, or by
the bundled cross-encoder over a first stage's top N, queried with the question (inference) or
the question plus its gold answer (mining, so the pool very likely holds the evidence)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ctxpick.data.schema import ChunkedExample, Pool
from ctxpick.retrieval.bm25 import BM25Index, build_index, tokenize, top_k

RETRIEVERS = ("bm25", "dense", "crossenc")
FIRST_STAGES = ("bm25", "dense")


@dataclass
class PoolConfig:
    k: int = 20
    query: str = "question"  # question | question_answer
    # What ranks the pool, and so the order the picker reads it in: bm25 | dense (cosine
    # similarity under `embedder`, which sees the passages BM25's word overlap misses).
    retriever: str = "bm25"
    embedder: str = "all-minilm-l6-v2"
    # crossenc: `reranker` (ctxpick/retrieval/rerank.py) reorders the `rerank_first_stage`
    # retriever's top `rerank_n`; the pool is its first k. The eval's crossenc@K rows use it too.
    reranker: str = "ms-marco-minilm-l12"
    rerank_first_stage: str = "dense"
    rerank_n: int = 20
    backend: str = "sparse"
    k1: float = 1.5
    b: float = 0.75

    def __post_init__(self) -> None:
        if self.k <= 0:
            raise ValueError(f"pool k must be positive, got {self.k}")
        if self.query not in ("question", "question_answer"):
            raise ValueError(f"pool query must be question or question_answer, not {self.query!r}")
        if self.retriever not in RETRIEVERS:
            raise ValueError(f"pool retriever must be one of {RETRIEVERS}, not {self.retriever!r}")
        if self.rerank_first_stage not in FIRST_STAGES:
            raise ValueError(
                f"pool rerank_first_stage must be one of {FIRST_STAGES}, "
                f"not {self.rerank_first_stage!r}"
            )
        if self.retriever == "crossenc" and self.rerank_n < self.k:
            raise ValueError(
                f"pool rerank_n={self.rerank_n} must be >= k={self.k}: a cross-encoder pool "
                "is the first k of the reranked top rerank_n"
            )
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

    def crossenc_scores(self, item: ChunkedExample, first: np.ndarray | None = None) -> np.ndarray:
        """The cross-encoder's logit for each of the first stage's top ``rerank_n`` passages
        of ``item``; the passages it does not read rank below all of them, in the first
        stage's order (a Top-K past ``rerank_n`` appends them, as a pipeline keeping the
        retriever's tail would)."""
        from ctxpick.retrieval.rerank import load_reranker, passage_text

        if first is None:  # ``first``: the first stage's scores, when the caller has them
            dense = self.cfg.rerank_first_stage == "dense"
            first = self.dense_scores(item) if dense else self.bm25_scores(item)
        order = top_k(first, len(first))
        read, rest = order[: self.cfg.rerank_n], order[self.cfg.rerank_n :]
        logits = load_reranker(self.cfg.reranker).score(
            self._query(item), [passage_text(item.passages[i]) for i in read]
        )
        out = np.empty(len(item.passages))
        out[read] = logits
        out[rest] = (logits.min() if len(logits) else 0.0) - 1.0 - np.arange(len(rest))
        return out

    def scores(self, item: ChunkedExample) -> np.ndarray:
        """The pool retriever's score of every passage of ``item``."""
        return {
            "bm25": self.bm25_scores,
            "dense": self.dense_scores,
            "crossenc": self.crossenc_scores,
        }[self.cfg.retriever](item)

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


def with_progress(items: Sequence[ChunkedExample], label: str) -> Iterator[ChunkedExample]:
    """``items``, printing ``label n/N`` every 100 and at the end: scoring a pool takes up to a
    second with the cross-encoder (712 took 9 minutes here)."""
    for n, item in enumerate(items, 1):
        yield item
        if n % 100 == 0 or n == len(items):
            print(f"  {label} {n}/{len(items)}", flush=True)
