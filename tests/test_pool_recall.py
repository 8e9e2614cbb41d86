"""The second-hop ranking `benchmarks/pool_recall.py` measures (pure): a reciprocal-rank fusion
of the cross-encoder's order with a dense query that adds the cross-encoder's best passage."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ctxpick.data.schema import Passage
from ctxpick.eval.methods import Retrieved

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def pool_recall(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import pool_recall

    return pool_recall


class _Dense:
    """Scores of the second query, and the query it was asked."""

    def __init__(self, scores):
        self.scores_, self.asked = np.asarray(scores, dtype=float), []

    def scores(self, item, query):
        self.asked.append(query)
        return self.scores_


def _retrieved(crossenc):
    n = len(crossenc)
    passages = [Passage(f"p{i}", 0, i, i + 1, f"text {i}", f"title {i}") for i in range(n)]
    example = SimpleNamespace(question="Who?")
    item = SimpleNamespace(passages=passages, example=example)
    return Retrieved(item, np.zeros(len(crossenc)), [], crossenc=np.asarray(crossenc, float))


def test_the_second_query_adds_the_best_passage_and_the_fusion_ranks_every_passage_once(
    pool_recall,
):
    r = _retrieved([0.1, 3.0, 2.0, -1.0, 0.5])  # cross-encoder order: 1, 2, 4, 0, 3
    dense = _Dense([0.0, 0.9, 0.1, 0.8, 0.2])  # second query's order: 1, 3, 4, 2, 0
    fused = pool_recall.second_hop(dense, r)
    assert dense.asked == ["Who? title 1 text 1"]
    assert sorted(fused) == list(range(5))
    # 1 is first in both; 2 (second and fourth) comes before 4 (third in both): a reciprocal
    # rank rewards a high place in either order more than a middling one in both.
    assert fused == [1, 2, 4, 3, 0]


def test_orders_that_agree_fuse_to_the_same_order(pool_recall):
    r = _retrieved([4.0, 3.0, 2.0, 1.0])
    assert pool_recall.second_hop(_Dense([4.0, 3.0, 2.0, 1.0]), r) == [0, 1, 2, 3]
