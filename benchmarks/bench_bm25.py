"""BM25: the sparse backend against rank-bm25 (the reference) on one corpus of real passages.

Same tokenisation, same parameters, same queries; checks top-k identity for every query and
prints the speed ratio. Run: .venv/bin/python benchmarks/bench_bm25.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from common import SHARED, data_file

from ctxpick.data.loaders import load_examples
from ctxpick.retrieval.bm25 import RankBM25, SparseBM25, tokenize, top_k
from ctxpick.retrieval.chunking import Chunker, ChunkingConfig

SOURCES = [
    ("hotpotqa/migres_hotpot_200.jsonl", "hotpotqa_distractor_30.jsonl"),
    ("hotpotqa/tts_project_hotpot_dev_fullwiki_sampled_500.json", "hotpotqa_distractor_30.jsonl"),
    ("2wikimultihopqa/migres_wikihop_200.jsonl", "2wikimultihopqa_30.jsonl"),
    ("musique/migres_musique_200.jsonl", "musique_30.jsonl"),
    ("locomo/locomo10_conv0-6.json", "locomo10_conv26.json"),
    ("longbench_multifieldqa_en/multifieldqa_en_first59.jsonl", "multifieldqa_en_20.jsonl"),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--queries", type=int, default=300)
    args = ap.parse_args()

    examples = []
    for full, sample in dict.fromkeys(SOURCES):
        examples += load_examples(data_file(full, sample), strict=False).examples
    # Paragraphs/turns as they come, long documents cut into 64-word windows.
    chunker = Chunker(ChunkingConfig(method="window", window_words=64))
    passages = {p.pid: p for item in chunker.chunk_all(examples) for p in item.passages}
    corpus = [tokenize(f"{p.title} {p.text}") for p in passages.values()]
    queries = [tokenize(ex.question) for ex in examples[: args.queries]]
    src = "../shared/data" if SHARED.is_dir() else "bundled samples"
    print(f"corpus: {len(corpus)} passages from {src}; {len(queries)} queries; k={args.k}")

    t = time.perf_counter()
    ref = RankBM25(corpus)
    ref_build = time.perf_counter() - t
    t = time.perf_counter()
    fast = SparseBM25(corpus)
    fast_build = time.perf_counter() - t

    t = time.perf_counter()
    ref_top = [top_k(ref.get_scores(q), args.k) for q in queries]
    ref_query = time.perf_counter() - t
    t = time.perf_counter()
    fast_scores = [fast.get_scores(q) for q in queries]
    fast_top = [top_k(s, args.k) for s in fast_scores]
    fast_query = time.perf_counter() - t

    same = sum(np.array_equal(a, b) for a, b in zip(ref_top, fast_top, strict=True))
    print(f"identical top-{args.k}: {same}/{len(queries)} queries")
    print(f"{'':12s} {'rank-bm25':>12s} {'sparse':>12s} {'ratio':>8s}")
    print(f"{'build (s)':12s} {ref_build:12.3f} {fast_build:12.3f} {ref_build / fast_build:7.1f}x")
    print(f"{'query (s)':12s} {ref_query:12.3f} {fast_query:12.3f} {ref_query / fast_query:7.1f}x")
    qps_ref, qps_fast = len(queries) / ref_query, len(queries) / fast_query
    print(f"{'queries/s':12s} {qps_ref:12.1f} {qps_fast:12.1f} {qps_fast / qps_ref:7.1f}x")
    if same != len(queries):
        raise SystemExit("top-k differs from rank-bm25")


if __name__ == "__main__":
    main()
