from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
SAMPLES = REPO / "ctxpick" / "data" / "samples"

# A small random decoder of the supported families (LlamaConfig / Qwen2Config keyword arguments)
# for fast tests of the learner's maths on real transformers models.
TINY_DECODER = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)

needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason="../shared/data is absent (a fresh clone); CI has it"
)


def pytest_report_header(config):
    # A suite run that fills the disk fails 25 minutes in with ENOSPC: say at once what it needs.
    free = shutil.disk_usage(tempfile.gettempdir()).free / (1 << 30)
    return (
        f"disk: {free:.1f} GiB free under {tempfile.gettempdir()}; the suite needs about 6.2 GiB "
        "more at its peak, in the main job's test (its three stages' full-weight checkpoints; "
        "measured on 2026-12-05 by benchmarks/resource_peaks.py, which also gives each test's)"
    )


@pytest.fixture(scope="session")
def ray_cluster():
    """One simulated two-node Ray cluster for the whole session, every service on loopback.
    CPUs are logical: the shared engine, a learner and a job's actors may coexist."""
    import ray
    from ray.cluster_utils import Cluster

    from ctxpick.engines.ray_pool import use_loopback

    use_loopback()  # tests only ever use 127.0.0.1
    # Logical CPUs, 12 in all on a 2-core machine: an actor runs as many threads as CPUs it
    # holds, so the shared engine and the main job's engines and learners take 2 (both cores:
    # they mostly take turns) and a test's actors still fit beside them.
    node = {"num_cpus": 6, "node_ip_address": "127.0.0.1", "object_store_memory": 300 << 20}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    cluster.add_node(**node)
    ray.init(address=cluster.address)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def engine_actor(ray_cluster):
    """One real vLLM engine (built-in SmolLM2) in a Ray actor, shared by a module's tests.
    Not by the session's: held to its end, its ~3.6 GB beside the training tests' actors
    pushed a 24-GiB machine past Ray's memory limit (CI on 84e4b55)."""
    import ray

    from ctxpick.engines.vllm_engine import start_engine_actor

    actor = start_engine_actor("smollm2-135m", num_cpus=2, max_model_len=4096, cpu_kv_cache_gb=2)
    yield actor
    ray.kill(actor)
