"""Reference miner (the paper's Algorithm 1) against the fast miner on the same real pools,
with the same vLLM engine and judge, in one run.

Every kept output is then certified 1-minimal from scratch: a fresh oracle (no memo) re-asks
the generator, one prompt per call, for the set and for each single removal.
Run: .venv/bin/python benchmarks/bench_mining.py [--pools 30 --k 10 --model smollm2-135m]
"""

from __future__ import annotations

import argparse
import time

from common import data_file

from ctxpick.data.loaders import load_examples
from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.vllm_engine import VLLMEngine
from ctxpick.judge.judges import Judge, JudgeConfig
from ctxpick.mining.miners import MINERS, GeneratorOracle, is_one_minimal
from ctxpick.retrieval.chunking import Chunker, ChunkingConfig
from ctxpick.retrieval.pools import PoolBuilder, PoolConfig


class OnePromptPerCall:
    """Certification runs each prompt alone, so batching cannot hide a disagreement."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine = engine

    def generate(self, chats, sampling):
        return [self.engine.generate([c], sampling)[0] for c in chats]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pools", type=int, default=30)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--model", default="smollm2-135m")
    args = ap.parse_args()

    path = data_file("hotpotqa/migres_hotpot_200.jsonl", "hotpotqa_distractor_30.jsonl")
    exs = load_examples(path, "hotpotqa", limit=args.pools).examples
    items = Chunker(ChunkingConfig(method="none")).chunk_all(exs)
    pools = [PoolBuilder(PoolConfig(k=args.k, query="question_answer")).build(i) for i in items]
    engine = VLLMEngine(args.model, max_model_len=4096)
    sampling = SamplingConfig(temperature=0.0, max_tokens=24, seed=0)
    print(f"{len(pools)} HotpotQA pools of {args.k} passages; {args.model}; rules judge")

    results = {}
    for name, miner in MINERS.items():
        engine.llm.reset_prefix_cache()  # neither miner inherits the other's cache
        t0 = time.perf_counter()
        runs = []
        for pool in pools:
            oracle = GeneratorOracle(pool, engine, Judge(JudgeConfig(mode="rules")), sampling)
            runs.append(miner(oracle, len(pool.passages)))
        results[name] = (runs, time.perf_counter() - t0)

    certifier = OnePromptPerCall(engine)
    for name, (runs, _) in results.items():
        certified = 0
        for pool, res in zip(pools, runs, strict=True):
            if res.kept:
                fresh = GeneratorOracle(pool, certifier, Judge(JudgeConfig(mode="rules")), sampling)
                certified += is_one_minimal(fresh, res.selected)
        kept = sum(r.kept for r in runs)
        print(
            f"{name:10s} kept {kept}/{len(runs)}, certified 1-minimal {certified}/{kept}, "
            f"mean |S| {sum(len(r.selected) for r in runs if r.kept) / max(kept, 1):.2f}"
        )

    (ref, ref_s), (fast, fast_s) = results["reference"], results["fast"]
    same = sum(a.selected == b.selected for a, b in zip(ref, fast, strict=True) if a.kept)
    print(f"same set from both miners: {same}/{sum(r.kept for r in ref)}")
    rows = [
        ("generator calls", sum(r.calls for r in ref), sum(r.calls for r in fast)),
        ("prompts generated", sum(r.prompts for r in ref), sum(r.prompts for r in fast)),
        ("wall time (s)", ref_s, fast_s),
    ]
    print(f"{'':20s} {'reference':>12s} {'fast':>12s} {'ratio':>8s}")
    for label, a, b in rows:
        print(f"{label:20s} {a:12.1f} {b:12.1f} {a / b:7.2f}x")


if __name__ == "__main__":
    main()
