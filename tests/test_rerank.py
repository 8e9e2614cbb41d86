"""The bundled cross-encoder reranker, and the pools it orders (retriever=crossenc)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SAMPLES

from ctxpick.data.loaders import load_examples
from ctxpick.retrieval.chunking import Chunker, ChunkingConfig
from ctxpick.retrieval.pools import PoolBuilder, PoolConfig
from ctxpick.retrieval.rerank import BUNDLED, load_reranker, passage_text, reranker_path


def test_a_pair_scores_the_same_whatever_it_is_scored_beside():
    ce = load_reranker()
    q = "Who wrote the novel Dune?"
    texts = [
        "Dune is a 1965 science fiction novel by American author Frank Herbert.",
        "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
        "Frank Herbert was born in Tacoma, Washington.",
    ]
    both = ce.score(q, texts)
    assert both.tolist() == ce.score(q, texts[::-1])[::-1].tolist()
    assert both[0] == ce.score(q, texts[:1])[0]
    assert both[0] > both[2] > both[1]  # the answer, then the author, then Paris


def test_a_changed_bundled_file_is_refused(monkeypatch):
    pkg, sub, _, tok = BUNDLED["ms-marco-minilm-l12"]
    monkeypatch.setitem(BUNDLED, "ms-marco-minilm-l12", (pkg, sub, "0" * 64, tok))
    with pytest.raises(ValueError, match="model.onnx: sha256 differs"):
        reranker_path("ms-marco-minilm-l12")


def test_a_crossenc_pool_is_the_first_stage_top_n_in_cross_encoder_order():
    exs = load_examples(SAMPLES / "hotpotqa_distractor_30.jsonl", limit=3).examples
    items = Chunker(ChunkingConfig(method="none")).chunk_all(exs)
    cfg = PoolConfig(k=4, retriever="crossenc", rerank_first_stage="bm25", rerank_n=6)
    builder = PoolBuilder(cfg)
    for item in items:
        pool = builder.build(item)
        first = np.argsort(-builder.bm25_scores(item), kind="stable")[:6]
        read = {item.passages[i].pid for i in first}
        assert len(pool.passages) == 4 and {p.pid for p in pool.passages} <= read
        assert pool.scores == sorted(pool.scores, reverse=True)
        direct = load_reranker().score(
            item.example.question, [passage_text(p) for p in pool.passages]
        )
        assert np.allclose(pool.scores, direct)
    with pytest.raises(ValueError, match="rerank_n=3 must be >= k=4"):
        PoolConfig(k=4, retriever="crossenc", rerank_n=3)
