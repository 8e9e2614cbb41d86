"""A DeepSpeed learner in a Ray actor: bf16 where the hardware has a fast path (float32 on a CPU
without bf16 instructions), ZeRO stage from config, gloo on CPU and NCCL on GPU. One actor is
one data-parallel rank; ``ctxpick.rl.learner_group`` places and drives them together."""

from __future__ import annotations

import os
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from ctxpick.engines.base import LoraAdapter
from ctxpick.engines.models import TOKENIZER_FILES
from ctxpick.engines.vllm_engine import compute_dtype
from ctxpick.rl.batching import (
    MicroBatch,
    Plan,
    TrainSequence,
    collate,
    micro_batches,
)
from ctxpick.rl.grpo import GRPOConfig

LEARNER_DTYPES = ("auto", "bfloat16", "float32")


@dataclass
class LearnerConfig:
    model: str = "smollm2-135m"
    num_actors: int = 1
    num_cpus_per_actor: float = 1
    num_gpus_per_actor: float = 0
    zero_stage: int = 0
    weight_decay: float = 0.0
    warmup_steps: int = 0
    micro_batch_size: int = 4
    grad_clip: float = 1.0
    logprob_chunk: int = 256  # positions per row per LM-head call in the log-prob pass
    # A micro-batch's responses in one unpadded row (block-diagonal attention over the shared
    # prompt) instead of right-padded rows: the same log-probs, no compute on padding. Off by
    # default: in bf16 it rounds unlike vLLM's per-sequence kernels: the learner-sampler
    # log-prob gap after a sync was 0.10 packed against 0.06 padded (tests/test_learner.py's
    # ZeRO-3 case run once with packing on), each layout as close to float32 as the other.
    packing: bool = False
    # auto: bf16 on a GPU or a CPU with bf16 instructions, float32 elsewhere (a 2-core AVX2 CPU
    # ran bf16 matmuls ~90x slower than float32); rollout workers compute in the same.
    dtype: str = "auto"
    lora_rank: int = 0  # > 0: train low-rank adapters only (rl.lora_sync: how rollouts get them)
    lora_alpha: float = 16.0
    lora_targets: list[str] = field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
    )
    grpo: GRPOConfig = field(default_factory=GRPOConfig)

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0-3, got {self.zero_stage}")
        if self.num_actors < 1 or self.micro_batch_size < 1:
            raise ValueError("learner needs num_actors >= 1 and micro_batch_size >= 1")
        if self.lora_rank < 0 or (self.lora_rank and self.zero_stage == 3):
            raise ValueError("lora_rank must be >= 0, and LoRA is not combined with ZeRO-3")
        if self.dtype not in LEARNER_DTYPES:
            # float16 would need loss scaling, which this learner does not do.
            raise ValueError(f"rl.learner.dtype {self.dtype!r}: expected one of {LEARNER_DTYPES}")

    def compute_dtype(self) -> str:
        """``dtype`` resolved for the learner actors (GPU actors: bf16 under ``auto``), here in
        the driver, so that the rollout workers are given the same."""
        return compute_dtype(self.dtype, gpu=self.num_gpus_per_actor > 0)

    def deepspeed_config(self, world_size: int, dtype: str) -> dict[str, Any]:
        return {
            "train_micro_batch_size_per_gpu": self.micro_batch_size,
            "gradient_accumulation_steps": 1,  # Learner._step sets each boundary itself
            "train_batch_size": self.micro_batch_size * world_size,
            "gradient_clipping": self.grad_clip,
            "bf16": {"enabled": dtype == "bfloat16"},  # else plain float32
            "zero_optimization": {"stage": self.zero_stage},
            "steps_per_print": 10**9,
        }


class Learner:
    def __init__(
        self, cfg: LearnerConfig, lr: float, rank: int = 0, world_size: int = 1, dtype: str = ""
    ) -> None:
        import torch

        self.cfg, self.lr, self.rank, self.world_size = cfg, lr, rank, world_size
        self.dtype = dtype or cfg.compute_dtype()
        self.on_gpu = torch.cuda.is_available()
        if not self.on_gpu:
            # DeepSpeed picks its accelerator at import time.
            os.environ.setdefault("DS_ACCELERATOR", "cpu")

    def address(self) -> tuple[str, int]:
        """This node's address and a free port: rank 0's becomes the rendezvous point."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup(self, master_addr: str, master_port: int, init_from: str | None = None) -> None:
        import deepspeed
        import torch
        from transformers import AutoModelForCausalLM

        from ctxpick.engines.models import resolve
        from ctxpick.rl.deepspeed_ops import load_shm_op
        from ctxpick.rl.logprobs import check_supported

        os.environ.update(
            RANK=str(self.rank),
            LOCAL_RANK="0",
            WORLD_SIZE=str(self.world_size),
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
        )
        load_shm_op()  # before init_distributed would, under a lock a killed learner frees
        deepspeed.init_distributed(dist_backend="nccl" if self.on_gpu else "gloo")
        self.model_path = init_from or resolve(self.cfg.model)
        # No gradient checkpointing: it disables the KV cache the prompt-sharing forward
        # relies on (ctxpick/rl/logprobs.py), which saves more than it would.
        dtype = getattr(torch, self.dtype)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype)
        check_supported(model, self.cfg.packing)
        if self.cfg.lora_rank:
            from ctxpick.rl.lora import apply_lora

            apply_lora(model, self.cfg.lora_rank, self.cfg.lora_alpha, self.cfg.lora_targets)
        # A torch optimizer: DeepSpeed's fused/CPU Adam need compiled ops that CPU-only
        # machines lack, and in bf16 DeepSpeed's bf16 optimizer wraps it with fp32 master weights.
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=self.lr,
            weight_decay=self.cfg.weight_decay,
        )
        warmup = self.cfg.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config=self.cfg.deepspeed_config(self.world_size, self.dtype),
        )
        self.device = self.engine.device
        # DeepSpeed reports the gradient norm of its bf16 and ZeRO optimizers only: in float32
        # at stage 0 it steps the torch optimizer as is, so the norm (before clipping, as
        # DeepSpeed's) is taken here.
        self.own_grad_norm = self.dtype == "float32" and self.cfg.zero_stage == 0
        self.grad_norm = float("nan")
        self.ref = None
        if self.cfg.grpo.kl_coef > 0:
            self.ref = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype)
            self.ref.to(self.device).eval().requires_grad_(False)

    # -- optimisation ------------------------------------------------------------------------

    def _step(
        self, micro_batches: list[MicroBatch], total_tokens: int, temperature: float, loss_fn: Any
    ) -> dict[str, float]:
        """One optimizer step over this rank's share of a (mini-)batch. ``loss_fn(logp, batch,
        index)`` returns a summed loss; scaling by ``world / total_tokens`` undoes DeepSpeed's
        mean over ranks, so the update is a token mean over the global (mini-)batch.

        The accumulation boundary is set by hand at every micro-batch: DeepSpeed's own counts
        micro-steps since the engine started against a fixed accumulation count, so mini-batches
        of different sizes would step mid-batch and carry gradients into the next one."""
        import torch

        totals: dict[str, float] = {}
        for i, mb in enumerate(micro_batches):
            self.engine.set_gradient_accumulation_boundary(i == len(micro_batches) - 1)
            batch = collate(mb, self.device)
            logp, entropy = self._logprobs(self.engine, batch, temperature)
            loss_sum, stats = loss_fn(logp, batch, i)
            self.engine.backward(
                loss_sum * self.world_size / max(total_tokens, 1), scale_wrt_gas=False
            )
            if i == len(micro_batches) - 1 and self.own_grad_norm:
                self.grad_norm = float(
                    torch.nn.utils.get_total_norm(
                        [p.grad for p in self.engine.module.parameters() if p.grad is not None]
                    )
                )
            self.engine.step()
            stats |= {
                "loss": loss_sum.detach(),
                "entropy": (entropy * batch["mask"]).sum(),
                "tokens": batch["mask"].sum(),
            }
            for name, value in stats.items():
                totals[name] = totals.get(name, 0.0) + float(value)
        return totals

    def _updates(
        self, plan: Plan, tokens: list[int], temperature: float, epochs: int, loss_fn: Any
    ) -> dict[str, float]:
        """``epochs`` passes over the mini-batches, one optimizer step each; statistics summed
        over every step (the caller divides by the tokens they cover)."""
        totals: dict[str, float] = {}
        for _ in range(epochs):
            for m, (mini, n_tokens) in enumerate(zip(plan, tokens, strict=True)):
                step = self._step(
                    mini, n_tokens, temperature, lambda lp, b, i, m=m: loss_fn(lp, b, m, i)
                )
                for name, value in step.items():
                    totals[name] = totals.get(name, 0.0) + value
        grad_norm = self.grad_norm if self.own_grad_norm else self.engine.get_global_grad_norm()
        totals["grad_norm"] = float(grad_norm) if grad_norm is not None else float("nan")
        totals["lr"] = float(self.scheduler.get_last_lr()[0])
        return totals

    def _logprobs(self, model: Any, batch: dict[str, Any], temperature: float) -> tuple[Any, Any]:
        from ctxpick.rl.logprobs import group_logprobs

        return group_logprobs(
            model,
            batch["prompt"],
            batch["ids"],
            batch["present"],
            self.cfg.logprob_chunk,
            temperature,
            packed=self.cfg.packing,
        )

    def sft_step(self, plan: Plan, tokens: list[int]) -> dict[str, float]:
        """Token-mean next-token NLL on the responses (temperature 1): the optional warm start."""

        def nll(logp: Any, batch: dict[str, Any], m: int, i: int) -> tuple[Any, dict[str, Any]]:
            return -(logp * batch["mask"] * batch["weight"]).sum(), {}

        return self._updates(plan, tokens, 1.0, 1, nll)

    def grpo_step(self, plan: Plan, tokens: list[int], temperature: float) -> dict[str, float]:
        """GRPO on one rollout batch. On-policy (one epoch, one mini-batch) the old log-probs
        are the current ones, detached: ratio 1 in value, not in gradient. Otherwise they are
        taken once, before the first update, and every later step is clipped against them."""
        import torch

        from ctxpick.rl.grpo import grpo_token_loss

        cfg = self.cfg.grpo
        old = None
        if not cfg.on_policy:
            with torch.no_grad():
                old = [
                    [
                        self._logprobs(self.engine, collate(mb, self.device), temperature)[0]
                        for mb in mini
                    ]
                    for mini in plan
                ]

        def loss(logp: Any, batch: dict[str, Any], m: int, i: int) -> tuple[Any, dict[str, Any]]:
            ref = None
            if self.ref is not None:
                with torch.no_grad():
                    ref, _ = self._logprobs(self.ref, batch, temperature)
            return grpo_token_loss(
                logp,
                logp.detach() if old is None else old[m][i],
                batch["adv"],
                batch["mask"],
                cfg,
                ref_logp=ref,
                sampler_logp=batch["sampler"],
            )

        return self._updates(plan, tokens, temperature, cfg.update_epochs, loss)

    def logprobs(self, seqs: list[TrainSequence], temperature: float = 1.0) -> list[list[float]]:
        """Log-prob of each response token under the current weights, at ``temperature``.
        Under ZeRO-3 every rank must be called with the same sequences."""
        import torch

        out = []
        with torch.no_grad():
            for mb in micro_batches(seqs, self.cfg.micro_batch_size):
                batch = collate(mb, self.device)
                logp, _ = self._logprobs(self.engine, batch, temperature)
                out += [
                    logp[i, : len(s.ids) - s.prompt_len].tolist() for i, s in enumerate(mb.seqs)
                ]
        return out

    # -- weights and checkpoints -------------------------------------------------------------

    def _full_state(self) -> dict[str, Any]:
        """Whole (ZeRO-3: gathered) weights under the model's own names, LoRA merged."""
        import deepspeed

        from ctxpick.rl.lora import merged_state

        def gather(params: list[Any]) -> Any:
            return deepspeed.zero.GatheredParameters(params, enabled=self.cfg.zero_stage == 3)

        return merged_state(self.engine.module, gather)

    def weight_buckets(self, bucket_mb: int = 256) -> list[bytes]:
        """The weights as safetensors blobs of at most ``bucket_mb`` each: what the rollout
        workers load. Every rank must be called (ZeRO-3 gathers are collective); rank 0 returns
        the blobs, the others an empty list. Bytes travel through Ray's object store, so this
        works across nodes."""
        from safetensors.torch import save

        state = self._full_state()
        if self.rank != 0:
            return []
        buckets, current, size = [], {}, 0
        for name, tensor in state.items():
            nbytes = tensor.numel() * tensor.element_size()
            if current and size + nbytes > bucket_mb << 20:
                buckets.append(save(current))
                current, size = {}, 0
            current[name], size = tensor, size + nbytes
        if current:
            buckets.append(save(current))
        return buckets

    def adapter(self) -> LoraAdapter:
        """The LoRA adapter alone, in PEFT's format for the base model this learner loaded:
        what rollout engines serving that base need (no collective: LoRA excludes ZeRO-3)."""
        from ctxpick.rl.lora import adapter

        cfg = self.cfg
        if not cfg.lora_rank:
            raise RuntimeError("adapter(): this learner trains no LoRA (lora_rank=0)")
        return adapter(
            self.engine.module, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets, self.model_path
        )

    def connect_engines(self, mode: str, engines: list[Any], rendezvous: Any) -> None:
        """GPU weight transfer (``nccl`` / ``ipc``) to the rollout engines, on every rank."""
        from ctxpick.rl.weight_sync import trainer_engine

        module = self.engine.module
        self.transfer = trainer_engine(
            mode, module, self.cfg.zero_stage, self.rank, engines, rendezvous
        )

    def send_weights(self) -> None:
        """One GPU weight push; every rank joins (ZeRO-3 gathers), rank 0 sends."""
        self.transfer.send_weights()

    def save_pretrained(self, path: str) -> str:
        """A self-contained HF folder (weights, config, tokenizer): Stage II starts from it and
        ``picker.model`` can name it. With LoRA, also the adapter alone in ``adapter/`` (a
        subfolder: transformers would read an adapter_config.json beside the weights as an
        adapter to load onto its base)."""
        state = self._full_state()
        if self.rank == 0:
            out = Path(path)
            self.engine.module.save_pretrained(out, state_dict=state, safe_serialization=True)
            for name in TOKENIZER_FILES:
                if (Path(self.model_path) / name).exists():
                    shutil.copy(Path(self.model_path) / name, out / name)
            if self.cfg.lora_rank:
                self.adapter().write(str(out / "adapter"))
        return path

    def save_checkpoint(self, path: str, tag: str, client_state: dict[str, Any]) -> None:
        import torch

        # The RNG state first: DeepSpeed writes `latest` last, so once it names this tag the
        # checkpoint is whole, and a crash between the two never leaves one a resume fails on.
        (Path(path) / tag).mkdir(parents=True, exist_ok=True)
        torch.save(torch.get_rng_state(), Path(path) / tag / f"rng_rank{self.rank}.pt")
        self.engine.save_checkpoint(path, tag=tag, client_state=client_state)

    def load_checkpoint(self, path: str, tag: str) -> dict[str, Any]:
        import torch

        _, client_state = self.engine.load_checkpoint(path, tag=tag)
        torch.set_rng_state(torch.load(Path(path) / tag / f"rng_rank{self.rank}.pt"))
        return client_state or {}

    def state_checksum(self) -> float:
        """Sum of all parameters: a cheap way to see that a step changed (or a load restored)
        the weights."""
        return float(sum(t.float().sum() for t in self._full_state().values()))
