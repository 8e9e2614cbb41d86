"""Reference miner (the paper's Algorithm 1) against the fast miner on the same real pools,
with the same vLLM engine and judge, in one run. Pools use the default config (semantic
chunking, mining pool of k=20 over question + answer).

Every kept output is then certified 1-minimal from scratch by a fresh oracle (no memo): the
set and each single removal, in one batched call as the miners ask. A second check sends each of
those prompts alone, which shows how often batch composition changes a greedy answer.
Run: .venv/bin/python benchmarks/bench_mining.py [--pools 30 --k 20 --model smollm2-135m]
"""

from __future__ import annotations

import argparse
import time

from common import data_file

from ctxpick.config import compose
from ctxpick.data.loaders import load_examples
from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.vllm_engine import VLLMEngine
from ctxpick.judge.judges import Judge, JudgeConfig
from ctxpick.mining.miners import MINERS, GeneratorOracle, is_one_minimal
from ctxpick.retrieval.chunking import Chunker
from ctxpick.retrieval.pools import PoolBuilder


class OnePromptPerCall:
    """Certification runs each prompt alone, so batching cannot hide a disagreement."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine = engine

    def generate(self, chats, sampling):
        return [self.engine.generate([c], sampling)[0] for c in chats]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pools", type=int, default=30)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--skip-alone", action="store_true", help="skip the one-prompt-per-call check")
    args = ap.parse_args()

    path = data_file("hotpotqa/migres_hotpot_200.jsonl", "hotpotqa_distractor_30.jsonl")
    exs = load_examples(path, "hotpotqa", limit=args.pools).examples
    cfg = compose([f"mining.pool.k={args.k}"])
    items = Chunker(cfg.retrieval.chunking).chunk_all(exs)
    pools = [PoolBuilder(cfg.mining.pool).build(i) for i in items]
    engine = VLLMEngine(args.model, max_model_len=4096)
    sampling = SamplingConfig(temperature=0.0, max_tokens=24, seed=0)
    sizes = sorted(len(p.passages) for p in pools)
    print(
        f"{len(pools)} HotpotQA pools of {sizes[0]}-{sizes[-1]} semantic chunks; "
        f"{args.model}; rules judge"
    )

    results = {}
    for name, miner in MINERS.items():
        engine.llm.reset_prefix_cache()  # neither miner inherits the other's cache
        t0 = time.perf_counter()
        runs = []
        for pool in pools:
            oracle = GeneratorOracle(pool, engine, Judge(JudgeConfig(mode="rules")), sampling)
            runs.append(miner(oracle, len(pool.passages)))
        results[name] = (runs, time.perf_counter() - t0)

    def certified(runs: list, generator: object) -> int:
        judge = Judge(JudgeConfig(mode="rules"))
        return sum(
            is_one_minimal(GeneratorOracle(pool, generator, judge, sampling), res.selected)
            for pool, res in zip(pools, runs, strict=True)
            if res.kept
        )

    for name, (runs, _) in results.items():
        kept = sum(r.kept for r in runs)
        batched = certified(runs, engine)
        alone = "skipped" if args.skip_alone else certified(runs, OnePromptPerCall(engine))
        print(
            f"{name:10s} kept {kept}/{len(runs)}, certified 1-minimal {batched}/{kept} "
            f"(prompts sent alone: {alone}/{kept}), "
            f"mean |S| {sum(len(r.selected) for r in runs if r.kept) / max(kept, 1):.2f}"
        )

    (ref, ref_s), (fast, fast_s) = results["reference"], results["fast"]
    same = sum(a.selected == b.selected for a, b in zip(ref, fast, strict=True) if a.kept)
    print(f"same set from both miners: {same}/{sum(r.kept for r in ref)}")

    def seconds(runs: list, kept: bool) -> float:
        return sum(r.seconds for r in runs if r.kept == kept)

    rows = [
        ("generator calls", sum(r.calls for r in ref), sum(r.calls for r in fast)),
        ("prompts generated", sum(r.prompts for r in ref), sum(r.prompts for r in fast)),
        ("wall time (s)", ref_s, fast_s),
        # Both miners discard a pool after the same single full-pool call.
        ("  on kept pools", seconds(ref, True), seconds(fast, True)),
        ("  on discarded pools", seconds(ref, False), seconds(fast, False)),
    ]
    print(f"{'':20s} {'reference':>12s} {'fast':>12s} {'ratio':>8s}")
    for label, a, b in rows:
        print(f"{label:20s} {a:12.1f} {b:12.1f} {a / b:7.2f}x")


if __name__ == "__main__":
    main()
