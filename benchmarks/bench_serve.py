"""`ctxpick serve` against plain vLLM on the same prompts, in one run.

Real HotpotQA questions with their BM25 pools (the picker's shown passages) become pick
requests. For each concurrency level a fresh slice of questions (so no level is served from
another's prefix cache) goes through the service over HTTP: throughput, p50/p95 latency and
the batch sizes the service formed (its /metrics), and how much of the wall time the engine
spent in calls (from each response's engine-call time), which splits the service's overhead
into time between engine calls and a slower engine inside the replica. Then the service is
shut down and plain vLLM ``generate`` gets each slice's exact picker prompts in one call (its
best configuration: vLLM schedules the whole slice itself), on an engine with the same CPUs.

Run: .venv/bin/python benchmarks/bench_serve.py [--picker smollm2-135m]
     [--requests 12,40,96] [--batch-wait 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time

import httpx
from common import data_file

from ctxpick.config import compose
from ctxpick.data.loaders import load_examples
from ctxpick.engines.base import SamplingConfig
from ctxpick.picker.inference import load_spec
from ctxpick.picker.selection import as_passages
from ctxpick.retrieval.chunking import Chunker, ChunkingConfig
from ctxpick.retrieval.pools import PoolBuilder, PoolConfig

LEVELS = (1, 8, 32)


def requests_from_data(n: int, k: int) -> list[dict]:
    path = data_file("hotpotqa/migres_hotpot_200.jsonl", "hotpotqa_distractor_30.jsonl")
    exs = load_examples(path, "hotpotqa", limit=n).examples
    if len(exs) < n:
        raise SystemExit(f"{path} has {len(exs)} questions; ask for fewer with --requests")
    chunked = Chunker(ChunkingConfig(method="window", window_words=60)).chunk_all(exs)
    builder = PoolBuilder(PoolConfig(k=k))
    out = []
    for item in chunked:
        pool = builder.build(item)
        passages = [{"id": p.pid, "text": p.text, "title": p.title} for p in pool.passages]
        out.append({"question": pool.question, "passages": passages})
    return out


def batch_histogram(metrics: str) -> tuple[float, float]:
    """(sum, count) of ctxpick_batch_size in a /metrics text."""
    total = float(re.search(r"^ctxpick_batch_size_sum (\S+)", metrics, re.M).group(1))
    count = float(re.search(r"^ctxpick_batch_size_count (\S+)", metrics, re.M).group(1))
    return total, count


async def drive(url: str, bodies: list[dict], concurrency: int) -> tuple[float, list[float], float]:
    """Wall seconds, each request's latency, and the seconds the engine spent in calls (each
    response carries its batch's engine-call time; a batch's requests share it)."""
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    engine_ms: set[float] = set()

    async with httpx.AsyncClient(base_url=url, timeout=3600) as client:

        async def one(body: dict) -> None:
            async with gate:
                t = time.perf_counter()
                r = await client.post("/v1/pick", json=body)
                r.raise_for_status()
                latencies.append(time.perf_counter() - t)
                engine_ms.add(r.json()["latency_ms"])

        t0 = time.perf_counter()
        await asyncio.gather(*[one(b) for b in bodies])
        return time.perf_counter() - t0, latencies, sum(engine_ms) / 1000


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--picker", default="smollm2-135m")
    ap.add_argument("--requests", default="12,40,96", help="requests at concurrency 1,8,32")
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the one engine (both sides)")
    ap.add_argument("--batch-wait", type=float, default=0.1, help="serve.batch_wait_timeout_s")
    args = ap.parse_args()
    sizes = [int(x) for x in args.requests.split(",")]
    folder, spec = load_spec(args.picker)
    bodies = requests_from_data(sum(sizes), spec.max_passages)
    slices, start = [], 0
    for n in sizes:
        slices.append(bodies[start : start + n])
        start += n

    import ray
    from ray import serve

    from ctxpick.engines.ray_pool import init_ray
    from ctxpick.serve.app import start as start_service

    init_ray(num_cpus=args.cpus + 2)
    cfg = compose(
        [
            f"serve.picker={args.picker}",
            "serve.port=8477",
            "serve.max_batch_size=32",
            f"serve.batch_wait_timeout_s={args.batch_wait}",
            f"serve.num_cpus_per_replica={args.cpus}",
            "serve.audit.path=",
        ]
    ).serve
    url = start_service(cfg, blocking=False)
    httpx.post(f"{url}/v1/pick", json=requests_from_data(1, 2)[0], timeout=600)  # warm-up
    rows = []
    for level, part in zip(LEVELS, slices, strict=True):
        before = batch_histogram(httpx.get(f"{url}/metrics").text)
        wall, lat, busy = asyncio.run(drive(url, part, level))
        after = batch_histogram(httpx.get(f"{url}/metrics").text)
        batches = after[1] - before[1]
        mean_batch = (after[0] - before[0]) / batches if batches else 0.0
        rows.append(
            {
                "concurrency": level,
                "requests": len(part),
                "rps": len(part) / wall,
                "p50": pct(lat, 50),
                "p95": pct(lat, 95),
                "batch": mean_batch,
                "engine_rps": len(part) / busy,  # while the engine was in a call
                "engine_share": busy / wall,
            }
        )
        print(f"service c={level}: {rows[-1]}", flush=True)
    serve.shutdown()

    from ctxpick.engines.vllm_engine import start_engine_actor

    engine = start_engine_actor(folder, num_cpus=args.cpus, max_model_len=4096, cpu_kv_cache_gb=1)
    greedy = SamplingConfig(temperature=0.0, max_tokens=spec.max_tokens)
    ray.get(engine.generate.remote([spec.chat("warm up", as_passages(["x"]))], greedy))
    for row, part in zip(rows, slices, strict=True):
        chats = [spec.chat(b["question"], as_passages(b["passages"])) for b in part]
        ray.get(engine.reset_prefix_cache.remote())  # each pass pays for its prefills
        t = time.perf_counter()
        ray.get(engine.generate.remote(chats, greedy))
        row["plain_rps"] = len(part) / (time.perf_counter() - t)
        # and in calls of `concurrency` prompts: the service's own overhead at its batch size
        c = row["concurrency"]
        ray.get(engine.reset_prefix_cache.remote())
        t = time.perf_counter()
        for i in range(0, len(chats), c):
            ray.get(engine.generate.remote(chats[i : i + c], greedy))
        row["plain_c_rps"] = len(part) / (time.perf_counter() - t)
        print(
            f"plain vLLM, {len(part)} prompts: {row['plain_rps']:.2f}/s at once, "
            f"{row['plain_c_rps']:.2f}/s in calls of {c}",
            flush=True,
        )

    print(
        f"\npicker {args.picker}; {args.cpus} CPUs per engine; one engine replica; "
        f"max_batch_size 32, batch_wait_timeout_s {args.batch_wait}"
    )
    print(
        "| concurrency | requests | service req/s | plain vLLM, all at once | ratio "
        "| plain vLLM, calls of c | ratio | p50 s | p95 s | mean batch "
        "| engine busy | service req/s while busy |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['concurrency']} | {r['requests']} | {r['rps']:.2f} | {r['plain_rps']:.2f} "
            f"| {r['rps'] / r['plain_rps']:.2f} | {r['plain_c_rps']:.2f} "
            f"| {r['rps'] / r['plain_c_rps']:.2f} | {r['p50']:.2f} | {r['p95']:.2f} "
            f"| {r['batch']:.1f} | {r['engine_share']:.0%} | {r['engine_rps']:.2f} |"
        )


if __name__ == "__main__":
    main()
