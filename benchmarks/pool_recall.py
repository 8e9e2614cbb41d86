"""How much of each question's human evidence a pool shows, by ranking and pool size, on the
training-split files of the config's ``data.sources`` (never on the evaluation questions).

A picker can only pick what its pool shows: a gold passage outside the first k caps its
evidence F1 however well it reads and sizes. This chunks and ranks the questions exactly as
``ctxpick eval`` does (BM25, the dense embedder, and the cross-encoder over the first stage's
top ``rerank_n``) and prints, per dataset and for each ranking and k: the mean share of the gold
passages in the first k (recall), the share of questions whose whole gold set is in the first
k (where a minimal sufficient set can be picked at all), and the mean context tokens of those
k passages under the evaluation's token counter.

One more ranking measures a candidate lever, a second hop: the cross-encoder's order fused by
reciprocal rank with a second dense query, the question plus the cross-encoder's best passage
(which names the bridge entity that a multi-hop question's next passage is about, as IRCoT-style
retrieval uses it). Nothing in the pipeline ranks this way yet.

Run, from the repository root (the shipped picker's pool and chunks, ../shared/data/train):
    .venv/bin/python benchmarks/pool_recall.py experiment=cpu_quality \
        ablation=ctxpick_picker_0_5b output_dir=outputs/pool_recall
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ctxpick.config import compose
from ctxpick.data.schema import Passage
from ctxpick.engines.models import resolve
from ctxpick.eval.harness import retrieve
from ctxpick.eval.methods import Retrieved
from ctxpick.picker.selection import passage_tokens, token_counter
from ctxpick.retrieval.embed import DenseRetriever

RANKINGS = ("bm25", "dense", "crossenc")
HOP = "crossenc+hop2"
SIZES = (2, 4, 6, 8, 10, 12, 16, 20)
RRF_K = 60  # reciprocal rank fusion's usual constant (Cormack, Clarke and Buettcher, 2009)


def fuse(orders: Sequence[Sequence[int]]) -> np.ndarray:
    """Reciprocal rank fusion of full orders: each passage's sum of 1 / (RRF_K + its rank),
    ranks counted from 1."""
    fused = np.zeros(len(orders[0]))
    for order in orders:
        fused[np.asarray(order)] += 1.0 / (RRF_K + 1 + np.arange(len(order)))
    return fused


def second_hop(dense: DenseRetriever, r: Retrieved) -> list[int]:
    """All of ``r``'s passages, the cross-encoder's order fused with the second query's; equal
    sums (two passages that swap places between the orders) in the cross-encoder's order."""
    n = len(r.item.passages)
    first = r.top("crossenc", n)
    best = r.item.passages[first[0]]
    query = f"{r.item.example.question} {best.title} {best.text}"
    hop = np.argsort(-np.asarray(dense.scores(r.item, query)), kind="stable")
    place = np.empty(n, dtype=int)
    place[np.asarray(first)] = np.arange(n)
    return [int(i) for i in np.lexsort((place, -fuse([first, hop])))]


def cell(
    shown: Sequence[tuple[Sequence[str], Sequence[Passage]]], tokens: Callable[[str], int]
) -> str:
    """One table cell: over questions given as (gold passage ids, passages shown), the mean
    share of gold shown / the share with all gold shown / the mean context tokens shown."""
    recall, whole, toks = [], [], []
    for gold_pids, passages in shown:
        gold = set(gold_pids)
        hit = len(gold & {p.pid for p in passages})
        recall.append(hit / len(gold))
        whole.append(hit == len(gold))
        toks.append(sum(passage_tokens(tokens, passages)))
    return f"{np.mean(recall):.0%} / {np.mean(whole):.0%} / {np.mean(toks):.0f}"


def main(overrides: list[str]) -> None:
    # Naming every ranking as a method makes `retrieve` compute each one's scores.
    cfg = compose([*overrides, "eval.methods=[bm25,dense,crossenc]"])
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)  # rejected records go there
    tokens = token_counter(resolve(cfg.eval.tokenizer or cfg.model.name))
    items = [r for r in retrieve(cfg) if r.item.gold_pids]
    dense = DenseRetriever(cfg.retrieval.pool.embedder)
    by_dataset = defaultdict(list)
    for r in items:
        order = {x: r.top(x, len(r.item.passages)) for x in RANKINGS}
        order[HOP] = second_hop(dense, r)
        by_dataset[r.item.example.dataset].append((r, order))
    # Past rerank_n the cross-encoder's order is the first stage's: its sizes stop there.
    sizes = [k for k in SIZES if k <= cfg.retrieval.pool.rerank_n]
    print(
        f"{len(items)} training-split questions with human evidence; pool shown to pickers: "
        f"{cfg.retrieval.pool.retriever} top {cfg.retrieval.pool.k}; the cross-encoder reads "
        f"{cfg.retrieval.pool.rerank_first_stage} top {cfg.retrieval.pool.rerank_n}"
    )
    print("| dataset | n | ranking | " + " | ".join(f"k={k}" for k in sizes) + " |")
    print("|---|---|---|" + "---|" * len(sizes))
    for dataset, rs in sorted(by_dataset.items()):
        for ranking in (*RANKINGS, HOP):
            cells = [
                cell(
                    [
                        (r.item.gold_pids, [r.item.passages[i] for i in order[ranking][:k]])
                        for r, order in rs
                    ],
                    tokens,
                )
                for k in sizes
            ]
            print(f"| {dataset} | {len(rs)} | {ranking} | " + " | ".join(cells) + " |")
    print("cells: gold recall / questions with all gold shown / context tokens of the k shown")


if __name__ == "__main__":
    main(sys.argv[1:])
