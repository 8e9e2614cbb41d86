"""End to end: BM25 over a bundled corpus -> the picker service -> a generator behind vLLM's
OpenAI-compatible server. Prints each answer from the picked passages and from the whole
retrieved pool, with the prompt tokens the generator's server counted for both.

    .venv/bin/python examples/rag_pipeline.py                      # starts both servers here
    .venv/bin/python examples/rag_pipeline.py --picker-url http://127.0.0.1:8000 \\
        --generator-url http://127.0.0.1:8001/v1 --generator-model NAME   # servers you run

The corpus is every passage of the bundled HotpotQA sample (30 questions' documents, chunked),
so each question's retrieval competes with every other question's passages.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import httpx

from ctxpick.config import SAMPLES_DIR
from ctxpick.data.loaders import load_examples
from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.http_engine import HTTPEngine, HTTPEngineConfig
from ctxpick.engines.models import resolve
from ctxpick.engines.prompts import answer_chat
from ctxpick.judge.rules import rule_judge
from ctxpick.retrieval.bm25 import build_index, tokenize, top_k
from ctxpick.retrieval.chunking import Chunker, ChunkingConfig
from ctxpick.serve.client import PickerClient


def start_generator(model: str, port: int) -> tuple[subprocess.Popen, str]:
    """`vllm serve` on the built-in model; returns the process and its /v1 URL once healthy."""
    folder = resolve(model)
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
         "--served-model-name", model, "--host", "127.0.0.1", "--port", str(port),
         "--max-model-len", "4096", "--dtype", "bfloat16"],
        env={**__import__("os").environ, "VLLM_CPU_KVCACHE_SPACE": "2"},
    )  # fmt: skip
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vllm serve exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc, f"http://127.0.0.1:{port}/v1"
        except httpx.TransportError:
            pass
        time.sleep(2)
    proc.terminate()
    raise SystemExit("vllm serve did not become healthy in 10 minutes")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=5)
    ap.add_argument("--k", type=int, default=8, help="passages retrieved per question")
    ap.add_argument("--picker", default="smollm2-135m", help="what `ctxpick serve` serves")
    ap.add_argument("--picker-url", help="a running `ctxpick serve` (else one starts here)")
    ap.add_argument("--generator-url", help="a running OpenAI-compatible /v1 (else vllm serve)")
    ap.add_argument("--generator-model", default="qwen2.5-coder-0.5b")
    args = ap.parse_args()

    exs = load_examples(SAMPLES_DIR / "hotpotqa_distractor_30.jsonl", "hotpotqa").examples
    corpus = [p for c in Chunker(ChunkingConfig(method="window", window_words=60)).chunk_all(exs)
              for p in c.passages]  # fmt: skip
    index = build_index([tokenize(f"{p.title} {p.text}") for p in corpus])

    procs = []
    picker_url = args.picker_url
    if not picker_url:
        from ctxpick.config import compose
        from ctxpick.serve.app import start

        cfg = compose([f"serve.picker={args.picker}", "serve.port=8478", "serve.audit.path="])
        picker_url = start(cfg.serve, blocking=False)
    generator_url = args.generator_url
    if not generator_url:
        proc, generator_url = start_generator(args.generator_model, 8479)
        procs.append(proc)
    picker = PickerClient(picker_url)
    generator = HTTPEngine(HTTPEngineConfig(base_url=generator_url, model=args.generator_model))
    greedy = SamplingConfig(temperature=0.0, max_tokens=32)

    saved, total = 0, 0
    try:
        for ex in exs[: args.questions]:
            hits = [corpus[i] for i in top_k(index.get_scores(tokenize(ex.question)), args.k)]
            candidates = [{"id": p.pid, "text": p.text, "title": p.title} for p in hits]
            sel = picker.pick(ex.question, candidates)
            picked = [hits[i] for i in sel.indices]
            both = generator.generate(
                [answer_chat(ex.question, picked), answer_chat(ex.question, hits)], greedy
            )
            (with_pick,), (with_pool,) = both
            saved += with_pool.prompt_tokens - with_pick.prompt_tokens
            total += with_pool.prompt_tokens
            print(f"\nQ: {ex.question}\n   gold: {ex.answers[0]}")
            how = "picker" if sel.fallback is None else f"fallback ({sel.fallback})"
            print(f"   picked {sel.ids} by {how}: {sel.rationale or '-'}")
            for name, out in (("picked", with_pick), ("whole pool", with_pool)):
                ok = rule_judge(out.text, ex.answers)
                print(f"   {name:10s} {out.prompt_tokens:5d} prompt tokens -> {out.text.strip()!r}"
                      f" ({'correct' if ok else 'wrong'})")  # fmt: skip
        print(f"\nprompt tokens saved against the whole pool: {saved}/{total}")
    finally:
        for proc in procs:
            proc.terminate()
        picker.close()


if __name__ == "__main__":
    main()
