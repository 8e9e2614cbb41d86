"""What `benchmarks/pool_recall.py` computes (pure): a table cell's recall, whole-gold share and
tokens, and the second-hop ranking, a reciprocal-rank fusion of the cross-encoder's order with
a dense query that adds the cross-encoder's best passage."""

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


def _passages(n):
    return [Passage(f"p{i}", 0, i, i + 1, f"text {i}", f"title {i}") for i in range(n)]


def _retrieved(crossenc):
    item = SimpleNamespace(passages=_passages(len(crossenc)), example=SimpleNamespace(question="Q"))
    return Retrieved(item, np.zeros(len(crossenc)), [], crossenc=np.asarray(crossenc, float))


def test_fusion_sums_reciprocal_ranks_counted_from_one(pool_recall):
    fused = pool_recall.fuse([[2, 0, 1], [0, 1, 2]])
    assert fused == pytest.approx([1 / 62 + 1 / 61, 1 / 63 + 1 / 62, 1 / 61 + 1 / 63])


def test_the_second_query_adds_the_best_passage_and_ties_keep_the_cross_encoders_order(
    pool_recall,
):
    r = _retrieved([0.1, 3.0, 2.0, -1.0, 0.5])  # cross-encoder: 1, 2, 4, 0, 3
    dense = _Dense([0.0, 0.9, 0.8, 0.1, 0.2])  # second query: 1, 2, 4, 3, 0
    assert pool_recall.second_hop(dense, r) == [1, 2, 4, 0, 3]
    assert dense.asked == ["Q title 1 text 1"]
    # 3 and 0 swap places between the orders (4th and 3rd): equal sums, the cross-encoder's
    # order decides, not their positions in the document.
    r = _retrieved([0.1, 3.0, 2.0, 0.5, -1.0])  # cross-encoder: 1, 2, 3, 0, 4
    assert pool_recall.second_hop(_Dense([0.7, 0.9, 0.8, 0.5, 0.1]), r) == [1, 2, 3, 0, 4]


def test_a_reciprocal_rank_rewards_one_high_place_over_two_middling_ones(pool_recall):
    r = _retrieved([4.0, 3.0, 2.0, 1.0, 0.0])  # cross-encoder: 0, 1, 2, 3, 4
    # Second query: 4, 0, 2, 1, 3. Places 4 -> 5 and 1, 1 -> 2 and 4, 2 -> 3 and 3: equal
    # sums of places, which a rank sum would leave to the cross-encoder (1, 2, 4).
    fused = pool_recall.second_hop(_Dense([0.8, 0.4, 0.6, 0.2, 0.9]), r)
    assert fused == [0, 4, 1, 2, 3]


def test_a_cell_counts_gold_shown_whole_sets_and_tokens(pool_recall):
    p = _passages(4)
    rows = [(["p0", "p1"], [p[0], p[2]]), (["p3"], [p[3], p[1]])]
    recall, whole, tokens = pool_recall.cell(rows, lambda text: len(text.split())).split(" / ")
    assert (recall, whole) == ("75%", "50%")  # (1/2 + 1) / 2; the second question's set whole
    assert float(tokens) > 0
