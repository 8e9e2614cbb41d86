"""Built-in models under vLLM on this machine: load time, prefill and decode tokens/s, and
answer accuracy on real HotpotQA questions given only their gold paragraphs.

Each model runs in its own process (a fresh engine each); the table puts them side by side.
Run: .venv/bin/python benchmarks/bench_models.py [--questions 50]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from statistics import mean

from common import data_file

from ctxpick.data.loaders import load_examples
from ctxpick.data.schema import Passage
from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.models import BUILTINS
from ctxpick.engines.prompts import answer_chat
from ctxpick.judge.rules import exact_match, rule_judge, token_f1


def gold_paragraph_chats(n: int) -> tuple[list, list]:
    path = data_file("hotpotqa/migres_hotpot_200.jsonl", "hotpotqa_distractor_30.jsonl")
    exs = load_examples(path, "hotpotqa", limit=n).examples
    chats = []
    for ex in exs:
        gold_docs = sorted({ev.doc_index for ev in ex.evidence})
        passages = [
            Passage(
                f"{ex.id}/{i}",
                i,
                0,
                len(ex.documents[i].text),
                ex.documents[i].text,
                ex.documents[i].title,
            )
            for i in gold_docs
        ]
        chats.append(answer_chat(ex.question, passages))
    return exs, chats


def run_one(model: str, n: int) -> dict:
    from ctxpick.engines.vllm_engine import VLLMEngine

    exs, chats = gold_paragraph_chats(n)
    engine = VLLMEngine(model, max_model_len=4096)
    greedy = SamplingConfig(max_tokens=32, temperature=0.0)
    t = time.perf_counter()
    out = engine.generate(chats, greedy)
    answer_s = time.perf_counter() - t
    preds = [o[0].text.strip() for o in out]
    # Decode speed: sampled continuations from one short prompt (prefill negligible).
    sample = SamplingConfig(n=8, max_tokens=128, temperature=0.7, seed=0)
    t = time.perf_counter()
    dec = engine.generate([[{"role": "user", "content": "Tell a short story."}]], sample)
    decode_s = time.perf_counter() - t
    return {
        "model": model,
        "load_s": engine.load_seconds,
        "questions": len(exs),
        "prompt_tokens": sum(o[0].prompt_tokens for o in out),
        "answer_s": answer_s,
        "prefill_tok_s": sum(o[0].prompt_tokens for o in out) / answer_s,
        "decode_tok_s": sum(len(c.token_ids) for c in dec[0]) / decode_s,
        "accuracy": mean(rule_judge(p, ex.answers) for p, ex in zip(preds, exs, strict=True)),
        "em": mean(exact_match(p, ex.answers) for p, ex in zip(preds, exs, strict=True)),
        "f1": mean(token_f1(p, ex.answers) for p, ex in zip(preds, exs, strict=True)),
        "examples": [
            [ex.question, ex.answers[0], p] for ex, p in zip(exs[:3], preds[:3], strict=True)
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=50)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_one(args.one, args.questions)), flush=True)
        return
    results = []
    for alias in BUILTINS:
        proc = subprocess.run(
            [sys.executable, __file__, "--one", alias, "--questions", str(args.questions)],
            capture_output=True,
            text=True,
        )
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not line:
            sys.exit(f"{alias} failed:\n{proc.stderr[-3000:]}")
        results.append(json.loads(line[0][7:]))
    a, b = results
    rows = [
        ("load (s)", "load_s", "{:.1f}"),
        ("prefill tok/s", "prefill_tok_s", "{:.0f}"),
        ("decode tok/s (n=8)", "decode_tok_s", "{:.0f}"),
        ("answer pass (s)", "answer_s", "{:.1f}"),
        ("accuracy", "accuracy", "{:.3f}"),
        ("EM", "em", "{:.3f}"),
        ("F1", "f1", "{:.3f}"),
    ]
    print(f"HotpotQA distractor, {a['questions']} questions, gold paragraphs only, greedy")
    print(f"{'':20s} {a['model']:>20s} {b['model']:>20s} {'ratio b/a':>10s}")
    for label, key, fmt in rows:
        ratio = b[key] / a[key] if a[key] else float("nan")
        print(f"{label:20s} {fmt.format(a[key]):>20s} {fmt.format(b[key]):>20s} {ratio:9.2f}x")
    for r in results:
        for q, gold, pred in r["examples"]:
            print(f"  {r['model']}: Q: {q[:60]!r} gold={gold!r} pred={pred[:60]!r}")


if __name__ == "__main__":
    main()
