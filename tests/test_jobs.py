"""`ray job submit` end to end (slow): a real multi-process two-node Ray cluster on
127.0.0.1 (a head and a worker node), jobs submitted through the Jobs API with the repository
as working dir, a stage stopped mid-run (SIGTERM -> checkpoint -> exit) and resubmitted to
resume at the step it stopped, a mining job, and a sweep whose points train concurrently."""

import json
import os
import socket
import sys
import time

import pytest
from conftest import REPO, SAMPLES

pytestmark = pytest.mark.slow

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
# The cluster's `python`: these nodes run from this environment, which `make test` does not
# put on PATH (a real cluster's image does).
PYTHON = sys.executable


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def jobs():
    """A two-node cluster (head with the dashboard and job API, and a worker node: separate
    GCS, raylet and dashboard processes) on 127.0.0.1. Started with Ray's cluster utilities
    rather than two `ray start` calls: the CLI refuses a second node on loopback once Ray is
    kept off the machine's public address, and with that check on it rewrites 127.0.0.1."""
    from ray.cluster_utils import Cluster
    from ray.job_submission import JobSubmissionClient

    from ctxpick.engines.ray_pool import use_loopback

    use_loopback()
    saved = dict(os.environ)
    # Time for the step in flight and its checkpoint after `ray job stop` (default 3 s, then
    # SIGKILL); the cluster configs set it too.
    os.environ["RAY_JOB_STOP_WAIT_TIME_S"] = "600"
    node = {"num_cpus": 4, "node_ip_address": "127.0.0.1", "object_store_memory": 300 << 20}
    # Two nodes on one machine share a session folder: each needs its own dashboard-agent port
    # (jobs run through the agent) and its own runtime-env folder (each node's agent deletes
    # working dirs it does not know, such as the other node's job's).
    head = {**node, "include_dashboard": True, "dashboard_host": "127.0.0.1"}
    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={
            **head,
            "dashboard_agent_listen_port": _free_port(),
            "runtime_env_dir_name": "runtime_resources_head",
        },
    )
    cluster.add_node(
        **node,
        dashboard_agent_listen_port=_free_port(),
        runtime_env_dir_name="runtime_resources_worker",
    )
    cluster.wait_for_nodes()
    client = JobSubmissionClient(f"http://{cluster.head_node.address_info['webui_url']}")
    yield client
    cluster.shutdown()
    os.environ.clear()
    os.environ.update(saved)


def _submit(client, script, *overrides):
    """Submit as `ray job submit --working-dir . -- python jobs/<script>.py ...` does. The job
    agents register a few seconds after the dashboard answers: retry until one does."""
    for _ in range(60):
        try:
            return client.submit_job(
                entrypoint=" ".join([PYTHON, f"jobs/{script}.py", "ray.address=auto", *overrides]),
                runtime_env={
                    "working_dir": str(REPO),
                    "excludes": ["outputs", "tests", "benchmarks"],
                },
            )
        except RuntimeError as err:
            if "No available agent" not in str(err):
                raise
            time.sleep(2)
    raise TimeoutError("no job agent registered in 120 s")


def _wait(client, job, until=None, timeout=900):
    """Poll the job; return its status once terminal, or once ``until`` is in its logs."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        status = str(client.get_job_status(job)).split(".")[-1]
        if status in TERMINAL or (until and until in client.get_job_logs(job)):
            return status
        time.sleep(2)
    raise TimeoutError(f"job {job}: {client.get_job_logs(job)[-3000:]}")


@pytest.fixture(scope="module")
def mined(tmp_path_factory):
    from ctxpick.data.loaders import load_examples
    from ctxpick.mining.human_gold import human_gold_records
    from ctxpick.retrieval.chunking import Chunker, ChunkingConfig
    from ctxpick.retrieval.pools import PoolBuilder, PoolConfig

    root = tmp_path_factory.mktemp("jobs")
    examples = load_examples(SAMPLES / "hotpotqa_distractor_30.jsonl", "hotpotqa").examples[:6]
    chunked = Chunker(ChunkingConfig(method="window", window_words=40)).chunk_all(examples)
    pools = [PoolBuilder(PoolConfig(k=4)).build(c) for c in chunked]
    path = root / "mined.jsonl"
    records = human_gold_records(pools, ["train"] * 4 + ["val"] * 2)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _stage(out, mined, steps, stage="warmup"):
    return [
        f"stage={stage}", f"stage.max_steps={steps}", "rl.save_every=100", f"rl.mined={mined}",
        f"output_dir={out}", "picker.model=smollm2-135m", "picker.max_passages=4",
        "picker.max_passage_words=25", "picker.max_tokens=40", "rl.prompts_per_step=2",
        "rl.rollout.max_model_len=2048", "rl.rollout.cpu_kv_cache_gb=1", "rl.val_every=100",
        "rl.val_size=2", "wandb.mode=disabled",
    ]  # fmt: skip


def test_stopped_stage_checkpoints_and_a_resubmission_resumes(jobs, mined, tmp_path):
    out = tmp_path / "stage"
    # A warm start runs the learner alone: both cores for it.
    cores = "rl.learner.num_cpus_per_actor=2"
    job = _submit(jobs, "train", *_stage(out, mined, 40), cores)
    status = _wait(jobs, job, until="[warmup] step 2 ")
    assert status not in TERMINAL, jobs.get_job_logs(job)[-3000:]
    jobs.stop_job(job)
    assert _wait(jobs, job) == "STOPPED"
    logs = jobs.get_job_logs(job)
    assert "SIGTERM: checkpoint at step" in logs, logs[-3000:]
    stopped_at = int(logs.split("SIGTERM: checkpoint at step ")[1].split(",")[0])
    assert stopped_at >= 2 and (out / "checkpoints" / "latest").exists()
    assert not (out / "final").exists()

    again = _submit(jobs, "train", *_stage(out, mined, stopped_at + 1), cores)
    assert _wait(jobs, again) == "SUCCEEDED", jobs.get_job_logs(again)[-3000:]
    logs = jobs.get_job_logs(again)
    assert f"at step {stopped_at}" in logs and f"step {stopped_at + 1} " in logs
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, stopped_at + 2))  # every step once, none lost or doubled
    assert json.loads((out / "result.json").read_text())["step"] == stopped_at + 1
    assert (out / "final" / "picker.json").exists()


def test_mining_job_succeeds_on_the_cluster(jobs, tmp_path):
    out = tmp_path / "mine"
    job = _submit(
        jobs, "mine", f"data.path={SAMPLES / 'hotpotqa_distractor_30.jsonl'}",
        "data.format=hotpotqa", "data.limit=3", "model.name=smollm2-135m", "mining.rewrites.k=0",
        "mining.pool.k=4", "model.engine.max_model_len=2048", "model.engine.cpu_kv_cache_gb=1",
        f"output_dir={out}", "wandb.mode=disabled",
    )  # fmt: skip
    assert _wait(jobs, job) == "SUCCEEDED", jobs.get_job_logs(job)[-3000:]
    assert "mined 3/3" in jobs.get_job_logs(job)  # progress streams into the job's logs
    done = [json.loads(line)["id"] for line in (out / "mined.jsonl").read_text().splitlines()]
    rejected = (out / "mining_rejects.jsonl").read_text().splitlines()
    assert len(set(done)) == len(done) and len(done) + len(rejected) == 3


def test_a_sweep_trains_its_points_concurrently_each_in_its_own_placement_group(
    jobs, mined, tmp_path
):
    """`jobs/sweep.py` over two redundancy margins: both Stage II points hold their own
    placement group (a rollout worker and a learner bundle, from config) at the same time,
    each is a W&B run in the sweep's group with its overrides, and sweep.md compares them.
    LoRA learners: a full-weight one in float32 (a CPU without bf16 instructions) held 4.5 GB,
    and beside the points' engines and the suite's shared one a 23-GB node ran out of memory
    (2026-12-07)."""
    from ray.util.state import list_placement_groups

    sweep = tmp_path / "sweep"
    job = _submit(
        jobs, "sweep", *_stage(tmp_path / "unused", mined, 1, stage="stage2"),
        "stage.init_from=null", "stage.group_size=4", "stage.redundancy_margin=0,1",
        "rl.learner.lora_rank=4",
        f"hydra.sweep.dir={sweep}", "wandb.mode=offline",
    )  # fmt: skip
    most_at_once, groups = 0, {}
    while str(jobs.get_job_status(job)).split(".")[-1] not in TERMINAL:
        live = [
            pg
            for pg in list_placement_groups(jobs.get_address(), detail=True)
            if pg.name.startswith("ctxpick-stage2-") and pg.state == "CREATED"
        ]
        groups |= {pg.name: len(pg.bundles) for pg in live}
        most_at_once = max(most_at_once, len(live))
        time.sleep(1)
    logs = jobs.get_job_logs(job)
    assert str(jobs.get_job_status(job)).endswith("SUCCEEDED"), logs[-3000:]
    assert most_at_once == 2 and len(groups) == 2, (groups, logs[-3000:])
    assert set(groups.values()) == {2}  # rollout worker + learner, as configured
    assert "Launching 2 jobs on Ray" in logs
    points = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in points] == ["0", "1"]
    for point, margin in zip(points, (0, 1), strict=True):
        assert json.loads((point / "result.json").read_text())["step"] == 1
        assert (point / "final" / "picker.json").exists()
        [record] = (point / "wandb").glob("offline-run-*/run-*.wandb")
        config = record.read_bytes()  # the run's config, as JSON values
        assert f'"group":"{sweep.name}"'.encode() in config
        assert f'"stage.redundancy_margin={margin}"'.encode() in config
    rows = (sweep / "sweep.md").read_text().splitlines()[2:]
    assert [row.split("|")[2].strip() for row in rows] == [
        "stage.redundancy_margin=0",
        "stage.redundancy_margin=1",
    ]  # the overrides the points share are left out
