"""The data-parallel learners of a stage: one :class:`~ctxpick.rl.learner.Learner` actor per
rank, placed together by a placement group; every call goes to all ranks."""

from __future__ import annotations

from typing import Any

import ray

from ctxpick.engines.ray_pool import Placement, actor_bundles, in_bundle, reserve
from ctxpick.rl.batching import TrainSequence, plan_updates
from ctxpick.rl.learner import Learner, LearnerConfig


def get_all(refs: list[ray.ObjectRef]) -> list[Any]:
    """``ray.get`` of every ref, raising the first failure as soon as it happens: the peers
    of a dead rank wait in a collective and would never return."""
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        ray.get(done[0])
    return ray.get(refs)


class LearnerGroup:
    """Data-parallel learners placed by a placement group (a stage's, or their own, waited
    for up to ``reserve_timeout_s``: None, as long as it takes); every call goes to all
    ranks."""

    def __init__(
        self,
        cfg: LearnerConfig,
        lr: float,
        init_from: str | None = None,
        placement: Placement | None = None,
        reserve_timeout_s: float | None = None,
    ) -> None:
        self.owned_pg, self.dtype = None, cfg.compute_dtype()  # one dtype for every rank
        if placement is None:
            self.owned_pg = reserve(
                actor_bundles(cfg), "PACK", "ctxpick-learners", reserve_timeout_s
            )
            placement = (self.owned_pg, 0)
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
                scheduling_strategy=in_bundle(placement, rank),
                runtime_env={"env_vars": env},
            )
            .remote(cfg, lr, rank, cfg.num_actors, self.dtype)
            for rank in range(cfg.num_actors)
        ]
        addr, port = ray.get(self.actors[0].address.remote())
        ray.get([a.setup.remote(addr, port, init_from) for a in self.actors])
        self.cfg = cfg

    def step(self, method: str, seqs: list[TrainSequence], *args: Any) -> dict[str, float]:
        """``sft_step`` or ``grpo_step`` (``*args``: its temperature) on the global batch;
        statistics are summed over ranks and updates and turned into token means (loss,
        entropy, kl, clip fraction)."""
        longest = max(len(s.ids) - s.prompt_len for s in seqs)
        if self.cfg.zero_stage == 3 and longest > self.cfg.logprob_chunk:
            # ZeRO-3 gathers the LM head on every rank for each chunk of a micro-batch
            # (ctxpick/rl/logprobs.py): ranks needing more chunks than others would wait forever.
            raise ValueError(
                f"a response of {longest} tokens exceeds rl.learner.logprob_chunk="
                f"{self.cfg.logprob_chunk} under ZeRO-3: raise logprob_chunk"
            )
        grpo = self.cfg.grpo
        minis = grpo.mini_batches if method == "grpo_step" else 1
        plans, tokens = plan_updates(seqs, self.cfg.micro_batch_size, len(self.actors), minis)
        results = get_all(
            [
                getattr(a, method).remote(plan, tokens, *args)
                for a, plan in zip(self.actors, plans, strict=True)
            ]
        )
        summed = {k: sum(r[k] for r in results) for k in results[0] if k not in ("grad_norm", "lr")}
        counted = max(summed.pop("tokens"), 1)  # tokens x update epochs
        out = {k: v / counted for k, v in summed.items()}
        if "clipped" in out:
            out["clip_fraction"] = out.pop("clipped")
        return {
            **out,
            "tokens": sum(tokens),
            "grad_norm": results[0]["grad_norm"],
            "lr": results[0]["lr"],
        }

    def connect_engines(self, mode: str, engines: list[Any]) -> None:
        """Set up vLLM's GPU weight transfer from the learners to ``engines`` (actor handles)."""
        rendezvous = ray.get(self.actors[0].address.remote())  # a free port on rank 0's node
        self.call("connect_engines", mode, engines, rendezvous)

    def weight_buckets(self, bucket_mb: int) -> ray.ObjectRef:
        """Rank 0's weight buckets; every rank joins the gather, and this returns once all
        have (a rank still gathering would hold the next collective)."""
        refs = [a.weight_buckets.remote(bucket_mb) for a in self.actors]
        ray.wait(refs, num_returns=len(refs), fetch_local=False)
        return refs[0]

    def adapter(self) -> ray.ObjectRef:
        """Rank 0's LoRA adapter (every rank holds the same)."""
        return self.actors[0].adapter.remote()

    def call(self, method: str, *args: Any) -> list[Any]:
        return get_all([getattr(a, method).remote(*args) for a in self.actors])

    def shutdown(self) -> None:
        for a in self.actors:
            ray.kill(a)
        if self.owned_pg is not None:
            ray.util.remove_placement_group(self.owned_pg)
