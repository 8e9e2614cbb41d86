"""BM25 with rank-bm25's exact ``BM25Okapi`` scoring, on a sparse matrix.

rank-bm25 scores a query with a Python loop over every document for every query term. Here
each document-term weight ``idf * tf*(k1+1) / (tf + k1*(1-b+b*dl/avgdl))`` is precomputed once
into a CSC matrix, so a query is a sum of a few sparse columns. The formula, including
rank-bm25's epsilon floor for negative idf, is the same, so scores and top-k match it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import scipy.sparse as sp

_TOKEN = re.compile(r"\w+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens: the one tokenisation both backends index and query with."""
    return _TOKEN.findall(text.lower())


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` best scores, best first; ties go to the lower index."""
    k = min(k, len(scores))
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    cand = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
    # argpartition may cut inside a run of tied scores: widen to every tie of the k-th score.
    kth = scores[cand].min()
    cand = np.flatnonzero(scores >= kth)
    order = np.lexsort((cand, -scores[cand]))
    return cand[order][:k]


class BM25Index(Protocol):
    def get_scores(self, query: Sequence[str]) -> np.ndarray: ...


class SparseBM25:
    def __init__(
        self,
        corpus: Sequence[Sequence[str]],
        k1: float = 1.5,
        b: float = 0.75,
        epsilon: float = 0.25,
    ) -> None:
        if not corpus:
            raise ValueError("BM25 corpus is empty")
        vocab: dict[str, int] = {}
        rows, cols, tfs = [], [], []
        doc_len = np.zeros(len(corpus), dtype=np.float64)
        for d, doc in enumerate(corpus):
            doc_len[d] = len(doc)
            for term, tf in Counter(doc).items():
                rows.append(d)
                cols.append(vocab.setdefault(term, len(vocab)))
                tfs.append(tf)
        n = len(corpus)
        tf = sp.csc_matrix(
            (np.asarray(tfs, dtype=np.float64), (rows, cols)), shape=(n, max(len(vocab), 1))
        )
        df = np.diff(tf.indptr).astype(np.float64)
        idf = np.log(n - df + 0.5) - np.log(df + 0.5)
        # rank-bm25 floors negative idf at epsilon * mean idf (the mean taken before flooring).
        eps = epsilon * (float(idf.sum()) / len(idf) if len(idf) else 0.0)
        idf = np.where(idf < 0, eps, idf)
        avgdl = doc_len.sum() / n
        norm = k1 * (1 - b + b * doc_len / avgdl) if avgdl > 0 else np.full(n, k1)
        data = tf.data
        row_of = tf.indices
        col_of = np.repeat(np.arange(tf.shape[1]), np.diff(tf.indptr))
        tf.data = idf[col_of] * data * (k1 + 1) / (data + norm[row_of])
        self.weights = tf  # CSC: one column per term
        self.vocab = vocab
        self.n_docs = n

    def get_scores(self, query: Sequence[str]) -> np.ndarray:
        counts = Counter(t for t in query if t in self.vocab)
        if not counts:
            return np.zeros(self.n_docs)
        cols = [self.vocab[t] for t in counts]
        mult = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
        return np.asarray(self.weights[:, cols] @ mult).ravel()


class RankBM25:
    """rank-bm25's BM25Okapi, the reference the fast backend is checked against."""

    def __init__(
        self,
        corpus: Sequence[Sequence[str]],
        k1: float = 1.5,
        b: float = 0.75,
        epsilon: float = 0.25,
    ) -> None:
        from rank_bm25 import BM25Okapi

        if not corpus:
            raise ValueError("BM25 corpus is empty")
        self._bm25 = BM25Okapi([list(d) for d in corpus], k1=k1, b=b, epsilon=epsilon)

    def get_scores(self, query: Sequence[str]) -> np.ndarray:
        return np.asarray(self._bm25.get_scores(list(query)))


BACKENDS = {"sparse": SparseBM25, "rank_bm25": RankBM25}


def build_index(
    corpus: Sequence[Sequence[str]], backend: str = "sparse", **params: float
) -> BM25Index:
    if backend not in BACKENDS:
        raise ValueError(f"unknown BM25 backend {backend!r}; known: {', '.join(BACKENDS)}")
    return BACKENDS[backend](corpus, **params)
