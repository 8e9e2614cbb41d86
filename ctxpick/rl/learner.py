"""A DeepSpeed learner that runs in a Ray actor: bf16, ZeRO stage from config, gloo on CPU and
NCCL on GPU. One actor is one data-parallel rank."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass
class LearnerConfig:
    model: str = "smollm2-135m"
    zero_stage: int = 0
    lr: float = 1e-5
    weight_decay: float = 0.0
    micro_batch_size: int = 4
    grad_accum_steps: int = 1
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0-3, got {self.zero_stage}")
        if self.micro_batch_size < 1 or self.grad_accum_steps < 1 or self.lr <= 0:
            raise ValueError("learner needs micro_batch_size >= 1, grad_accum_steps >= 1, lr > 0")

    def deepspeed_config(self, world_size: int) -> dict[str, Any]:
        return {
            "train_micro_batch_size_per_gpu": self.micro_batch_size,
            "gradient_accumulation_steps": self.grad_accum_steps,
            "train_batch_size": self.micro_batch_size * self.grad_accum_steps * world_size,
            "gradient_clipping": self.grad_clip,
            "bf16": {"enabled": True},
            "zero_optimization": {"stage": self.zero_stage},
            "steps_per_print": 10**9,
        }


def _distributed_env(rank: int, world_size: int, master_addr: str, master_port: int) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK="0",
        WORLD_SIZE=str(world_size),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
    )


class Learner:
    def __init__(
        self,
        cfg: LearnerConfig,
        rank: int = 0,
        world_size: int = 1,
        master_addr: str = "127.0.0.1",
        master_port: int = 29500,
    ) -> None:
        import torch

        on_gpu = torch.cuda.is_available()
        if not on_gpu:
            # DeepSpeed picks its accelerator at import time.
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        _distributed_env(rank, world_size, master_addr, master_port)
        import deepspeed
        from transformers import AutoModelForCausalLM

        from ctxpick.engines.models import resolve

        deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
        model = AutoModelForCausalLM.from_pretrained(resolve(cfg.model), dtype=torch.bfloat16)
        model.gradient_checkpointing_enable()
        # A torch optimizer: DeepSpeed's fused/CPU Adam need compiled ops that CPU-only
        # machines lack, and AdamW on bf16 params is what the DS bf16 optimizer wraps anyway.
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=cfg.deepspeed_config(world_size)
        )
        self.cfg = cfg
        self.device = self.engine.device

    def sft_step(self, sequences: list[list[int]], loss_masks: list[list[int]]) -> dict[str, float]:
        """One optimizer step of token-mean next-token NLL over the masked (response) tokens."""
        from ctxpick.rl.logprobs import sequence_logprobs

        ids, mask, attn = _pad(sequences, loss_masks, self.device)
        logps = sequence_logprobs(self.engine, ids, attn)
        target_mask = mask[:, 1:].to(logps.dtype)
        loss = -(logps * target_mask).sum() / target_mask.sum().clamp(min=1)
        self.engine.backward(loss)
        self.engine.step()
        grad_norm = self.engine.get_global_grad_norm()
        return {
            "loss": float(loss.detach().float()),
            "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
            "tokens": float(target_mask.sum()),
        }

    def state_checksum(self) -> float:
        """Sum of all parameters: a cheap way for tests to see that a step changed weights."""
        return float(sum(p.detach().float().sum() for p in self.engine.module.parameters()))


def _pad(sequences: list[list[int]], masks: list[list[int]], device: Any) -> tuple[Any, Any, Any]:
    import torch

    width = max(map(len, sequences))
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    attn = torch.zeros_like(ids)
    for i, (seq, m) in enumerate(zip(sequences, masks, strict=True)):
        if len(seq) != len(m):
            raise ValueError(f"sequence {i}: {len(seq)} tokens but {len(m)} mask entries")
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(m)] = torch.tensor(m)
        attn[i, : len(seq)] = 1
    return ids.to(device), mask.to(device), attn.to(device)
