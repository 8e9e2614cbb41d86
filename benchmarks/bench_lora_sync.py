"""LoRA GRPO steps with the whole merged model synced to the rollout workers (``rl.lora_sync=
merged``, the path before issue 19) against the adapter alone (``rl.lora_sync=adapter``),
merged into the engine's weights (``rl.adapter_serving=merge``, CPU's default) or served by
vLLM's LoRA support (``lora``, GPU's default), in one run on the same prompts and samples:
the trainer's own ``grpo_step`` and ``Run.sync_weights`` on the real stack (vLLM rollout
worker, reward service, DeepSpeed learner), at the dense-pool LoRA recipe's Stage I settings
(conf/ablation/qwen_lora*.yaml on conf/experiment/cpu_quality.yaml: Qwen2.5-Coder-0.5B, LoRA
rank 16, 3 prompts x 6 samples).

The first step of each mode warms up (first generation, first load) and is not counted; the
table gives the mean of the others. Pools are BM25's over real HotpotQA questions (the
recipe's are dense: the prompt length, 8 passages of <= 40 words, is the same).
Run: .venv/bin/python benchmarks/bench_lora_sync.py [--steps 3 --model qwen2.5-coder-0.5b]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from statistics import mean

from common import data_file


def mined_file(folder: Path, n: int) -> Path:
    """A mined.jsonl of ``n`` real questions with their human evidence as the gold sets."""
    from ctxpick.data.loaders import load_examples
    from ctxpick.mining.human_gold import human_gold_records
    from ctxpick.retrieval.chunking import Chunker, ChunkingConfig
    from ctxpick.retrieval.pools import PoolBuilder, PoolConfig

    path = data_file("hotpotqa/migres_hotpot_200.jsonl", "hotpotqa_distractor_30.jsonl")
    exs = load_examples(path, "hotpotqa", limit=n).examples
    chunked = Chunker(ChunkingConfig(method="window", window_words=60)).chunk_all(exs)
    pools = [PoolBuilder(PoolConfig(k=8)).build(c) for c in chunked]
    records = [r for r in human_gold_records(pools, ["train"] * len(pools)) if r["kept"]]
    out = folder / "mined.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    return out


MODES = {
    "merged": ["rl.lora_sync=merged"],
    "adapter+merge": ["rl.lora_sync=adapter", "rl.adapter_serving=merge"],
    "adapter+lora": ["rl.lora_sync=adapter", "rl.adapter_serving=lora"],
}


def measure(label: str, overrides: list[str], batches: list, steps: int) -> dict:
    from ctxpick.config import compose, reward_spec
    from ctxpick.rl.run import Run
    from ctxpick.rl.trainer import StepTimer, grpo_step

    cfg = compose(overrides)
    run = Run(cfg)
    rows = []
    try:
        for step in range(steps):
            timer, t0 = StepTimer(), time.time()
            grpo_step(run, batches[step], reward_spec(cfg), step, timer)
            with timer("sync"):
                run.sync_weights()
            rows.append(timer.seconds | {"step": time.time() - t0})
            print(
                f"  {label} step {step}: "
                + ", ".join(f"{k} {v:.2f}s" for k, v in rows[-1].items()),
                flush=True,
            )
        import ray

        if run.transfer == "adapter":
            payload = len(ray.get(run.learners.adapter()).weights)
        else:
            payload = sum(map(len, ray.get(run.learners.weight_buckets(cfg.rl.bucket_mb))))
    finally:
        run.shutdown()
    counted = rows[1:] or rows
    return {k: mean(r[k] for r in counted) for k in counted[0]} | {"payload_mb": payload / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3, help="per mode; the first warms up")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", help="the picker (ctxpick models)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    args = ap.parse_args()
    from ctxpick.config import compose
    from ctxpick.engines.ray_pool import init_ray
    from ctxpick.picker.examples import load_picker_examples

    with tempfile.TemporaryDirectory() as tmp:
        mined = mined_file(Path(tmp), 40)
        base = [
            "experiment=cpu_quality",
            "ablation=qwen_lora_dense",
            "stage=stage1",
            "stage.group_size=6",
            "stage.lr=1e-4",
            "retrieval.pool.retriever=bm25",
            "mining.pool.retriever=bm25",
            f"output_dir={tmp}/stage1",
            f"rl.mined={mined}",
            "wandb.mode=disabled",
            f"picker.model={args.model}",
        ]
        cfg = compose(base)
        train = load_picker_examples(mined, cfg.picker.max_passages, cfg.seed)["train"]
        per = cfg.rl.prompts_per_step
        batches = [train[i * per : (i + 1) * per] for i in range(args.steps)]
        init_ray(None, cfg.ray.num_cpus)
        results = {
            mode: measure(mode, base + MODES[mode], batches, args.steps) for mode in args.modes
        }
    old = results[args.modes[0]]
    lora = cfg.rl.learner
    print(
        f"\n{cfg.picker.model}, LoRA rank {lora.lora_rank} on {len(lora.lora_targets)} "
        f"projections, {per} prompts x {cfg.stage.group_size} samples, mean of steps 2-"
        f"{args.steps}\n"
    )
    rest = args.modes[1:]
    print(f"| | {args.modes[0]} | " + " | ".join(f"{m} | ratio" for m in rest) + " |")
    print("|---" * (2 + 2 * len(rest)) + "|")
    for key, label in [
        ("step", "step s"),
        ("sync", "weight sync s"),
        ("rollout", "rollout s"),
        ("reward", "reward s"),
        ("learn", "learn s"),
        ("payload_mb", "sync payload MB"),
    ]:
        cells = [f"{results[m][key]:.2f} | {results[m][key] / old[key]:.2f}x" for m in rest]
        print(f"| {label} | {old[key]:.2f} | " + " | ".join(cells) + " |")
    shares = [f"{results[m]['sync'] / results[m]['step']:.1%}" for m in args.modes]
    print("| sync share of the step | " + " | | ".join(shares) + " | |")


if __name__ == "__main__":
    main()
