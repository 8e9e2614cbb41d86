"""Every launch config and manifest in cluster/ parses, has the fields its tool requires, keeps
the dashboard off public interfaces, launches entrypoints that exist with overrides ctxpick
accepts, and asks for no more GPUs and CPUs per actor than the pods it runs on provide."""

import shlex
from pathlib import Path

import pytest
import yaml

from ctxpick.config import compose

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "cluster"
SERVE = CLUSTER / "serve.yaml"
RAY_UP = sorted(p for p in CLUSTER.glob("*.yaml") if p != SERVE)
KUBERAY = sorted((CLUSTER / "kuberay").glob("*.yaml"))
IMAGE_TAG = "ghcr.io/YOUR_ORG/ctxpick:latest"


def _load(path):
    return yaml.safe_load(path.read_text())


def test_every_config_is_covered():
    assert {p.name for p in RAY_UP} == {"onprem.yaml", "aws-gpu.yaml"}
    kinds = sorted(_load(p)["kind"] for p in KUBERAY)
    assert kinds == ["PersistentVolumeClaim", "RayCluster", *["RayJob"] * 4]
    assert (CLUSTER / "Dockerfile").is_file()


@pytest.mark.parametrize("path", RAY_UP, ids=lambda p: p.name)
def test_ray_up_config(path):
    cfg = _load(path)
    for key in ("cluster_name", "provider", "auth", "head_start_ray_commands"):
        assert key in cfg, f"{path.name}: {key} missing"
    assert cfg["provider"]["type"] in ("local", "aws")
    for commands in (cfg["head_start_ray_commands"], cfg["worker_start_ray_commands"]):
        starts = [c for c in commands if " start " in c]
        stops = [c for c in commands if c.strip().endswith("ray stop")]
        assert len(starts) == len(stops) == 1, commands
        # the stop command is the same ray binary as the start command
        start_bin = next(w for w in shlex.split(starts[0].split(";")[-1]) if w.endswith("ray"))
        assert stops[0].split()[0] == start_bin
    head = next(c for c in cfg["head_start_ray_commands"] if "--head" in c)
    assert "--dashboard-host=127.0.0.1" in head  # reached through an SSH tunnel, not the LAN
    assert "RAY_JOB_STOP_WAIT_TIME_S=" in head  # `ray job stop` leaves time for a checkpoint
    if cfg["provider"]["type"] == "aws":
        types = cfg["available_node_types"]
        assert cfg["head_node_type"] in types
        assert any(t["resources"].get("GPU", 0) >= 1 for t in types.values())
        assert cfg["docker"]["image"] == IMAGE_TAG


def _pods(spec):
    """(role, container, pod volumes, replicas) of a RayCluster spec."""
    head = spec["headGroupSpec"]["template"]["spec"]
    yield "head", head["containers"][0], head.get("volumes", []), 1
    for group in spec["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        yield "worker", pod["containers"][0], pod.get("volumes", []), group["replicas"]


def _cluster_spec(doc):
    return doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterSpec"]


@pytest.mark.parametrize("path", [p for p in KUBERAY if p.name != "pvc.yaml"], ids=lambda p: p.name)
def test_kuberay_manifest(path):
    doc = _load(path)
    assert doc["apiVersion"] == "ray.io/v1" and doc["metadata"]["name"]
    spec = _cluster_spec(doc)
    assert spec["headGroupSpec"]["serviceType"] == "ClusterIP"  # never a public LoadBalancer
    claims = {_load(CLUSTER / "kuberay" / "pvc.yaml")["metadata"]["name"]}
    gpus = 0
    head_env = {
        e["name"] for e in spec["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert "RAY_JOB_STOP_WAIT_TIME_S" in head_env  # `ray job stop` leaves time for a checkpoint
    for role, container, volumes, replicas in _pods(spec):
        assert container["image"] == IMAGE_TAG
        res = container["resources"]
        assert res["requests"] == res["limits"], f"{role}: requests and limits differ"
        gpus += replicas * int(res["limits"].get("nvidia.com/gpu", 0))
        assert {
            v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v
        } <= claims
        assert any(m["mountPath"] == "/shared" for m in container["volumeMounts"])
    assert gpus >= 1
    if doc["kind"] == "RayJob":
        _check_entrypoint(doc["spec"]["entrypoint"], spec, gpus)


def _points(overrides):
    """The override lists of a sweep's points (one list for a single job); Hydra's own parser
    and sweeper expand the sweeps."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    [points] = BasicSweeper.split_arguments(parsed, None)
    return points


def _check_entrypoint(entrypoint, spec, gpus):
    """The job script exists, ctxpick accepts its overrides (every point of a sweep), and its
    actors fit the pods."""
    words = shlex.split(entrypoint)
    assert words[0] == "python" and (REPO / words[1]).is_file(), entrypoint
    command = Path(words[1]).stem
    hydra = dict(w.split("=", 1) for w in words[2:] if w.startswith("hydra."))
    points = _points([w for w in words[2:] if not w.startswith("hydra.")])
    assert (len(points) > 1) == (command == "sweep"), entrypoint
    if command == "sweep":  # each point's folder is under the sweep folder, on the volume
        assert hydra["hydra.sweep.dir"].startswith("/shared/")
    for point in points:
        _check_point(compose(point), "train" if command == "sweep" else command, spec, gpus)


def _check_point(cfg, command, spec, gpus):
    assert cfg.ray.address == "auto"
    assert cfg.output_dir.startswith("/shared/"), "outputs must land on the shared volume"
    worker = spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]
    pod_gpus, pod_cpus = int(worker["limits"]["nvidia.com/gpu"]), float(worker["limits"]["cpu"])
    pools = {
        "mine": [cfg.model.engine],
        "eval": [cfg.model.engine, cfg.rl.rollout],  # one after the other
        "train": [cfg.rl.rollout, cfg.rl.learner],  # at the same time
    }[command]
    for pool in pools:
        assert pool.num_gpus_per_actor <= pod_gpus and pool.num_cpus_per_actor <= pod_cpus
    demand = [p.num_actors * p.num_gpus_per_actor for p in pools]
    assert (sum(demand) if command == "train" else max(demand)) <= gpus, (command, demand, gpus)
    assert all(d >= 1 for d in demand), f"{command}: an actor pool uses no GPU on a GPU cluster"


def test_serve_config_deploys_the_app_with_overrides_ctxpick_accepts():
    """What `serve deploy cluster/serve.yaml` reads: Ray Serve's own schema, an import path
    that resolves to the app builder, overrides that compose, proxies on every node."""
    from ray.serve.schema import ServeDeploySchema

    from ctxpick.serve.app import app_builder

    cfg = ServeDeploySchema.model_validate(_load(SERVE))
    [app] = cfg.applications
    module, name = app.import_path.split(":")
    assert getattr(__import__(module, fromlist=[name]), name) is app_builder
    serve = compose(app.args["overrides"]).serve
    assert serve.max_replicas >= serve.min_replicas >= 1 and serve.num_gpus_per_replica == 1
    assert cfg.http_options.host == "0.0.0.0" and serve.api_key_env  # remote: token required
