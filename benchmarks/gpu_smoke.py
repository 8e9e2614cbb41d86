"""GPU smoke test and speed check: one script a person with one CUDA GPU runs after `make
install` (which installs the pinned CUDA `vllm==0.32.0` when `nvidia-smi` finds a GPU).

On one GPU it runs the real trainer: a vLLM CUDA rollout engine and a DeepSpeed (NCCL) learner
as Ray actors sharing the GPU (0.45 of it each), weights pushed learner -> vLLM after every
update with vLLM's own weight transfer (``ipc`` when colocated on one GPU, ``nccl`` across
GPUs: ``rl.weight_transfer=auto``), a short warm start then ``--steps`` GRPO steps on the
bundled HotpotQA sample (human gold evidence as the target set). The GRPO stage runs twice:
full fine-tuning (whole weights by ``ipc``/``nccl``) and LoRA (``--lora`` rank: the adapter
alone through the object store, served by vLLM's CUDA LoRA kernels: ``rl.lora_sync=adapter``,
``rl.adapter_serving=auto``). Each checks its sync: log-probs of fresh rollouts under the
engine and under the learner must agree. It prints,
and writes into benchmarks/RESULTS.md (between the gpu-smoke markers): sync time, rollout
generated tok/s, learner tok/s and model FLOPs utilisation against the GPU's bf16 dense peak.

Run: .venv/bin/python benchmarks/gpu_smoke.py [--model smollm2-135m --steps 3 --zero 2 --lora 16]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from statistics import mean

from common import REPO, SAMPLES, mined_file

RESULTS = REPO / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- gpu-smoke:begin -->", "<!-- gpu-smoke:end -->"
# bf16 dense peak TFLOP/s by GPU name (vendor data sheets), for MFU.
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0}


def peak_tflops(name: str, override: float | None) -> float:
    if override:
        return override
    for key, value in PEAK_TFLOPS.items():
        if key in name:
            return value
    raise SystemExit(f"unknown GPU {name!r}: pass --peak-tflops")


def grpo_stage(
    common: list[str], out: Path, warm: Path, steps: int, extra: list[str]
) -> tuple[str, list[dict], float]:
    """A GRPO stage from the warm start; returns its weight transfer, its metrics rows and
    the mean |learner - engine| log-prob of fresh rollouts after the last sync."""
    from ctxpick.config import compose, picker_spec
    from ctxpick.engines.base import SamplingConfig
    from ctxpick.picker.examples import load_picker_examples
    from ctxpick.rl.batching import TrainSequence
    from ctxpick.rl.run import Run
    from ctxpick.rl.trainer import train

    cfg = compose(
        [
            *common,
            f"output_dir={out}",
            "stage=stage1",
            f"stage.init_from={warm}",
            f"stage.max_steps={steps}",
            "stage.group_size=8",
            "stage.lr=1e-5",
            *extra,
        ]
    )
    run = Run(cfg)
    mode = run.transfer + (" (vLLM LoRA)" if run.serves_lora else "")
    train(cfg, run=run)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    # The transfer moved the weights: fresh rollouts score the same under the learner.
    exs = load_picker_examples(Path(cfg.rl.mined), 8, 0)["train"][:4]
    chats = [picker_spec(cfg).chat(e.question, e.passages) for e in exs]
    sampling = SamplingConfig(1.0, max_tokens=32, n=2, seed=1, logprobs=True)
    samples = [c for o in run.engines.generate(chats, sampling) for c in o]
    seqs = [
        TrainSequence(c.prompt_token_ids + c.token_ids, len(c.prompt_token_ids)) for c in samples
    ]
    learner = [x for lp in run.learners.call("logprobs", seqs, 1.0)[0] for x in lp]
    engine = [x for c in samples for x in c.logprobs]
    run.shutdown()
    return mode, rows, mean(abs(a - b) for a, b in zip(learner, engine, strict=True))


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--zero", type=int, default=2)
    ap.add_argument("--lora", type=int, default=16, help="LoRA rank of the second GRPO run")
    ap.add_argument("--peak-tflops", type=float)
    ap.add_argument("--out", default=str(REPO / "outputs" / "gpu_smoke"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: this script checks the GPU path")
    gpu = torch.cuda.get_device_name(0)
    peak = peak_tflops(gpu, args.peak_tflops)
    out = Path(args.out)
    sample = SAMPLES / "hotpotqa_distractor_30.jsonl"
    mined_file(out, None, source=sample, query="question_answer", val=2)

    from ctxpick.config import compose
    from ctxpick.rl.trainer import train

    common = [
        f"rl.mined={out / 'mine' / 'mined.jsonl'}",
        f"picker.model={args.model}",
        "picker.max_passages=8",
        "picker.max_passage_words=40",
        "picker.max_tokens=64",
        "rl.prompts_per_step=8",
        "rl.rollout.num_cpus_per_actor=1",
        "rl.rollout.num_gpus_per_actor=0.45",
        "rl.rollout.gpu_memory_utilization=0.35",
        "rl.learner.num_gpus_per_actor=0.45",
        f"rl.learner.zero_stage={args.zero}",
        "rl.learner.micro_batch_size=8",
        "rl.val_every=1000",
        "rl.save_every=1000",
        "wandb.mode=disabled",
    ]
    t0 = time.time()
    warm = train(
        compose([*common, f"output_dir={out}/warmup", "stage=warmup", "stage.max_steps=8"])
    )
    runs = {
        "full": grpo_stage(common, out / "stage1", warm, args.steps, []),
        "lora": grpo_stage(
            common,
            out / "stage1_lora",
            warm,
            args.steps,
            [f"rl.learner.lora_rank={args.lora}", "stage.lr=1e-4"],
        ),
    }

    from transformers import AutoConfig, AutoModelForCausalLM

    from ctxpick.engines.models import resolve

    with torch.device("meta"):  # count parameters without allocating them
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve(args.model)))
    params = sum(p.numel() for p in model.parameters())

    def column(name: str) -> list[str]:
        mode, rows, gap = runs[name]
        timed = rows[1:] or rows  # step 1 pays one-off compilation and cache warm-up
        rollout_tps = sum(r["tokens"] for r in timed) / sum(r["time/rollout"] for r in timed)
        learn_tokens = sum(r["tokens"] + r["prompt_tokens"] for r in timed)
        learn_s = sum(r["time/learn"] for r in timed)
        sync_s = mean(r["time/sync"] for r in timed)
        step_s = mean(r["time/step"] for r in timed)
        return [
            mode,
            f"{step_s:.2f}",
            f"{sync_s:.3f} ({sync_s / step_s:.1%} of the step)",
            f"{rollout_tps:.0f}",
            f"{learn_tokens / learn_s:.0f}",
            # LoRA trains a sliver of the parameters but runs the whole forward/backward
            f"{6 * params * learn_tokens / learn_s / (peak * 1e12):.2%}",
            f"{gap:.4f}",
        ]

    labels = [
        "weight transfer",
        "step time (s)",
        "weight sync (s)",
        "rollout generated tok/s",
        "learner tok/s (prompt once per group + responses)",
        "learner MFU (6 N tokens / time / peak)",
        "mean |learner - engine| log-prob after sync",
    ]
    full, lora = column("full"), column("lora")
    table = "\n".join(
        [
            f"GPU: {gpu} (bf16 dense peak {peak:.0f} TFLOP/s); model {args.model} "
            f"({params / 1e6:.0f}M parameters); ZeRO-{args.zero}; "
            f"{args.steps} GRPO steps x 8 prompts x 8 samples; {time.strftime('%Y-%m-%d')}",
            "",
            f"| metric | full fine-tune | LoRA rank {args.lora} |",
            "|---|---|---|",
            *[f"| {k} | {a} | {b} |" for k, a, b in zip(labels, full, lora, strict=True)],
            f"| wall time, warm start included (s) | {time.time() - t0:.0f} | |",
        ]
    )
    print(table)
    text = RESULTS.read_text()
    block = f"{BEGIN}\n{table}\n{END}"
    RESULTS.write_text(re.sub(f"{BEGIN}.*?{END}", lambda _: block, text, flags=re.DOTALL))
    for name, (mode, _, gap) in runs.items():
        if gap > 0.1:
            raise SystemExit(f"{name} ({mode}) weight sync check failed: log-prob gap {gap:.4f}")


if __name__ == "__main__":
    main()
