import random

import numpy as np
import pytest
from conftest import SAMPLES

from ctxpick.data.loaders import load_examples
from ctxpick.retrieval.bm25 import RankBM25, SparseBM25, build_index, tokenize, top_k
from ctxpick.retrieval.chunking import Chunker, ChunkingConfig
from ctxpick.retrieval.pools import PoolBuilder, PoolConfig


def test_parity_with_rank_bm25_on_random_corpora():
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(300)]
    for _ in range(5):
        corpus = [
            [rng.choice(vocab[: rng.randint(3, 300)]) for _ in range(rng.randint(0, 30))]
            for _ in range(rng.randint(1, 400))
        ]
        fast, ref = SparseBM25(corpus), RankBM25(corpus)
        for _ in range(20):
            q = [rng.choice(vocab) for _ in range(rng.randint(1, 6))] + ["unseen"]
            a, b = fast.get_scores(q), ref.get_scores(q)
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
            assert list(top_k(a, 10)) == list(top_k(b, 10))


def test_parity_on_real_passages():
    exs = load_examples(SAMPLES / "musique_30.jsonl").examples
    passages = [
        p for c in Chunker(ChunkingConfig(method="none")).chunk_all(exs) for p in c.passages
    ]
    corpus = [tokenize(p.text) for p in passages]
    fast, ref = SparseBM25(corpus), RankBM25(corpus)
    for ex in exs:
        q = tokenize(ex.question)
        assert list(top_k(fast.get_scores(q), 20)) == list(top_k(ref.get_scores(q), 20))


def test_top_k_ties_and_edges():
    scores = np.array([1.0, 3.0, 3.0, 0.0, 3.0])
    assert list(top_k(scores, 2)) == [1, 2]
    assert list(top_k(scores, 10)) == [1, 2, 4, 0, 3]
    assert list(top_k(scores, 0)) == []
    with pytest.raises(ValueError, match="empty"):
        build_index([], "sparse")
    with pytest.raises(ValueError, match="unknown BM25 backend"):
        build_index([["a"]], "bm99")


def test_pools_question_answer_query_finds_more_gold():
    exs = load_examples(SAMPLES / "musique_30.jsonl").examples
    items = Chunker(ChunkingConfig(method="none")).chunk_all(exs)
    q = [PoolBuilder(PoolConfig(k=4)).build(i) for i in items]
    qa = [PoolBuilder(PoolConfig(k=4, query="question_answer")).build(i) for i in items]
    assert all(len(p.passages) == 4 and p.scores == sorted(p.scores, reverse=True) for p in q)
    assert np.mean([p.gold_recall for p in qa]) > np.mean([p.gold_recall for p in q])
