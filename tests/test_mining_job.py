"""The mining job on a simulated two-node Ray cluster with the real vLLM engine and built-in
model over real examples: an engine actor killed mid-run, and a killed driver re-run."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import ray
from conftest import REPO

from ctxpick.config import compose
from ctxpick.data.loaders import load_sources
from ctxpick.jsonl import read_done
from ctxpick.mining.job import mine_pools
from ctxpick.mining.run import worker_spec
from ctxpick.retrieval.chunking import Chunker
from ctxpick.retrieval.pools import PoolBuilder

pytestmark = pytest.mark.slow

OVERRIDES = [
    "model=smollm2-135m",
    "judge=rules",
    "mining.pool.k=4",
    "mining.rewrites.k=0",
    "retrieval.chunking.method=none",
    "model.engine.num_cpus_per_actor=1",
    "model.engine.max_model_len=2048",
    "model.engine.cpu_kv_cache_gb=1",
    "model.engine.num_actors=2",
    "generator.max_tokens=12",
]


def _sources(n):
    return [f'data.sources=[{{path: "sample:hotpotqa_distractor_30.jsonl", limit: {n}}}]']


def _ids(path):
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def _wait_for_lines(path, n, timeout=600):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        time.sleep(0.5)
    raise TimeoutError(f"{path} never reached {n} lines")


def test_killed_engine_actor_is_replaced_and_nothing_lost_or_doubled(ray_cluster, tmp_path, capsys):
    cfg = compose(OVERRIDES + _sources(6) + [f"output_dir={tmp_path}"])
    examples = load_sources(cfg.data.sources, strict=True)
    pools = [
        PoolBuilder(cfg.mining.pool).build(c)
        for c in Chunker(cfg.retrieval.chunking).chunk_all(examples)
    ]
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2

    def kill_one_engine():
        _wait_for_lines(tmp_path / "mined.jsonl", 1)
        ray.kill(ray.get_actor("ctxpick-miner-1"))

    killer = threading.Thread(target=kill_one_engine, daemon=True)
    killer.start()
    records = mine_pools(pools, worker_spec(cfg), tmp_path, num_actors=2, num_cpus=1, num_gpus=0)
    killer.join()
    assert "actor died" in capsys.readouterr().out
    ids = _ids(tmp_path / "mined.jsonl")
    rejects = tmp_path / "mining_rejects.jsonl"
    ids += _ids(rejects) if rejects.exists() else []
    assert sorted(ids) == sorted(p.example_id for p in pools)  # each exactly once
    for rec in records.values():
        assert rec["stats"]["calls"] >= 1 and rec["split"] in ("train", "val", "test")
        if rec["kept"]:
            assert 1 <= len(rec["gold_minimal"]) <= 4
            assert set(rec["gold_minimal"]) <= {p["pid"] for p in rec["pool"]}


def test_interrupted_driver_resumes_without_duplicates(ray_cluster, tmp_path):
    args = (
        OVERRIDES + _sources(4) + [f"output_dir={tmp_path}", f"ray.address={ray_cluster.address}"]
    )
    cmd = [sys.executable, "-m", "ctxpick.cli", "mine", *args]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        _wait_for_lines(tmp_path / "mined.jsonl", 1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    first = _ids(tmp_path / "mined.jsonl")
    assert 1 <= len(first) < 4
    with (tmp_path / "mined.jsonl").open("a") as fh:
        fh.write('{"id": "torn-by-the-kill", "da')  # a write cut off mid-line
    rerun = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"{len(first)} examples already mined, {4 - len(first)} to go" in rerun.stdout
    ids = _ids(tmp_path / "mined.jsonl")
    assert len(ids) == len(set(ids)) == 4 and ids[: len(first)] == first
    assert set(read_done(tmp_path / "mined.jsonl")) == set(ids)
    assert "precision vs human" in (tmp_path / "summary.md").read_text()


def test_an_unreachable_judge_is_retried_before_a_final_reject(ray_cluster, tmp_path, capsys):
    """A generator behind HTTP that never answers (a closed port on 127.0.0.1): each example is
    a transient failure, redone up to the dispatcher's limit, then rejected saying so; a re-run
    skips the final rejects."""
    cfg = compose(
        ["model.backend=http", "model.http.base_url=http://127.0.0.1:9/v1",
         "model.http.max_retries=0", "judge=rules", "mining.pool.k=4", "mining.rewrites.k=0",
         "retrieval.chunking.method=none", *_sources(2), f"output_dir={tmp_path}"]
    )  # fmt: skip
    examples = load_sources(cfg.data.sources, strict=True)
    pools = [
        PoolBuilder(cfg.mining.pool).build(c)
        for c in Chunker(cfg.retrieval.chunking).chunk_all(examples)
    ]
    mine_pools(pools, worker_spec(cfg), tmp_path, num_actors=1, num_cpus=0, num_gpus=0)
    assert not (tmp_path / "mined.jsonl").read_text()
    rejects = read_done(tmp_path / "mining_rejects.jsonl")
    assert sorted(rejects) == sorted(p.example_id for p in pools)
    for rec in rejects.values():
        assert "gave up after 3 attempts (last: a transient failure)" in rec["error"]
        assert "HTTPEngineUnavailable" in rec["error"]  # and what the failure was
    capsys.readouterr()
    mine_pools(pools, worker_spec(cfg), tmp_path, num_actors=1, num_cpus=0, num_gpus=0)
    assert "0 to go" in capsys.readouterr().out
