"""``ctxpick serve``: a trained picker as a Ray Serve application.

Two deployments: ``PickerEngine`` replicas (:mod:`ctxpick.serve.replica`) each hold one
picker and batch concurrent requests into one engine call; the ``Api`` ingress
(:mod:`ctxpick.serve.ingress`) checks limits (:mod:`ctxpick.serve.limits`) and the bearer
token, calls an engine replica, and writes the audit trail and the metrics
(:mod:`ctxpick.serve.audit`). Bodies are in :mod:`ctxpick.serve.schemas`. This module wires
them into the application.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ray import serve

from ctxpick.engines.ray_pool import init_ray
from ctxpick.picker.inference import load_spec
from ctxpick.serve.ingress import Service, app, install_service
from ctxpick.serve.replica import PickerEngine
from ctxpick.serve.settings import ServeConfig

APP_NAME = "ctxpick"
# The schema clients build against, checked in (``ctxpick openapi --write`` refreshes it).
OPENAPI_FILE = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
__all__ = ["APP_NAME", "OPENAPI_FILE", "app", "app_builder", "build_app", "start"]


@serve.deployment(name="Api", max_ongoing_requests=1024)
@serve.ingress(app)
class Api:
    def __init__(self, engine: Any, cfg: ServeConfig) -> None:
        # Through a module function: Serve ships this class by value, with its own globals.
        install_service(Service(cfg, engine))


def build_app(cfg: ServeConfig) -> Any:
    """The application: ``Api`` over ``PickerEngine`` replicas, as ``cfg`` scales them."""
    scaling: dict[str, Any] = {"num_replicas": cfg.num_replicas}
    if cfg.max_replicas:
        scaling = {
            "autoscaling_config": {
                "min_replicas": cfg.min_replicas,
                "max_replicas": cfg.max_replicas,
                "target_ongoing_requests": cfg.target_ongoing_requests,
            }
        }
    engine = PickerEngine.options(
        **scaling,
        max_ongoing_requests=cfg.max_ongoing_requests,
        max_queued_requests=cfg.limits.max_queued_requests,
        # the replica only batches; its engine actor asks for the CPUs and GPUs
        ray_actor_options={"num_cpus": 0},
    ).bind(cfg)
    # The bearer token travels to the ingress replicas from the driver's environment when set
    # there; on a cluster, set it on the nodes instead (runtime_env shows in the dashboard).
    key_env = (
        {cfg.api_key_env: os.environ[cfg.api_key_env]} if os.environ.get(cfg.api_key_env) else {}
    )
    api_options = {"num_cpus": 0, "runtime_env": {"env_vars": key_env}}
    return Api.options(ray_actor_options=api_options).bind(engine, cfg)


def app_builder(args: dict[str, Any]) -> Any:
    """``import_path`` for ``serve run`` / ``serve deploy`` (cluster/serve.yaml): ``args``
    holds ``overrides``, Hydra ``serve.*`` overrides over conf/."""
    from ctxpick.config import compose

    return build_app(compose(list(args.get("overrides", []))).serve)


def start(cfg: ServeConfig, *, ray_address: str | None = None, blocking: bool = True) -> str:
    """Start Ray Serve on ``cfg.host:cfg.port`` (proxy on the head node) and deploy; returns
    the base URL. ``blocking``: serve until interrupted."""
    init_ray(ray_address)
    serve.start(http_options={"host": cfg.host, "port": cfg.port}, proxy_location="HeadOnly")
    serve.run(build_app(cfg), name=APP_NAME, route_prefix="/")
    url = f"http://{cfg.host}:{cfg.port}"
    print(f"ctxpick serve: {cfg.picker} at {url} (POST /v1/pick, /v1/rerank; docs at /docs)")
    pool = load_spec(cfg.picker)[1].pool
    print(
        f"  it reads candidates ranked as it was trained: {pool} (GET /v1/models: expected_pool)"
        if pool
        else "  its picker.json records no training pool: send candidates in retriever order"
    )
    if blocking:
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            serve.shutdown()
    return url
