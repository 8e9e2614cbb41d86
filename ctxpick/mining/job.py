"""The mining job: shard pools over engine actors on every node, stream 1-minimal evidence sets
to an append-only JSONL keyed by example id.

Fault tolerance is the driver's: it alone writes the output, so an example is written at most
once; a dead actor is replaced and its in-flight examples go back to the queue; a re-run reads
the output, repairs a torn last line, and mines only the ids that are missing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from ctxpick.data.schema import Pool
from ctxpick.engines.base import Engine, SamplingConfig
from ctxpick.engines.dispatch import dispatch
from ctxpick.engines.http_engine import HTTPEngine, HTTPEngineConfig, HTTPEngineUnavailable
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
            except HTTPEngineUnavailable as err:  # the driver retries it (ctxpick/engines/dispatch)
                error = f"{type(err).__name__}: {err}"
                out.append({"id": pool.example_id, "error": error, "transient": True})
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
    todo = [p for p in dict((p.example_id, p) for p in pools).values() if p.example_id not in done]
    progress = Progress(total=len(todo), t0=time.time())
    print(f"  {len(done)} examples already mined, {len(todo)} to go", flush=True)
    if not todo:
        return read_done(mined_path)

    options = {
        "num_cpus": num_cpus,
        "num_gpus": num_gpus,
        "scheduling_strategy": "SPREAD",  # one engine per node/GPU before doubling up
        "runtime_env": {"env_vars": engine_actor_env(num_cpus, num_gpus)},
        "max_restarts": 0,  # the driver replaces dead actors and redoes their examples
    }
    started: list[ray.actor.ActorHandle] = []

    def start_actor() -> ray.actor.ActorHandle:
        named = ray.remote(MiningWorker).options(
            name=f"ctxpick-miner-{len(started) + 1}", **options
        )
        started.append(named.remote(spec))
        return started[-1]

    actors = [start_actor() for _ in range(min(num_actors, len(todo)))]
    units = [todo[i : i + examples_per_task] for i in range(0, len(todo), examples_per_task)]
    mined, rejects = JsonlWriter(mined_path), JsonlWriter(rejects_path)
    last_error: dict[str, str] = {}  # the transient failure an example is being redone for

    def record(batch: list[Pool], records: list[dict[str, Any]]) -> list[Pool] | None:
        """Write finished records; return the pools whose failure was transient, to redo."""
        redo = {r["id"] for r in records if r.get("transient")}
        last_error.update((r["id"], r["error"]) for r in records if r.get("transient"))
        for rec in records:
            if rec["id"] in done or rec["id"] in redo:
                continue
            (rejects if "error" in rec else mined).write(rec)
            done[rec["id"]] = rec
            progress.add(rec)
        print(progress.line(), flush=True)
        if on_progress:
            on_progress(progress.metrics())
        return [p for p in batch if p.example_id in redo] or None

    def poison(batch: list[Pool], why: str) -> None:
        for pool in batch:
            last = last_error.get(pool.example_id)
            record([pool], [{"id": pool.example_id, "error": f"{why}: {last}" if last else why}])

    def replace() -> ray.actor.ActorHandle:
        progress.replaced += 1
        return start_actor()

    try:
        dispatch(
            units,
            actors,
            lambda actor, batch: actor.mine.remote(batch),
            record,
            replace=replace,
            on_poison=poison,
        )
    finally:
        mined.close()
        rejects.close()
        for actor in started:
            ray.kill(actor)
    return read_done(mined_path)
