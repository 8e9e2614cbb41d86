"""`ctxpick mine`: data -> chunks -> mining pools -> the distributed mining job -> report."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ctxpick.config import Config
from ctxpick.data.loaders import load_sources
from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.ray_pool import init_ray
from ctxpick.mining.job import WorkerSpec, mine_pools
from ctxpick.mining.report import render, summarize
from ctxpick.retrieval.chunking import Chunker
from ctxpick.retrieval.pools import PoolBuilder
from ctxpick.tracking import Tracker


def worker_spec(cfg: Config) -> WorkerSpec:
    eng = cfg.model.engine
    return WorkerSpec(
        model=cfg.model.name,
        backend=cfg.model.backend,
        engine_kwargs={
            "max_model_len": eng.max_model_len,
            "cpu_kv_cache_gb": eng.cpu_kv_cache_gb,
            "gpu_memory_utilization": eng.gpu_memory_utilization,
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


def run_mining(cfg: Config) -> dict[str, dict[str, Any]]:
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    print("[1/3] loading data, chunking, mining pools", flush=True)
    examples = load_sources(cfg.data.sources, cfg.data.strict, out / "rejects.jsonl")
    chunked = Chunker(cfg.retrieval.chunking).chunk_all(examples)
    builder = PoolBuilder(cfg.mining.pool)
    pools = [builder.build(c) for c in chunked]

    print(f"[2/3] mining with the {cfg.mining.miner} miner on {cfg.model.name}", flush=True)
    init_ray(cfg.ray.address, cfg.ray.num_cpus)
    tracker = Tracker(cfg.wandb.project, cfg.wandb.mode, str(out), "mine", asdict(cfg))
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
    wanted = {p.example_id for p in pools}
    summary = summarize([r for r in records.values() if r["id"] in wanted])
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    table = render(summary)
    (out / "summary.md").write_text(table + "\n")
    tracker.summary({f"{k}/{name}": v for name, s in summary.items() for k, v in s.items()})
    tracker.log_artifact(out / "mined.jsonl", "dataset")
    tracker.finish()
    print(f"\n{table}\n\nmined dataset: {out / 'mined.jsonl'}\nsummary: {out / 'summary.md'}")
    return summary
