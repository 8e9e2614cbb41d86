"""Where a stage's actors go: one placement group holding the rollout engines and the learners.

An engine shares a learner's GPU only where the placement guarantees it: engine i and learner i
in one bundle, whose GPU fraction Ray takes from a single device. Bundles of their own carry no
such guarantee (two fractional bundles may land on one GPU or on two), so the GPU weight
transfer (:func:`ctxpick.rl.weight_sync.resolve_mode`) reads the layout chosen here.
"""

from __future__ import annotations

from ctxpick.engines.ray_pool import ActorPoolConfig, actor_bundles


def colocated(rollout: ActorPoolConfig, learner: ActorPoolConfig) -> bool:
    """Each engine can share a bundle, hence a GPU, with a learner: both hold GPU fractions
    that fit one GPU together, and there are no more engines than learners."""
    engine_gpus, learner_gpus = rollout.num_gpus_per_actor, learner.num_gpus_per_actor
    return (
        0 < engine_gpus
        and 0 < learner_gpus
        and engine_gpus + learner_gpus <= 1
        and rollout.num_actors <= learner.num_actors
    )


def stage_bundles(
    rollout: ActorPoolConfig, learner: ActorPoolConfig
) -> tuple[list[dict[str, float]], int]:
    """The stage's bundles and the learners' first one; engine i always goes to bundle i.
    Colocated, engine i and learner i share bundle i; otherwise the learners' bundles follow
    the engines'."""
    engines, learners = actor_bundles(rollout), actor_bundles(learner)
    if not colocated(rollout, learner):
        return engines + learners, len(engines)
    shared = [
        {k: e.get(k, 0.0) + lb.get(k, 0.0) for k in e.keys() | lb.keys()}
        for e, lb in zip(engines, learners, strict=False)
    ]
    return shared + learners[len(shared) :], 0
