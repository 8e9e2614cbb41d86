from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
SAMPLES = REPO / "ctxpick" / "data" / "samples"

needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason="../shared/data is absent (a fresh clone); CI has it"
)


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the whole session, bound to loopback."""
    import ray

    from ctxpick.engines.ray_pool import init_ray

    # Logical CPUs: the engine, a learner and the demo engine may coexist in one session.
    init_ray(num_cpus=4)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def engine_actor(ray_cluster):
    """One real vLLM engine (built-in SmolLM2) in a Ray actor, shared by every test."""
    from ctxpick.engines.vllm_engine import start_engine_actor

    actor = start_engine_actor("smollm2-135m", num_cpus=1, max_model_len=4096, cpu_kv_cache_gb=2)
    yield actor
    ray_cluster.kill(actor)
