"""The GRPO step before and after issue 19, in one run on the same prompts: the stage's own
loop (``ctxpick.rl.trainer.train``: rollout, reward, learn, weight sync) on the real stack (vLLM
rollout worker, reward service, DeepSpeed learner), at the dense-pool LoRA recipe's Stage I
settings (conf/ablation/qwen_lora*.yaml on conf/experiment/cpu_quality.yaml: Qwen2.5-Coder-0.5B,
LoRA rank 16 on every projection, 3 prompts x 6 samples, 64 new tokens). Samples agree on the
first step of each mode only: the policies part after it.

Modes, each a fresh stage from the same weights:
- ``before``: the path before the issue -- the whole merged model synced every step
  (``rl.lora_sync=merged``), right-padded learner batches, rollout then learning;
- ``adapter``: the adapter alone synced, merged into the engine's weights (CPU's default);
- ``adapter+lora``: the adapter served by vLLM's LoRA support (GPU's default);
- ``packed``: ``adapter`` with responses packed into one unpadded row per prompt
  (``rl.learner.packing=true``);
- ``async``: ``adapter`` with the next step's rollouts generated while a step learns
  (``rl.async_level=1``).

The first step of each mode warms up (first generation, first load) and is not counted; the
table gives the mean of the others, the learner's throughput (prompt and response tokens it
ran per second of its update) and its model FLOPs utilisation against this machine's
matmul peak in the learner's dtype, measured here with its thread count. Pools are BM25's over real
HotpotQA training questions (the recipe's are dense: the prompt length, 8 passages of <= 40
words, is the same).
Run: .venv/bin/python benchmarks/bench_grpo_step.py [--steps 4 --modes before adapter async]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from statistics import mean

from common import mined_file

ADAPTER = ["rl.lora_sync=adapter", "rl.adapter_serving=merge"]
MODES = {
    "before": ["rl.lora_sync=merged"],
    "adapter": ADAPTER,
    "adapter+lora": ["rl.lora_sync=adapter", "rl.adapter_serving=lora"],
    "packed": [*ADAPTER, "rl.learner.packing=true"],
    "async": [*ADAPTER, "rl.async_level=1", "rl.learner.grpo.tis_cap=2.0"],
}
ROWS = [
    ("time/step", "step s"),
    ("time/sync", "weight sync s"),
    ("time/rollout", "rollout s"),
    ("time/learn", "learn s"),
    ("learn_tok_s", "learner tokens/s"),
    ("mfu", "learner MFU"),
]


def matmul_peak(threads: int, dtype: str) -> float:
    """FLOP/s of a large matmul in the learner's ``dtype`` on ``threads`` threads: the learner's
    ceiling here."""
    import torch

    torch.set_num_threads(threads)
    a, b = (torch.randn(2048, 2048, dtype=getattr(torch, dtype)) for _ in range(2))
    a @ b
    t0, n = time.time(), 10
    for _ in range(n):
        a @ b
    return 2 * 2048**3 * n / (time.time() - t0)


def measure(label: str, overrides: list[str], flops_per_token: float) -> dict:
    from ctxpick.config import compose
    from ctxpick.rl.trainer import train

    cfg = compose(overrides)
    t0 = time.time()
    final = train(cfg)
    rows = [json.loads(line) for line in (final.parent / "metrics.jsonl").read_text().splitlines()]
    print(f"  {label}: {len(rows)} steps in {time.time() - t0:.0f}s (start-up included)")
    for r in rows:
        cells = ", ".join(f"{k[5:]} {r[k]:.2f}s" for k, _ in ROWS[:4])
        print(f"    step {r['step']}: {cells}, lag {r.get('policy_lag', 0)}", flush=True)
    counted = rows[1:] or rows
    out = {k: mean(r[k] for r in counted) for k, _ in ROWS[:4]}
    tokens = mean(r["prompt_tokens"] + r["tokens"] for r in counted)
    out["learn_tok_s"] = tokens / out["time/learn"]
    out["mfu"] = out["learn_tok_s"] * flops_per_token
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4, help="per mode; the first warms up")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", help="the picker (ctxpick models)")
    ap.add_argument("--modes", nargs="+", default=["before", "adapter", "packed", "async"])
    args = ap.parse_args()
    if unknown := set(args.modes) - set(MODES):
        raise SystemExit(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ctxpick.config import compose
    from ctxpick.engines.models import resolve
    from ctxpick.engines.ray_pool import init_ray

    with tempfile.TemporaryDirectory() as tmp:
        mined = mined_file(Path(tmp), 60)
        base = [
            "experiment=cpu_quality",
            "ablation=qwen_lora_dense",
            "stage=stage1",
            f"stage.max_steps={args.steps}",
            "stage.group_size=6",
            "stage.lr=1e-4",
            "stage.init_from=null",
            "retrieval.pool.retriever=bm25",
            "mining.pool.retriever=bm25",
            f"rl.mined={mined}",
            "rl.val_every=1000",
            "rl.save_every=1000",
            "wandb.mode=disabled",
            f"picker.model={args.model}",
        ]
        cfg = compose([*base, f"output_dir={tmp}/probe"])
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(
                AutoConfig.from_pretrained(resolve(args.model))
            )
        # LoRA: forward 2N and the activations' backward 2N FLOPs a token (frozen weights get
        # no gradient). N: the weights of the linear layers -- the LM head counts (tied to the
        # embedding or not), the embedding lookup does not.
        params = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
        per_token = (4 if cfg.rl.learner.lora_rank else 6) * params
        threads = int(cfg.rl.learner.num_cpus_per_actor)
        dtype = cfg.rl.learner.compute_dtype()
        peak = matmul_peak(threads, dtype)
        init_ray(None, cfg.ray.num_cpus)
        results = {
            mode: measure(mode, [*base, *MODES[mode], f"output_dir={tmp}/{mode}"], per_token)
            for mode in args.modes
        }
    for r in results.values():
        r["mfu"] /= peak
    old = results[args.modes[0]]
    lora = cfg.rl.learner
    print(
        f"\n{args.model} ({params / 1e6:.0f}M parameters), LoRA rank {lora.lora_rank} on "
        f"{len(lora.lora_targets)} projections, {cfg.rl.prompts_per_step} prompts x "
        f"{cfg.stage.group_size} samples, mean of steps 2-{args.steps}; {dtype} matmul peak on "
        f"{threads} threads {peak / 1e12:.2f} TFLOP/s\n"
    )
    rest = args.modes[1:]
    print(f"| | {args.modes[0]} | " + " | ".join(f"{m} | ratio" for m in rest) + " |")
    print("|---" * (2 + 2 * len(rest)) + "|")
    for key, label in ROWS:
        fmt = "{:.1%}" if key == "mfu" else "{:.2f}"
        cells = [f"{fmt.format(results[m][key])} | {results[m][key] / old[key]:.2f}x" for m in rest]
        print(f"| {label} | {fmt.format(old[key])} | " + " | ".join(cells) + " |")
    shares = [f"{results[m]['time/sync'] / results[m]['time/step']:.1%}" for m in args.modes]
    print("| sync share of the step | " + " | | ".join(shares) + " | |")


if __name__ == "__main__":
    main()
