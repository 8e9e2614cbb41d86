"""A set of engine actors fed batches of prompts, with progress; dead engines replaced."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ctxpick.engines.base import Chat, Completion, SamplingConfig
from ctxpick.engines.dispatch import dispatch
from ctxpick.engines.vllm_engine import check_dtype, compute_dtype, start_engine_actor

Progress = Callable[[int, int, float], None]


@dataclass
class EngineConfig:
    num_actors: int = 1
    num_cpus_per_actor: float = 1
    num_gpus_per_actor: float = 0
    max_model_len: int = 8192
    cpu_kv_cache_gb: int = 4
    gpu_memory_utilization: float = 0.85
    batch_size: int = 16  # prompts per engine call, for progress reporting
    # vllm_engine.compute_dtype: bf16 where the hardware has a fast path. Rollout workers
    # compute in the learner's dtype whatever this says (rl/run.py); evaluated pickers use it.
    dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.num_actors < 1 or self.batch_size < 1 or self.max_model_len < 256:
            raise ValueError("engine needs num_actors >= 1, batch_size >= 1, max_model_len >= 256")
        check_dtype(self.dtype)

    def compute_dtype(self) -> str:
        """``dtype`` resolved for this pool's actors (GPU actors: bf16 under ``auto``), here in
        the driver, so that what the engines run in is what a run's records say."""
        return compute_dtype(self.dtype, gpu=self.num_gpus_per_actor > 0)


Placement = tuple[PlacementGroup, int]  # a placement group and the first bundle to use


class ActorPoolConfig(Protocol):
    num_actors: int
    num_cpus_per_actor: float
    num_gpus_per_actor: float


def actor_bundles(pool: ActorPoolConfig) -> list[dict[str, float]]:
    """One placement-group bundle per actor of an engine or learner pool config."""
    gpus = {"GPU": pool.num_gpus_per_actor} if pool.num_gpus_per_actor else {}
    return [{"CPU": pool.num_cpus_per_actor, **gpus}] * pool.num_actors


def reserve(
    bundles: list[dict[str, float]], strategy: str, name: str, timeout_s: float | None = None
) -> PlacementGroup:
    """A placement group of ``bundles``, once the cluster has room for all of them; says
    what it is waiting for meanwhile (a sweep's points queue here for a busy cluster).
    ``timeout_s``: how long to wait before giving up (None: as long as it takes), so that a
    request no cluster state will meet fails instead of waiting forever."""
    if timeout_s is not None and not timeout_s > 0:  # NaN too
        raise ValueError(f"[{name}] reservation timeout {timeout_s} s: expected > 0, or None")
    pg = placement_group(bundles, strategy=strategy, name=name)
    t0 = time.time()
    try:
        while not ray.wait([pg.ready()], timeout=_wait_slice(timeout_s, t0))[0]:
            waited = time.time() - t0
            if timeout_s is not None and waited >= timeout_s:
                raise TimeoutError(
                    f"[{name}] the cluster had no room for {bundles} ({strategy}) in "
                    f"{waited:.0f} s (timeout {timeout_s} s; config: ray.reserve_timeout_s): "
                    f"available {ray.available_resources()}"
                )
            print(f"[{name}] waiting {waited:.0f} s for {bundles} ({strategy})", flush=True)
    except BaseException:  # a Ctrl-C too: a pending group would take the room when it comes
        remove_placement_group(pg)
        raise
    return pg


def _wait_slice(timeout_s: float | None, t0: float) -> float:
    """The next wait: 30 s between progress lines, no further than the deadline."""
    if timeout_s is None:
        return 30
    return max(0.0, min(30, timeout_s - (time.time() - t0)))


def in_bundle(placement: Placement | None, offset: int) -> PlacementGroupSchedulingStrategy | None:
    if placement is None:
        return None
    pg, first = placement
    return PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=first + offset
    )


def print_progress(label: str) -> Progress:
    def report(done: int, total: int, elapsed: float) -> None:
        rate = done / elapsed if elapsed > 0 else 0.0
        print(f"  {label}: {done}/{total} prompts ({rate:.2f}/s)", flush=True)

    return report


class EnginePool:
    """Engine actors fed batches of prompts through :func:`ctxpick.engines.dispatch.dispatch`.
    With ``start_actor``, a dead engine is replaced and only its batch redone (static weights:
    generators, judges, evaluated pickers); without it, a death is raised (rollout workers,
    whose weights only the trainer can restore)."""

    def __init__(
        self,
        actors: list[ray.actor.ActorHandle],
        start_actor: Callable[[], Any] | None = None,
        batch_size: int = 16,
    ) -> None:
        """``batch_size``: prompts per engine call when :meth:`generate` is not told."""
        if not actors:
            raise ValueError("EnginePool needs at least one actor")
        self.actors, self.start_actor, self.batch_size = actors, start_actor, batch_size

    @classmethod
    def start(
        cls,
        model: str,
        num_actors: int,
        *,
        num_cpus: float = 1,
        num_gpus: float = 0,
        wait: bool = True,
        replace_dead: bool = True,
        placement: Placement | None = None,
        batch_size: int = 16,
        **engine_kwargs: object,
    ) -> EnginePool:
        """Engine ``i`` goes to bundle ``first + i`` of a ``placement``; only pools outside a
        placement group replace their dead (Ray places the replacement)."""

        def start_actor(wait: bool = True, offset: int = 0) -> ray.actor.ActorHandle:
            return start_engine_actor(
                model,
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                wait=wait,
                scheduling_strategy=in_bundle(placement, offset),
                **engine_kwargs,
            )

        if placement is not None and replace_dead:
            raise ValueError("engines in a placement group are not replaced: replace_dead=False")
        actors = [start_actor(wait, i) for i in range(num_actors)]
        return cls(actors, start_actor if replace_dead else None, batch_size)

    @classmethod
    def from_config(
        cls,
        model: str,
        cfg: EngineConfig,
        seed: int = 0,
        wait: bool = True,
        replace_dead: bool = True,
        placement: Placement | None = None,
        **engine_kwargs: object,
    ) -> EnginePool:
        return cls.start(
            model,
            cfg.num_actors,
            num_cpus=cfg.num_cpus_per_actor,
            num_gpus=cfg.num_gpus_per_actor,
            wait=wait,
            replace_dead=replace_dead,
            placement=placement,
            max_model_len=cfg.max_model_len,
            cpu_kv_cache_gb=cfg.cpu_kv_cache_gb,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            seed=seed,
            **{"dtype": cfg.compute_dtype(), **engine_kwargs},  # a caller's wins (rollouts)
        )

    def ready(self) -> None:
        ray.get([a.ready.remote() for a in self.actors])

    def load_weights(self, weights: ray.ObjectRef, adapter: bool = False) -> float:
        """Every engine loads the same weights (an object ref: fetched once per node): whole
        weight buckets, or with ``adapter`` a :class:`~ctxpick.engines.base.LoraAdapter` for
        its base model; returns the slowest engine's seconds."""
        method = "load_adapter" if adapter else "load_weights"
        return max(ray.get([getattr(a, method).remote(weights) for a in self.actors]))

    def generate(
        self,
        chats: list[Chat],
        sampling: SamplingConfig,
        batch_size: int | None = None,
        progress: Progress | None = None,
    ) -> list[list[Completion]]:
        batch_size = batch_size or self.batch_size
        batches = [(i, chats[i : i + batch_size]) for i in range(0, len(chats), batch_size)]
        results: list[list[Completion] | None] = [None] * len(chats)
        t0, done = time.time(), 0

        def store(unit: tuple[int, list[Chat]], outs: list[list[Completion]]) -> None:
            nonlocal done
            start, batch = unit
            results[start : start + len(batch)] = outs
            done += len(batch)
            if progress:
                progress(done, len(chats), time.time() - t0)

        self.actors = dispatch(
            batches,
            self.actors,
            lambda actor, unit: actor.generate.remote(unit[1], sampling),
            store,
            replace=self.start_actor,
        )
        return results  # type: ignore[return-value]

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)


def use_loopback() -> None:
    """Keep a single-machine Ray cluster on 127.0.0.1. Ray otherwise rewrites loopback to the
    machine's "remotely reachable" address. It reads the switch when a process imports it:
    the environment covers the nodes and workers started later, and this process, which has
    imported Ray already, gets the constant itself. Call before ``ray.init`` or node start."""
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join ``address`` (a running cluster, or ``auto`` under ``ray job submit``) or start a
    local one bound to loopback."""
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address)
    else:
        use_loopback()
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
        )
