"""A DeepSpeed learner in a Ray actor: bf16, ZeRO stage from config, gloo on CPU and NCCL on GPU.
One actor is one data-parallel rank; :class:`LearnerGroup` places and drives them together."""

from __future__ import annotations

import math
import os
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ctxpick.rl.grpo import GRPOConfig

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)


@dataclass
class LearnerConfig:
    model: str = "smollm2-135m"
    num_actors: int = 1
    num_cpus_per_actor: float = 1
    num_gpus_per_actor: float = 0
    placement_strategy: str = "PACK"  # PACK | SPREAD | STRICT_PACK | STRICT_SPREAD
    zero_stage: int = 0
    weight_decay: float = 0.0
    warmup_steps: int = 0
    micro_batch_size: int = 4
    grad_clip: float = 1.0
    logprob_chunk: int = 256  # positions per LM-head chunk in the log-prob pass
    grpo: GRPOConfig = field(default_factory=GRPOConfig)

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0-3, got {self.zero_stage}")
        if self.num_actors < 1 or self.micro_batch_size < 1:
            raise ValueError("learner needs num_actors >= 1 and micro_batch_size >= 1")
        if self.placement_strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise ValueError(f"unknown placement_strategy {self.placement_strategy!r}")

    def deepspeed_config(self, world_size: int) -> dict[str, Any]:
        return {
            "train_micro_batch_size_per_gpu": self.micro_batch_size,
            "gradient_accumulation_steps": 1,  # set per step from the batch size
            "train_batch_size": self.micro_batch_size * world_size,
            "gradient_clipping": self.grad_clip,
            "bf16": {"enabled": True},
            "zero_optimization": {"stage": self.zero_stage},
            "steps_per_print": 10**9,
        }


@dataclass(frozen=True)
class TrainSequence:
    ids: list[int]  # prompt + response token ids
    prompt_len: int  # loss is on ids[prompt_len:]
    advantage: float = 0.0
    sampler_logps: list[float] | None = None  # the rollout engine's logprob of each response token


class Learner:
    def __init__(self, cfg: LearnerConfig, lr: float, rank: int = 0, world_size: int = 1) -> None:
        import torch

        self.cfg, self.lr, self.rank, self.world_size = cfg, lr, rank, world_size
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

        os.environ.update(
            RANK=str(self.rank),
            LOCAL_RANK="0",
            WORLD_SIZE=str(self.world_size),
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
        )
        deepspeed.init_distributed(dist_backend="nccl" if self.on_gpu else "gloo")
        self.model_path = init_from or resolve(self.cfg.model)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.bfloat16)
        model.gradient_checkpointing_enable()
        # A torch optimizer: DeepSpeed's fused/CPU Adam need compiled ops that CPU-only
        # machines lack, and DeepSpeed's bf16 optimizer wraps it with fp32 master weights.
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=self.lr, weight_decay=self.cfg.weight_decay
        )
        warmup = self.cfg.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config=self.cfg.deepspeed_config(self.world_size),
        )
        self.device = self.engine.device
        self.ref = None
        if self.cfg.grpo.kl_coef > 0:
            self.ref = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.bfloat16)
            self.ref.to(self.device).eval().requires_grad_(False)

    # -- optimisation ------------------------------------------------------------------------

    def _step(
        self,
        seqs: list[TrainSequence],
        total_tokens: int,
        grad_accum: int,
        loss_fn: Callable[[Any, dict[str, Any]], tuple[Any, dict[str, Any]]],
    ) -> dict[str, float]:
        """One optimizer step over this rank's share of a global batch. ``loss_fn`` returns a
        summed loss; scaling by ``grad_accum * world / total_tokens`` undoes DeepSpeed's
        mean over micro-batches and ranks, so the update is a token mean over the global batch.
        """
        from ctxpick.rl.logprobs import sequence_logprobs

        self.engine.set_train_batch_size(self.cfg.micro_batch_size * grad_accum * self.world_size)
        size = math.ceil(len(seqs) / grad_accum)
        totals: dict[str, float] = {}
        for k in range(grad_accum):
            micro = _collate(seqs[k * size : (k + 1) * size], self.device)
            logp, entropy = sequence_logprobs(
                self.engine, micro["ids"], micro["attn"], self.cfg.logprob_chunk
            )
            micro["entropy"] = entropy
            loss_sum, stats = loss_fn(logp, micro)
            scale = grad_accum * self.world_size / max(total_tokens, 1)
            self.engine.backward(loss_sum * scale)
            self.engine.step()
            stats = {**stats, "loss": loss_sum.detach(), "entropy": (entropy * micro["mask"]).sum()}
            for name, value in stats.items():
                totals[name] = totals.get(name, 0.0) + float(value)
        grad_norm = self.engine.get_global_grad_norm()
        totals["grad_norm"] = float(grad_norm) if grad_norm is not None else float("nan")
        totals["lr"] = float(self.scheduler.get_last_lr()[0])
        return totals

    def sft_step(
        self, seqs: list[TrainSequence], total_tokens: int, grad_accum: int = 1
    ) -> dict[str, float]:
        """Token-mean next-token NLL on the responses: the optional warm start."""

        def nll(logp: Any, micro: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            return -(logp * micro["mask"]).sum(), {"tokens": micro["mask"].sum()}

        return self._step(seqs, total_tokens, grad_accum, nll)

    def grpo_step(
        self, seqs: list[TrainSequence], total_tokens: int, grad_accum: int = 1
    ) -> dict[str, float]:
        import torch

        from ctxpick.rl.grpo import grpo_token_loss
        from ctxpick.rl.logprobs import sequence_logprobs

        def loss(logp: Any, micro: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            ref = None
            if self.ref is not None:
                with torch.no_grad():
                    ref, _ = sequence_logprobs(self.ref, micro["ids"], micro["attn"])
            # One update per rollout batch: the policy that sampled is the one being updated,
            # so old log-probs are the current ones, detached (ratio 1 in value, not in grad).
            total, stats = grpo_token_loss(
                logp,
                logp.detach(),
                micro["adv"],
                micro["mask"],
                self.cfg.grpo,
                ref_logp=ref,
                sampler_logp=micro["sampler"],
            )
            return total, {**stats, "tokens": micro["mask"].sum()}

        return self._step(seqs, total_tokens, grad_accum, loss)

    def logprobs(self, seqs: list[TrainSequence]) -> list[list[float]]:
        """Log-prob of each response token under the current weights."""
        import torch

        from ctxpick.rl.logprobs import sequence_logprobs

        with torch.no_grad():
            batch = _collate(seqs, self.device)
            logp, _ = sequence_logprobs(self.engine, batch["ids"], batch["attn"])
        return [logp[i, s.prompt_len - 1 : len(s.ids) - 1].tolist() for i, s in enumerate(seqs)]

    # -- weights and checkpoints -------------------------------------------------------------

    def _full_state(self) -> dict[str, Any]:
        import deepspeed

        state = {}
        for name, p in self.engine.module.named_parameters():
            with deepspeed.zero.GatheredParameters([p], enabled=self.cfg.zero_stage == 3):
                state[name] = p.detach().to("cpu", copy=True).contiguous()
        return state

    def weight_buckets(self, bucket_mb: int = 256) -> list[bytes]:
        """The weights as safetensors blobs of at most ``bucket_mb`` each: what the rollout
        workers load. Bytes travel through Ray's object store, so this works across nodes."""
        from safetensors.torch import save

        buckets, current, size = [], {}, 0
        for name, tensor in self._full_state().items():
            nbytes = tensor.numel() * tensor.element_size()
            if current and size + nbytes > bucket_mb << 20:
                buckets.append(save(current))
                current, size = {}, 0
            current[name], size = tensor, size + nbytes
        if current:
            buckets.append(save(current))
        return buckets

    def save_pretrained(self, path: str) -> str:
        """A self-contained HF folder (weights, config, tokenizer): Stage II starts from it and
        ``picker.model`` can name it."""
        state = self._full_state()
        if self.rank == 0:
            out = Path(path)
            self.engine.module.save_pretrained(out, state_dict=state, safe_serialization=True)
            for name in TOKENIZER_FILES:
                if (Path(self.model_path) / name).exists():
                    shutil.copy(Path(self.model_path) / name, out / name)
        return path

    def save_checkpoint(self, path: str, tag: str, client_state: dict[str, Any]) -> None:
        import torch

        self.engine.save_checkpoint(path, tag=tag, client_state=client_state)
        torch.save(torch.get_rng_state(), Path(path) / tag / f"rng_rank{self.rank}.pt")

    def load_checkpoint(self, path: str, tag: str) -> dict[str, Any]:
        import torch

        _, client_state = self.engine.load_checkpoint(path, tag=tag)
        torch.set_rng_state(torch.load(Path(path) / tag / f"rng_rank{self.rank}.pt"))
        return client_state or {}

    def state_checksum(self) -> float:
        """Sum of all parameters: a cheap way to see that a step changed (or a load restored)
        the weights."""
        return float(sum(t.float().sum() for t in self._full_state().values()))


def _collate(seqs: list[TrainSequence], device: Any) -> dict[str, Any]:
    """Right-padded ids, attention, response mask, advantages and sampler log-probs, all
    aligned with the shifted targets (position t predicts token t+1)."""
    import torch

    width = max(len(s.ids) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros(len(seqs), width - 1)
    sampler = torch.zeros(len(seqs), width - 1)
    for i, s in enumerate(seqs):
        if not 0 < s.prompt_len < len(s.ids):
            raise ValueError(f"sequence {i}: prompt_len {s.prompt_len} of {len(s.ids)} tokens")
        ids[i, : len(s.ids)] = torch.tensor(s.ids)
        attn[i, : len(s.ids)] = 1
        mask[i, s.prompt_len - 1 : len(s.ids) - 1] = 1
        if s.sampler_logps is not None:
            sampler[i, s.prompt_len - 1 : len(s.ids) - 1] = torch.tensor(s.sampler_logps)
    has_sampler = all(s.sampler_logps is not None for s in seqs)
    return {
        "ids": ids.to(device),
        "attn": attn.to(device),
        "mask": mask.to(device),
        "adv": torch.tensor([s.advantage for s in seqs]).to(device),
        "sampler": sampler.to(device) if has_sampler else None,
    }


class LearnerGroup:
    """Data-parallel learners placed by a placement group; every call goes to all ranks."""

    def __init__(self, cfg: LearnerConfig, lr: float, init_from: str | None = None) -> None:
        bundle = {"CPU": cfg.num_cpus_per_actor}
        if cfg.num_gpus_per_actor:
            bundle["GPU"] = cfg.num_gpus_per_actor
        self.pg = placement_group([bundle] * cfg.num_actors, strategy=cfg.placement_strategy)
        ray.get(self.pg.ready())
        env = (
            {}
            if cfg.num_gpus_per_actor
            else {"OMP_NUM_THREADS": str(max(1, int(cfg.num_cpus_per_actor)))}
        )
        self.actors = [
            ray.remote(Learner)
            .options(
                num_cpus=cfg.num_cpus_per_actor,
                num_gpus=cfg.num_gpus_per_actor,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.pg, placement_group_bundle_index=rank
                ),
                runtime_env={"env_vars": env},
            )
            .remote(cfg, lr, rank, cfg.num_actors)
            for rank in range(cfg.num_actors)
        ]
        addr, port = ray.get(self.actors[0].address.remote())
        ray.get([a.setup.remote(addr, port, init_from) for a in self.actors])
        self.cfg = cfg

    def shards(self, seqs: list[TrainSequence]) -> list[list[TrainSequence]]:
        n = len(self.actors)
        if len(seqs) % n:
            raise ValueError(f"{len(seqs)} sequences do not split over {n} learners")
        return [seqs[r::n] for r in range(n)]

    def step(self, method: str, seqs: list[TrainSequence]) -> dict[str, float]:
        """``sft_step`` or ``grpo_step`` on the global batch; statistics are summed over ranks
        and turned into token means (loss, entropy, kl, clip fraction)."""
        total_tokens = sum(len(s.ids) - s.prompt_len for s in seqs)
        shards = self.shards(seqs)
        grad_accum = math.ceil(len(shards[0]) / self.cfg.micro_batch_size)
        results = ray.get(
            [
                getattr(a, method).remote(s, total_tokens, grad_accum)
                for a, s in zip(self.actors, shards, strict=True)
            ]
        )
        summed = {k: sum(r[k] for r in results) for k in results[0] if k not in ("grad_norm", "lr")}
        out = {k: v / max(total_tokens, 1) for k, v in summed.items() if k != "tokens"}
        if "clipped" in out:
            out["clip_fraction"] = out.pop("clipped")
        return {
            **out,
            "tokens": total_tokens,
            "grad_norm": results[0]["grad_norm"],
            "lr": results[0]["lr"],
        }

    def call(self, method: str, *args: Any) -> list[Any]:
        return ray.get([getattr(a, method).remote(*args) for a in self.actors])

    def shutdown(self) -> None:
        for a in self.actors:
            ray.kill(a)
        ray.util.remove_placement_group(self.pg)
