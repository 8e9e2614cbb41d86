"""Shared by the benchmarks: where the real data is, the bundled fallback, and the validation
questions a picker's settings are chosen on."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ctxpick.config import Config
    from ctxpick.data.schema import Passage
    from ctxpick.eval.methods import Retrieved
    from ctxpick.picker.spec import PickerSpec

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


# Validation questions per dev file: more where a dataset's questions are few per document.
VALIDATION_PER_SOURCE = {"locomo": 40, "multifieldqa_en": 40}  # the rest: 30 each


def picker_validation_set(
    picker: str, overrides: list[str]
) -> tuple[Config, str, PickerSpec, list[Retrieved], list[list[Passage]]]:
    """The questions a picker's settings are chosen on, never evaluated on: for each of
    ``demo.eval_sources``, the dev-file questions right after those it evaluates, with the
    evaluation's chunks and pools, in the order the picker was trained to read. Returns
    (cfg, picker folder, its spec, the retrieved items, each item's ranked pool)."""
    from dataclasses import replace

    from ctxpick.config import compose
    from ctxpick.engines.ray_pool import init_ray
    from ctxpick.eval.harness import retrieve
    from ctxpick.eval.picking import picker_ranking, ranked_pool
    from ctxpick.picker.inference import load_spec
    from ctxpick.picker.shipped import picker_folder

    cfg = compose(overrides)
    sources = []
    for src in cfg.demo.eval_sources:
        if src.limit is None:
            raise SystemExit(f"{src.path}: the evaluation reads all of it, none is left over")
        limit = VALIDATION_PER_SOURCE.get(src.format, 30)
        sources.append(replace(src, offset=src.offset + src.limit, limit=limit))
    folder = picker_folder(picker)
    cfg = replace(
        cfg,
        data=replace(cfg.data, sources=sources),
        eval=replace(cfg.eval, methods=["picker"], pickers={"tuned": folder}),
    )
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)  # rejected records go there
    init_ray(cfg.ray.address, cfg.ray.num_cpus)
    items = retrieve(cfg)
    _, spec = load_spec(folder)
    ranking = picker_ranking(cfg, folder)  # the order it was trained to read, as eval shows it
    pools = [[r.item.passages[i] for i in ranked_pool(r, ranking)] for r in items]
    return cfg, folder, spec, items, pools
