"""Same-run race: ctxpick's GRPO stage against TRL's ``GRPOTrainer`` on the same task.

Both start from the same warm-started SmolLM2 (ctxpick's optional warm start, run here first:
untrained SmolLM2 writes no valid pick, so both would see a flat -1 reward), get the same
picker prompts (``PickerSpec.chat`` on real HotpotQA training-split pools; the human gold
evidence is the target set), the same reward function (``ctxpick.rewards.reward.score_output``),
the same group size, prompts per step, completion length, temperature, learning rate,
clipping (eps 0.2 / 0.28), no KL, group-std advantages, token-mean loss, one update per batch,
and the same number of steps. Each runs with its best CPU settings on this machine:

* ctxpick: the real trainer (``ctxpick train``), vLLM rollout worker and DeepSpeed learner as
  Ray actors with 2 CPUs each (they take turns on the 2 cores), weight sync every step;
* TRL: bf16 weights, no gradient checkpointing (a 135M model fits; it only costs time),
  2 torch threads, generation with ``transformers`` (``--trl-vllm`` tries TRL's in-process
  vLLM "colocate" mode instead).

Run: .venv/bin/python benchmarks/bench_vs_trl.py [--steps 8 --prompts 3 --group 6]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from statistics import mean

from common import REPO, mined_file

from ctxpick.config import compose, picker_spec, reward_spec

MODEL = "smollm2-135m"
THREADS = 2


def overrides(args: argparse.Namespace, out: Path, name: str, *extra: str) -> list[str]:
    return [
        f"output_dir={out / name}",
        f"rl.mined={out / 'mine' / 'mined.jsonl'}",
        "experiment=demo",  # the demo's picker settings: 8 passages of 40 words, 64 tokens
        f"picker.max_tokens={args.max_tokens}",
        "wandb.mode=disabled",
        *extra,
    ]


def warm_start(args: argparse.Namespace, out: Path) -> Path:
    from ctxpick.rl.trainer import train

    cfg = compose(
        overrides(args, out, "warmup", "stage=warmup", f"stage.max_steps={args.warmup_steps}")
    )
    return train(cfg)


def stage_overrides(args: argparse.Namespace, out: Path, warm: Path, name: str) -> list[str]:
    return overrides(
        args,
        out,
        name,
        "stage=stage1",
        f"stage.init_from={warm}",
        f"stage.max_steps={args.steps}",
        f"stage.group_size={args.group}",
        f"stage.lr={args.lr}",
        "stage.patience=100",
        f"rl.prompts_per_step={args.prompts}",
        "rl.val_every=1000",
        "rl.save_every=1000",
        "stage.eq8=described",
    )


def ours(args: argparse.Namespace, out: Path, warm: Path) -> list[dict]:
    from ctxpick.rl.trainer import train

    cfg = compose(stage_overrides(args, out, warm, "ctxpick"))
    train(cfg)
    rows = [json.loads(line) for line in (out / "ctxpick" / "metrics.jsonl").open()]
    return [
        {
            "step_s": r["time/step"],
            "rollout_s": r["time/rollout"],
            "gen_tokens": r["tokens"],
            "reward": r["reward"],
        }
        for r in rows
    ]


def trl(args: argparse.Namespace, out: Path, warm: Path) -> list[dict]:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from ctxpick.picker.examples import load_picker_examples
    from ctxpick.rewards.reward import score_output

    torch.set_num_threads(THREADS)
    cfg = compose(stage_overrides(args, out, warm, "trl"))
    spec, rspec = picker_spec(cfg), reward_spec(cfg)
    train_set = load_picker_examples(Path(cfg.rl.mined), spec.max_passages, cfg.seed)["train"]
    data = Dataset.from_list(
        [
            {
                "prompt": spec.chat(ex.question, ex.passages),
                "gold": list(ex.gold),
                "n": min(len(ex.passages), spec.max_passages),
            }
            for ex in train_set
        ]
    )

    def reward(completions: list, gold: list, n: list, **_: object) -> list[float]:
        return [
            score_output(c[0]["content"], k, g, rspec).reward
            for c, g, k in zip(completions, gold, n, strict=True)
        ]

    batch = args.prompts * args.group
    config = GRPOConfig(
        output_dir=str(out / "trl"),
        use_cpu=True,
        bf16=args.trl_dtype == "bf16",
        model_init_kwargs={
            "dtype": getattr(torch, {"bf16": "bfloat16"}.get(args.trl_dtype, "float32"))
        },
        gradient_checkpointing=False,
        per_device_train_batch_size=batch,
        generation_batch_size=batch,
        num_generations=args.group,
        max_completion_length=args.max_tokens,
        temperature=cfg.picker.temperature,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        adam_beta1=0.9,
        adam_beta2=0.999,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        num_iterations=1,
        scale_rewards="group",
        loss_type="dapo",  # token mean over the global batch, as ctxpick's
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=cfg.seed,
        use_vllm=args.trl_vllm,
        vllm_mode="colocate",
    )
    rows: list[dict] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a: object, **k: object) -> None:
            self.t0 = time.time()

        def on_step_end(self, *a: object, **k: object) -> None:
            rows.append({"step_s": time.time() - self.t0})

        def on_log(self, _args: object, state: object, control: object, logs: dict, **k: object):  # noqa: ANN201
            if "reward" in logs and rows:
                rows[-1] |= {
                    "reward": logs["reward"],
                    "gen_tokens": logs["completions/mean_length"] * batch,
                }

    trainer = GRPOTrainer(
        model=str(warm), reward_funcs=reward, args=config, train_dataset=data, callbacks=[Timer()]
    )
    trainer.train()
    return rows


def summary(name: str, rows: list[dict], skip: int) -> dict:
    timed = rows[skip:]  # the first step pays one-off start-up costs on both sides
    third = max(1, len(rows) // 3)
    return {
        "name": name,
        "step_s": mean(r["step_s"] for r in timed),
        "gen_tok_s": sum(r["gen_tokens"] for r in timed) / sum(r["step_s"] for r in timed),
        "reward_first": mean(r["reward"] for r in rows[:third]),
        "reward_last": mean(r["reward"] for r in rows[-third:]),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--group", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--warmup-steps", type=int, default=8)
    ap.add_argument("--questions", type=int, default=40)
    ap.add_argument("--trl-vllm", action="store_true")
    ap.add_argument("--trl-dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--out", default=str(REPO / "outputs" / "bench_vs_trl"))
    args = ap.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)  # a race starts from nothing on both sides
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
    mined_file(out, args.questions, query="question_answer")
    warm = warm_start(args, out)
    ours_rows = ours(args, out, warm)
    import ray

    ray.shutdown()  # TRL runs in this process, alone on the cores
    trl_rows = trl(args, out, warm)
    a, b = summary("ctxpick", ours_rows, 1), summary("TRL GRPOTrainer", trl_rows, 1)
    third = max(1, args.steps // 3)
    print(
        f"\n{args.steps} GRPO steps x {args.prompts} prompts x {args.group} samples, {MODEL}, "
        f"{args.max_tokens} new tokens, {THREADS} threads; step time and tok/s exclude step 1\n"
    )
    print(
        f"| trainer | s / step | generated tok/s | reward, first {third} steps | "
        f"reward, last {third} steps |"
    )
    print("|---|---|---|---|---|")
    for r in (a, b):
        print(
            f"| {r['name']} | {r['step_s']:.1f} | {r['gen_tok_s']:.1f} | "
            f"{r['reward_first']:+.3f} | {r['reward_last']:+.3f} |"
        )
    print(f"\nctxpick step time / TRL step time: {a['step_s'] / b['step_s']:.2f}x")
    (out / "race.json").write_text(json.dumps({"ctxpick": ours_rows, "trl": trl_rows}, indent=2))


if __name__ == "__main__":
    main()
