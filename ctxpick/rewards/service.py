"""The reward service: a Ray actor that scores rollouts in batches, and the client the trainer
uses. Each request (one prompt's group of samples) gets a deadline; a request that misses it
gets the fallback reward, is logged, and the actor is replaced, so a slow or hung scorer costs
at most one timeout and never stalls training."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import ray

from ctxpick.rewards.reward import RewardSpec, RewardTerms, score_output


@dataclass(frozen=True)
class RewardRequest:
    texts: tuple[str, ...]  # the group's sampled outputs
    num_passages: int
    gold: tuple[int, ...]


Scorer = Callable[[RewardRequest, RewardSpec], list[RewardTerms]]


def score_request(req: RewardRequest, spec: RewardSpec) -> list[RewardTerms]:
    return [score_output(t, req.num_passages, req.gold, spec) for t in req.texts]


class RewardService:
    def __init__(self, scorer: Scorer = score_request) -> None:
        self.scorer = scorer

    def ready(self) -> bool:
        return True

    def score(self, req: RewardRequest, spec: RewardSpec) -> list[RewardTerms]:
        return self.scorer(req, spec)


class RewardClient:
    def __init__(
        self,
        timeout_s: float = 30.0,
        fallback: float = 0.0,
        scorer: Scorer = score_request,
        max_concurrency: int = 8,
    ) -> None:
        self.timeout_s, self.fallback, self.scorer = timeout_s, fallback, scorer
        self.max_concurrency = max_concurrency
        self.timeouts = 0
        self.actor = self._start()

    def _start(self) -> ray.actor.ActorHandle:
        # Threaded actor: one hung request must not block the rest of the batch.
        actor = (
            ray.remote(RewardService)
            .options(num_cpus=0, max_concurrency=self.max_concurrency)
            .remote(self.scorer)
        )
        ray.get(actor.ready.remote())  # deadlines time scoring, not a worker process starting
        return actor

    def score(self, requests: Sequence[RewardRequest], spec: RewardSpec) -> list[list[RewardTerms]]:
        refs = [self.actor.score.remote(r, spec) for r in requests]
        deadline = time.time() + self.timeout_s
        results: list[list[RewardTerms] | None] = [None] * len(refs)
        pending = dict(zip(refs, range(len(refs)), strict=True))
        while pending:
            ready, _ = ray.wait(
                list(pending), num_returns=1, timeout=max(0.0, deadline - time.time())
            )
            if not ready:
                break
            results[pending.pop(ready[0])] = ray.get(ready[0])
        if pending:
            self.timeouts += len(pending)
            print(
                f"  reward service: {len(pending)} request(s) timed out after {self.timeout_s}s; "
                f"fallback reward {self.fallback}, restarting the service",
                flush=True,
            )
            ray.kill(self.actor)
            self.actor = self._start()
        fallback = RewardTerms(self.fallback, 0.0, 0.0, False, 0, False, "timeout", timed_out=True)
        return [
            r if r is not None else [fallback] * len(req.texts)
            for r, req in zip(results, requests, strict=True)
        ]

    def shutdown(self) -> None:
        ray.kill(self.actor)
