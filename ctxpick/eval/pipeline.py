"""The main job: load -> chunk -> pools -> generate from the full pool -> judge -> summary."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

from ctxpick.config import Config
from ctxpick.data.loaders import load_sources
from ctxpick.data.schema import Pool
from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.prompts import answer_chat
from ctxpick.engines.ray_pool import EnginePool, init_ray, print_progress
from ctxpick.judge.judges import JudgeItem, make_judge
from ctxpick.judge.rules import token_f1
from ctxpick.retrieval.chunking import Chunker
from ctxpick.retrieval.pools import PoolBuilder
from ctxpick.table import markdown_table


@dataclass
class Row:
    dataset: str
    questions: int
    passages_per_pool: float
    mining_recall: float | None
    inference_recall: float | None
    accuracy: float
    f1: float
    prompt_tokens: float

    HEADER = (
        "dataset",
        "questions",
        "passages/pool",
        "gold recall@k (q+a)",
        "gold recall@k (q)",
        "accuracy (full pool)",
        "F1",
        "prompt tokens",
    )

    def cells(self) -> list[str]:
        def pct(x: float | None) -> str:
            return "n/a" if x is None else f"{100 * x:.1f}%"

        return [
            self.dataset,
            str(self.questions),
            f"{self.passages_per_pool:.1f}",
            pct(self.mining_recall),
            pct(self.inference_recall),
            pct(self.accuracy),
            f"{100 * self.f1:.1f}",
            f"{self.prompt_tokens:.0f}",
        ]


def render_table(rows: list[Row]) -> str:
    return markdown_table([list(Row.HEADER)] + [r.cells() for r in rows])


def _recall(pools: list[Pool]) -> float | None:
    values = [p.gold_recall for p in pools if p.gold_recall is not None]
    return mean(values) if values else None


def run_demo(cfg: Config) -> list[Row]:
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    print("[1/4] loading data", flush=True)
    examples = load_sources(cfg.data.sources, cfg.data.strict, out / "rejects.jsonl")

    print(f"[2/4] chunking ({cfg.retrieval.chunking.method}) and BM25 pools", flush=True)
    chunked = Chunker(cfg.retrieval.chunking).chunk_all(examples)
    mining_pools = [PoolBuilder(cfg.mining.pool).build(c) for c in chunked]
    inference_pools = [PoolBuilder(cfg.retrieval.pool).build(c) for c in chunked]

    print(f"[3/4] generating answers from the full pool with {cfg.model.name}", flush=True)
    init_ray(cfg.ray.address, cfg.ray.num_cpus)
    eng = cfg.model.engine
    engines = EnginePool.start(
        cfg.model.name,
        eng.num_actors,
        num_cpus=eng.num_cpus_per_actor,
        num_gpus=eng.num_gpus_per_actor,
        max_model_len=eng.max_model_len,
        cpu_kv_cache_gb=eng.cpu_kv_cache_gb,
        gpu_memory_utilization=eng.gpu_memory_utilization,
        seed=cfg.seed,
    )
    chats = [answer_chat(p.question, p.passages, cfg.generator.system) for p in mining_pools]
    sampling = SamplingConfig(
        temperature=cfg.generator.temperature, max_tokens=cfg.generator.max_tokens, seed=cfg.seed
    )
    completions = engines.generate(chats, sampling, eng.batch_size, print_progress("generate"))
    preds = [c[0].text.strip() for c in completions]

    print(f"[4/4] judging ({cfg.judge.mode})", flush=True)
    judge = make_judge(cfg.judge, engines)
    verdicts = judge(
        [
            JudgeItem(p.question, tuple(p.answers), pred, bool(p.meta.get("unanswerable")))
            for p, pred in zip(mining_pools, preds, strict=True)
        ]
    )
    engines.shutdown()
    by_dataset: dict[str, list[dict]] = defaultdict(list)
    with (out / "examples.jsonl").open("a", encoding="utf-8") as fh:
        for pool, ipool, comp, pred, ok in zip(
            mining_pools, inference_pools, completions, preds, verdicts, strict=True
        ):
            rec = {
                "id": pool.example_id,
                "dataset": pool.dataset,
                "question": pool.question,
                "answers": pool.answers,
                "prediction": pred,
                "correct": ok,
                "f1": token_f1(pred, pool.answers),
                "pool_size": len(pool.passages),
                "prompt_tokens": comp[0].prompt_tokens,
                "mining_recall": pool.gold_recall,
                "inference_recall": ipool.gold_recall,
            }
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            by_dataset[pool.dataset].append({**rec, "_pool": pool, "_ipool": ipool})

    rows = [
        Row(
            dataset=name,
            questions=len(recs),
            passages_per_pool=mean(r["pool_size"] for r in recs),
            mining_recall=_recall([r["_pool"] for r in recs]),
            inference_recall=_recall([r["_ipool"] for r in recs]),
            accuracy=mean(float(r["correct"]) for r in recs),
            f1=mean(r["f1"] for r in recs),
            prompt_tokens=mean(r["prompt_tokens"] for r in recs),
        )
        for name, recs in by_dataset.items()
    ]
    table = render_table(rows)
    (out / "summary.md").write_text(table + "\n", encoding="utf-8")
    print(f"\n{table}\n")
    print(
        f"k = {cfg.mining.pool.k} (q+a pool, used for generation) / {cfg.retrieval.pool.k} (q pool)"
    )
    print(f"per-example results: {out / 'examples.jsonl'}   table: {out / 'summary.md'}")
    print(f"done in {time.time() - t0:.0f}s")
    return rows
