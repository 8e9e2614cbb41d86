"""A DeepSpeed learner in a Ray actor: bf16, ZeRO stage from config, gloo on CPU and NCCL on GPU.
One actor is one data-parallel rank; :class:`LearnerGroup` places and drives them together."""

from __future__ import annotations

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
    lora_rank: int = 0  # > 0: train low-rank adapters only (merged for rollouts and final/)
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
        # No gradient checkpointing: it disables the KV cache the prompt-sharing forward
        # relies on (ctxpick/rl/logprobs.py), which saves more than it would.
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.bfloat16)
        if self.cfg.lora_rank:
            from ctxpick.rl.lora import apply_lora

            apply_lora(model, self.cfg.lora_rank, self.cfg.lora_alpha, self.cfg.lora_targets)
        # A torch optimizer: DeepSpeed's fused/CPU Adam need compiled ops that CPU-only
        # machines lack, and DeepSpeed's bf16 optimizer wraps it with fp32 master weights.
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
        loss_fn: Callable[[Any, dict[str, Any]], tuple[Any, dict[str, Any]]],
    ) -> dict[str, float]:
        """One optimizer step over this rank's share of a global batch. A micro-batch is one
        prompt with up to ``micro_batch_size`` of its responses. ``loss_fn`` returns a summed
        loss; scaling by ``micro-batches * world / total_tokens`` undoes DeepSpeed's mean over
        micro-batches and ranks, so the update is a token mean over the global batch."""
        micro_batches = _micro_batches(seqs, self.cfg.micro_batch_size)
        accum = len(micro_batches)
        self.engine.set_train_batch_size(self.cfg.micro_batch_size * accum * self.world_size)
        totals: dict[str, float] = {}
        for group in micro_batches:
            batch = _collate(group, self.device)
            logp, entropy = self._logprobs(self.engine, batch)
            loss_sum, stats = loss_fn(logp, batch)
            self.engine.backward(loss_sum * accum * self.world_size / max(total_tokens, 1))
            self.engine.step()
            stats |= {
                "loss": loss_sum.detach(),
                "entropy": (entropy * batch["mask"]).sum(),
                "tokens": batch["mask"].sum(),
            }
            for name, value in stats.items():
                totals[name] = totals.get(name, 0.0) + float(value)
        grad_norm = self.engine.get_global_grad_norm()
        totals["grad_norm"] = float(grad_norm) if grad_norm is not None else float("nan")
        totals["lr"] = float(self.scheduler.get_last_lr()[0])
        return totals

    def _logprobs(self, model: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
        from ctxpick.rl.logprobs import group_logprobs

        return group_logprobs(
            model, batch["prompt"], batch["ids"], batch["mask"], self.cfg.logprob_chunk
        )

    def sft_step(self, seqs: list[TrainSequence], total_tokens: int) -> dict[str, float]:
        """Token-mean next-token NLL on the responses: the optional warm start."""

        def nll(logp: Any, batch: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            return -(logp * batch["mask"]).sum(), {}

        return self._step(seqs, total_tokens, nll)

    def grpo_step(self, seqs: list[TrainSequence], total_tokens: int) -> dict[str, float]:
        import torch

        from ctxpick.rl.grpo import grpo_token_loss

        def loss(logp: Any, batch: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            ref = None
            if self.ref is not None:
                with torch.no_grad():
                    ref, _ = self._logprobs(self.ref, batch)
            # One update per rollout batch: the policy that sampled is the one being updated,
            # so old log-probs are the current ones, detached (ratio 1 in value, not in grad).
            return grpo_token_loss(
                logp,
                logp.detach(),
                batch["adv"],
                batch["mask"],
                self.cfg.grpo,
                ref_logp=ref,
                sampler_logp=batch["sampler"],
            )

        return self._step(seqs, total_tokens, loss)

    def logprobs(self, seqs: list[TrainSequence]) -> list[list[float]]:
        """Log-prob of each response token under the current weights."""
        import torch

        out = []
        with torch.no_grad():
            for group in _micro_batches(seqs, self.cfg.micro_batch_size):
                batch = _collate(group, self.device)
                logp, _ = self._logprobs(self.engine, batch)
                out += [logp[i, : len(s.ids) - s.prompt_len].tolist() for i, s in enumerate(group)]
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


def _micro_batches(seqs: list[TrainSequence], size: int) -> list[list[TrainSequence]]:
    """Consecutive sequences with the same prompt, at most ``size`` per micro-batch."""
    out: list[list[TrainSequence]] = []
    for s in seqs:
        last = out[-1] if out else None
        same = (
            last and len(last) < size and last[0].ids[: last[0].prompt_len] == s.ids[: s.prompt_len]
        )
        if same:
            last.append(s)
        else:
            out.append([s])
    return out


def _collate(group: list[TrainSequence], device: Any) -> dict[str, Any]:
    """One prompt and its right-padded responses, with the response mask, advantages and the
    sampler's log-probs, all aligned with the response tokens."""
    import torch

    width = max(len(s.ids) - s.prompt_len for s in group)
    ids = torch.zeros(len(group), width, dtype=torch.long)
    mask = torch.zeros(len(group), width)
    sampler = torch.zeros(len(group), width)
    for i, s in enumerate(group):
        if not 0 < s.prompt_len < len(s.ids):
            raise ValueError(f"sequence {i}: prompt_len {s.prompt_len} of {len(s.ids)} tokens")
        n = len(s.ids) - s.prompt_len
        ids[i, :n] = torch.tensor(s.ids[s.prompt_len :])
        mask[i, :n] = 1
        if s.sampler_logps is not None:
            sampler[i, :n] = torch.tensor(s.sampler_logps)
    has_sampler = all(s.sampler_logps is not None for s in group)
    return {
        "prompt": torch.tensor(group[0].ids[: group[0].prompt_len]).to(device),
        "ids": ids.to(device),
        "mask": mask.to(device),
        "adv": torch.tensor([s.advantage for s in group]).to(device),
        "sampler": sampler.to(device) if has_sampler else None,
    }


def shard_groups(seqs: list[TrainSequence], n: int) -> list[list[TrainSequence]]:
    """Whole prompt groups per rank (a group's prompt is run once), the same number each, so
    every rank takes the same number of micro-batches."""
    groups = _micro_batches(seqs, len(seqs))
    if len(groups) % n:
        raise ValueError(f"{len(groups)} prompt groups do not split over {n} learners")
    return [[s for g in groups[r::n] for s in g] for r in range(n)]


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

    def step(self, method: str, seqs: list[TrainSequence]) -> dict[str, float]:
        """``sft_step`` or ``grpo_step`` on the global batch; statistics are summed over ranks
        and turned into token means (loss, entropy, kl, clip fraction)."""
        total_tokens = sum(len(s.ids) - s.prompt_len for s in seqs)
        shards = shard_groups(seqs, len(self.actors))
        results = ray.get(
            [
                getattr(a, method).remote(s, total_tokens)
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
