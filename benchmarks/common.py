"""Shared by the benchmarks: where the real data is, and the bundled fallback."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
SAMPLES = REPO / "ctxpick" / "data" / "samples"


def data_file(shared_rel: str, sample_name: str) -> Path:
    """The full ``../shared/data`` file when present, else the bundled sample."""
    full = SHARED / shared_rel
    return full if full.is_file() else SAMPLES / sample_name


def mined_file(
    out: Path,
    n: int | None,
    *,
    source: Path | None = None,
    query: str = "question",
    val: int = 1,
) -> Path:
    """``out/mine/mined.jsonl``: the first ``n`` HotpotQA questions of ``source`` (default: the
    shared training file, else the bundled sample) with their human evidence as the gold
    sets, in 60-word windows, pools of 8 ranked by BM25 over ``query``; the last ``val`` kept
    are validation."""
    import json

    from ctxpick.data.loaders import load_examples
    from ctxpick.mining.human_gold import human_gold_records
    from ctxpick.retrieval.chunking import Chunker, ChunkingConfig
    from ctxpick.retrieval.pools import PoolBuilder, PoolConfig

    source = source or data_file("train/hotpotqa_train_120.json", "hotpotqa_distractor_30.jsonl")
    exs = load_examples(source, "hotpotqa", limit=n).examples
    chunked = Chunker(ChunkingConfig(method="window", window_words=60)).chunk_all(exs)
    pools = [PoolBuilder(PoolConfig(k=8, query=query)).build(c) for c in chunked]
    records = [r for r in human_gold_records(pools, ["train"] * len(pools)) if r["kept"]]
    for r in records[max(len(records) - val, 0) :]:
        r["split"] = "val"
    path = out / "mine" / "mined.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
