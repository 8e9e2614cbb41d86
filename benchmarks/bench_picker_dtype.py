"""The shipped picker in one engine dtype, in this process, on the 12 bundled sample questions
that the serve test picks for (the cross-encoder-ordered pools its picker.json expects): how
long the engine takes to load and to pick, and the picks. Run once per dtype to see whether
this machine has a bf16 fast path (`auto` chooses for it: ctxpick.engines.vllm_engine):

    .venv/bin/python benchmarks/bench_picker_dtype.py float32
    .venv/bin/python benchmarks/bench_picker_dtype.py bfloat16 1
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    from ctxpick.config import SAMPLES_DIR, compose
    from ctxpick.data.loaders import load_examples
    from ctxpick.picker.inference import Picker
    from ctxpick.retrieval.chunking import Chunker
    from ctxpick.retrieval.pools import PoolBuilder

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dtype", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("questions", type=int, nargs="?", default=12, help="the first N of 12")
    args = parser.parse_args()
    cfg = compose(["retrieval=crossenc"])
    files = [
        ("hotpotqa_distractor_30.jsonl", "hotpotqa"),
        ("2wikimultihopqa_30.jsonl", "2wikimultihopqa"),
        ("musique_30.jsonl", "musique"),
    ]
    examples = [
        ex for name, fmt in files for ex in load_examples(SAMPLES_DIR / name, fmt).examples[:4]
    ][: args.questions]
    builder = PoolBuilder(cfg.retrieval.pool)
    pools = [builder.build(c) for c in Chunker(cfg.retrieval.chunking).chunk_all(examples)]
    t0 = time.time()
    picker = Picker.from_pretrained("ctxpick-picker-0.5b", dtype=args.dtype)
    t1 = time.time()
    picks = picker.pick_many(
        [p.question for p in pools],
        [[x.text for x in p.passages] for p in pools],
        isolate_errors=False,
    )
    t2 = time.time()
    print(f"{args.dtype}: load {t1 - t0:.0f} s, picks {t2 - t1:.0f} s for {len(pools)} questions")
    print("picks (1-based):", [[i + 1 for i in s.indices] for s in picks])


if __name__ == "__main__":  # vLLM's engine process is spawned: it re-imports this module
    main()
