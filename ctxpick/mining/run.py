"""`ctxpick mine`: data -> chunks -> mining pools -> the distributed mining job -> report."""

from __future__ import annotations

import json
from dataclasses import asdict
from itertools import zip_longest
from pathlib import Path
from typing import Any, TypeVar

from ctxpick.config import Config, ConfigError
from ctxpick.data.loaders import load_sources
from ctxpick.data.schema import Example, Pool
from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.ray_pool import init_ray
from ctxpick.jsonl import JsonlWriter, read_done
from ctxpick.mining.human_gold import human_gold_records
from ctxpick.mining.job import WorkerSpec, mine_pools
from ctxpick.mining.report import render, summarize
from ctxpick.mining.rewrites import assign_split
from ctxpick.retrieval.chunking import Chunker
from ctxpick.retrieval.pools import PoolBuilder, with_progress
from ctxpick.tracking import Tracker

T = TypeVar("T", Example, Pool)


def worker_spec(cfg: Config) -> WorkerSpec:
    eng = cfg.model.engine
    return WorkerSpec(
        model=cfg.model.name,
        backend=cfg.model.backend,
        engine_kwargs={
            "max_model_len": eng.max_model_len,
            "cpu_kv_cache_gb": eng.cpu_kv_cache_gb,
            "gpu_memory_utilization": eng.gpu_memory_utilization,
            "dtype": eng.compute_dtype(),
        },
        http=cfg.model.http,
        judge=cfg.judge,
        miner=cfg.mining.miner,
        # Greedy decoding with a fixed seed: the same pool always mines the same set.
        sampling=SamplingConfig(
            temperature=0.0, max_tokens=cfg.generator.max_tokens, seed=cfg.seed
        ),
        system=cfg.generator.system,
        rewrites=cfg.mining.rewrites.k,
        rewrite_system=cfg.mining.rewrites.system,
        rewrite_temperature=cfg.mining.rewrites.temperature,
        split_ratios=tuple(cfg.mining.split_ratios),  # type: ignore[arg-type]
        seed=cfg.seed,
    )


def in_turn(items: list[T], n: int | None) -> list[T]:
    """The first ``n`` examples (or pools) taking the datasets in turn (each in source order),
    so a subset keeps every dataset; ``None``: all of them."""
    if n is None:
        return items
    by: dict[str, list[T]] = {}
    for p in items:
        by.setdefault(p.dataset, []).append(p)
    rounds = zip_longest(*by.values())
    return [p for row in rounds for p in row if p is not None][:n]


def write_human_gold(pools: list[Pool], path: Path, cfg: Config) -> dict[str, dict[str, Any]]:
    """Append a human-evidence record (ctxpick/mining/human_gold.py) for every pool not yet in
    ``path``; splits by the same seeded hash as mined records, so a question keeps its split."""
    done = read_done(path)
    todo = [p for p in pools if p.example_id not in done]
    ratios = tuple(cfg.mining.split_ratios)
    splits = [assign_split(p.example_id, cfg.seed, ratios) for p in todo]  # type: ignore[arg-type]
    writer = JsonlWriter(path)
    try:
        for rec in human_gold_records(todo, splits):
            writer.write(rec)
            done[rec["id"]] = rec
    finally:
        writer.close()
    print(f"  {len(pools) - len(todo)} already written, {len(todo)} added", flush=True)
    return done


def mining_settings(cfg: Config) -> dict[str, Any]:
    """What a mined record depends on besides its question."""
    local_generator = cfg.mining.miner != "human" and cfg.model.backend == "vllm"
    return {
        "model": cfg.model.name if cfg.mining.miner != "human" else None,
        # What our vLLM generator computes in: bf16 and float32 records are not mixed.
        "dtype": cfg.model.engine.compute_dtype() if local_generator else None,
        "miner": cfg.mining.miner,
        "pool": asdict(cfg.mining.pool),
        "chunking": asdict(cfg.retrieval.chunking),
        "rewrites": asdict(cfg.mining.rewrites),
        "split_ratios": list(cfg.mining.split_ratios),
        "judge": asdict(cfg.judge),
        "generator": asdict(cfg.generator),
        "seed": cfg.seed,
    }


def check_settings(cfg: Config, out: Path) -> None:
    """Record what the records in ``out`` are mined with; refuse to add records mined with
    other settings (they would be mixed in silently). More questions (data, max_questions)
    are fine: each record depends only on its question and these settings."""
    settings = mining_settings(cfg)
    path = out / "settings.json"
    old = json.loads(path.read_text()) if path.exists() else settings
    # Recorded before the dtype was: a local generator (one whose dtype is recorded now)
    # then always computed in bf16.
    old.setdefault("dtype", "bfloat16" if old.get("model") and settings["dtype"] else None)
    if changed := sorted(k for k in settings if old.get(k) != settings[k]):
        raise ConfigError(
            f"{out} holds records mined with other settings ({', '.join(changed)} differ; see "
            f"{path}): mine into another output_dir, or delete it to start over"
        )
    path.write_text(json.dumps(settings, indent=2) + "\n")


def run_mining(cfg: Config) -> dict[str, dict[str, Any]]:
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_settings(cfg, out)
    print("[1/3] loading data, chunking, mining pools", flush=True)
    examples = in_turn(
        load_sources(cfg.data.sources, cfg.data.strict, out / "rejects.jsonl"),
        cfg.mining.max_questions,
    )
    # A resumed run builds pools only for the questions not yet mined: chunking and retrieval
    # of every question again cost minutes for nothing (check_settings pins the pool settings).
    finished = read_done(out / "mined.jsonl") | read_done(out / "mining_rejects.jsonl")
    todo = [ex for ex in examples if ex.id not in finished]
    if len(todo) < len(examples):
        print(f"  {len(examples) - len(todo)} questions already mined: pools not rebuilt")
    builder, chunked = PoolBuilder(cfg.mining.pool), Chunker(cfg.retrieval.chunking).chunk_all(todo)
    pools = [builder.build(item) for item in with_progress(chunked, "pools")]

    tracker = Tracker.for_job(cfg, out, "mine")
    if cfg.mining.miner == "human":
        print(
            f"[2/3] the datasets' own evidence as the sets of {len(examples)} questions", flush=True
        )
        records = write_human_gold(pools, out / "mined.jsonl", cfg)
    else:
        print(f"[2/3] mining with the {cfg.mining.miner} miner on {cfg.model.name}", flush=True)
        init_ray(cfg.ray.address, cfg.ray.num_cpus)
        eng = cfg.model.engine
        records = mine_pools(
            pools,
            worker_spec(cfg),
            out,
            num_actors=eng.num_actors,
            num_cpus=eng.num_cpus_per_actor,
            num_gpus=eng.num_gpus_per_actor,
            examples_per_task=cfg.mining.examples_per_task,
            on_progress=tracker.log,
        )

    print("[3/3] summary and agreement with human gold evidence", flush=True)
    wanted = {ex.id for ex in examples}
    summary = summarize([r for r in records.values() if r["id"] in wanted])
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    table = render(summary)
    (out / "summary.md").write_text(table + "\n")
    tracker.summary({f"{k}/{name}": v for name, s in summary.items() for k, v in s.items()})
    tracker.log_artifact(out / "mined.jsonl", "dataset")
    tracker.finish()
    print(f"\n{table}\n\nmined dataset: {out / 'mined.jsonl'}\nsummary: {out / 'summary.md'}")
    return summary
