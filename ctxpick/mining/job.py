"""The mining job: shard pools over engine actors on every node, stream 1-minimal evidence sets
to an append-only JSONL keyed by example id.

Fault tolerance is the driver's: it alone writes the output, so an example is written at most
once; a dead actor is replaced and its in-flight examples go back to the queue; a re-run reads
the output, repairs a torn last line, and mines only the ids that are missing.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from ctxpick.data.schema import Pool
from ctxpick.engines.base import Engine, SamplingConfig
from ctxpick.engines.http_engine import HTTPEngine, HTTPEngineConfig
from ctxpick.engines.vllm_engine import engine_actor_env
from ctxpick.jsonl import JsonlWriter, read_done
from ctxpick.judge.judges import JudgeConfig, make_judge
from ctxpick.mining.miners import MINERS, GeneratorOracle
from ctxpick.mining.rewrites import assign_split, make_rewrites


@dataclass
class WorkerSpec:
    """Everything a mining actor needs; plain data so Ray can ship it to any node."""

    model: str
    backend: str  # vllm | http
    engine_kwargs: dict[str, Any]
    http: HTTPEngineConfig
    judge: JudgeConfig
    miner: str
    sampling: SamplingConfig
    system: str
    rewrites: int
    rewrite_system: str
    rewrite_temperature: float
    split_ratios: tuple[float, float, float]
    seed: int


class MiningWorker:
    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        if spec.backend == "http":
            self.engine: Engine = HTTPEngine(spec.http)
        else:
            from ctxpick.engines.vllm_engine import VLLMEngine

            self.engine = VLLMEngine(spec.model, seed=spec.seed, **spec.engine_kwargs)
        self.judge = make_judge(spec.judge, self.engine)

    def ready(self) -> bool:
        return True

    def mine(self, pools: list[Pool]) -> list[dict[str, Any]]:
        out = []
        for pool in pools:
            try:
                out.append(self._mine_one(pool))
            except Exception as err:  # a bad example must not take the others down
                out.append({"id": pool.example_id, "error": f"{type(err).__name__}: {err}"})
        return out

    def _mine_one(self, pool: Pool) -> dict[str, Any]:
        spec, llm_before = self.spec, self.judge.llm_calls
        oracle = GeneratorOracle(pool, self.engine, self.judge, spec.sampling, spec.system)
        res = MINERS[spec.miner](oracle, len(pool.passages))
        rewrites: list[str] = []
        if res.kept and spec.rewrites:
            rewrites = make_rewrites(
                self.engine,
                [pool.question],
                spec.rewrites,
                system=spec.rewrite_system,
                temperature=spec.rewrite_temperature,
                seed=spec.seed,
            )[0]
        full = tuple(range(len(pool.passages)))
        in_pool = {p.pid for p in pool.passages}
        return {
            "id": pool.example_id,
            "dataset": pool.dataset,
            "question": pool.question,
            "answers": pool.answers,
            "unanswerable": bool(pool.meta.get("unanswerable")),
            "pool": [
                {"pid": p.pid, "title": p.title, "text": p.text, "score": s}
                for p, s in zip(pool.passages, pool.scores, strict=True)
            ],
            "kept": res.kept,
            "discard_reason": res.reason,
            "gold_minimal": [pool.passages[i].pid for i in res.selected] if res.kept else None,
            "human_gold": None
            if pool.gold_pids is None
            else [pid for pid in pool.gold_pids if pid in in_pool],
            "human_gold_total": None if pool.gold_pids is None else len(pool.gold_pids),
            "answer_full_pool": oracle.answers.get(full, ""),
            "answer_minimal": oracle.answers.get(res.selected, "") if res.kept else "",
            "rewrites": rewrites,
            "split": assign_split(pool.example_id, spec.seed, spec.split_ratios),
            "stats": {
                "miner": spec.miner,
                "calls": res.calls,
                "prompts": res.prompts,
                "judge_llm_calls": self.judge.llm_calls - llm_before,
                "rounds": res.rounds,
                "seconds": round(res.seconds, 3),
            },
            "meta": pool.meta,
        }


@dataclass
class Progress:
    total: int
    done: int = 0
    kept: int = 0
    discarded: int = 0
    rejected: int = 0
    calls: int = 0
    replaced: int = 0
    t0: float = 0.0

    def add(self, rec: dict[str, Any]) -> None:
        self.done += 1
        if "error" in rec:
            self.rejected += 1
            return
        self.kept += rec["kept"]
        self.discarded += not rec["kept"]
        self.calls += rec["stats"]["calls"]

    def metrics(self) -> dict[str, float]:
        mined = max(self.kept + self.discarded, 1)
        return {
            "examples_done": self.done,
            "kept": self.kept,
            "discarded": self.discarded,
            "rejected": self.rejected,
            "calls_per_example": self.calls / mined,
            "examples_per_s": self.done / max(time.time() - self.t0, 1e-9),
            "actors_replaced": self.replaced,
        }

    def line(self) -> str:
        m = self.metrics()
        return (
            f"  mined {self.done}/{self.total} | kept {self.kept} discarded {self.discarded} "
            f"rejected {self.rejected} | {m['calls_per_example']:.1f} calls/example | "
            f"{m['examples_per_s']:.2f} examples/s | actors replaced {self.replaced}"
        )


def mine_pools(
    pools: list[Pool],
    spec: WorkerSpec,
    out_dir: Path,
    *,
    num_actors: int,
    num_cpus: float,
    num_gpus: float,
    examples_per_task: int = 1,
    on_progress: Any = None,
) -> dict[str, dict[str, Any]]:
    """Mine every pool whose id is not yet in ``out_dir/mined.jsonl``; return all records."""
    out_dir.mkdir(parents=True, exist_ok=True)
    mined_path, rejects_path = out_dir / "mined.jsonl", out_dir / "mining_rejects.jsonl"
    done = read_done(mined_path) | read_done(rejects_path)
    queue = deque(
        p for p in dict((p.example_id, p) for p in pools).values() if p.example_id not in done
    )
    progress = Progress(total=len(queue), t0=time.time())
    print(f"  {len(done)} examples already mined, {len(queue)} to go", flush=True)
    if not queue:
        return read_done(mined_path)

    options = {
        "num_cpus": num_cpus,
        "num_gpus": num_gpus,
        "scheduling_strategy": "SPREAD",  # one engine per node/GPU before doubling up
        "runtime_env": {"env_vars": engine_actor_env(num_cpus, num_gpus)},
        "max_restarts": 0,  # the driver replaces dead actors and redoes their examples
    }
    generation = 0

    def start_actor() -> ray.actor.ActorHandle:
        nonlocal generation
        generation += 1
        named = ray.remote(MiningWorker).options(name=f"ctxpick-miner-{generation}", **options)
        return named.remote(spec)

    idle = [start_actor() for _ in range(min(num_actors, len(queue)))]
    inflight: dict[ray.ObjectRef, tuple[ray.actor.ActorHandle, list[Pool]]] = {}
    mined, rejects = JsonlWriter(mined_path), JsonlWriter(rejects_path)
    try:
        while queue or inflight:
            while queue and idle:
                batch = [queue.popleft() for _ in range(min(examples_per_task, len(queue)))]
                actor = idle.pop()
                inflight[actor.mine.remote(batch)] = (actor, batch)
            ready, _ = ray.wait(list(inflight), num_returns=1)
            actor, batch = inflight.pop(ready[0])
            try:
                records = ray.get(ready[0])
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as err:
                print(
                    f"  actor died ({type(err).__name__}); replacing it, redoing "
                    f"{len(batch)} example(s)",
                    flush=True,
                )
                progress.replaced += 1
                queue.extendleft(reversed(batch))
                idle.append(start_actor())
                continue
            idle.append(actor)
            for rec in records:
                if rec["id"] in done:
                    continue
                (rejects if "error" in rec else mined).write(rec)
                done[rec["id"]] = rec
                progress.add(rec)
            print(progress.line(), flush=True)
            if on_progress:
                on_progress(progress.metrics())
    finally:
        mined.close()
        rejects.close()
        for actor in idle + [a for a, _ in inflight.values()]:
            ray.kill(actor)
    return read_done(mined_path)
