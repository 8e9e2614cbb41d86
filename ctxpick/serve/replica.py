"""The ``PickerEngine`` deployment: one picker per replica, its vLLM engine in a Ray actor."""

from __future__ import annotations

from ray import serve

from ctxpick.picker.inference import Picker
from ctxpick.picker.selection import Candidate, Selection
from ctxpick.serve.settings import ServeConfig

# question, candidates, token budget, each candidate's tokens (counted by the ingress)
Job = tuple[str, list[Candidate], int | None, list[int]]


@serve.deployment(name="PickerEngine")
class PickerEngine:
    """One picker, fed one batch of the concurrent requests at a time (``Picker.apick``
    batches them: requests that queue while the engine is busy go into its next call).

    The engine runs outside this replica's process, as plain vLLM does: inside it, it shared
    the process with Serve's own threads and ran 17-21% slower per call of the same prompts
    (benchmarks/bench_serve.py: the engine was busy 98-99% of the time, so the service's
    shortfall against plain vLLM was the engine itself). The actor is owned by this replica
    and dies with it; a dead engine actor is replaced and its batch redone."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.picker = Picker.from_pretrained(
            cfg.picker,
            engine="actor",
            num_cpus=cfg.num_cpus_per_replica,
            num_gpus=cfg.num_gpus_per_replica,
            max_model_len=cfg.max_model_len,
            cpu_kv_cache_gb=cfg.cpu_kv_cache_gb,
            fallback=cfg.fallback,
            fallback_k=cfg.fallback_k,
            constrained=cfg.constrained,
            name=cfg.picker,
            max_batch_size=cfg.max_batch_size,
            batch_wait_s=cfg.batch_wait_timeout_s,
        )

    def ready(self) -> bool:
        return True

    async def pick(self, job: Job) -> Selection:
        question, candidates, budget, sizes = job
        # A cancelled request (its client left, or its deadline passed) is dropped from the
        # batch it waits for.
        return await self.picker.apick(question, candidates, budget, sizes)
