"""``ctxpick serve``: a trained picker as a Ray Serve application.

Two deployments: ``PickerEngine`` replicas each hold one vLLM engine and batch concurrent
requests into one engine call (:class:`Batcher`); the ``Api`` ingress (FastAPI) checks
limits and the bearer token, calls an engine replica, writes the audit trail and the
Prometheus metrics. Routes are module functions over one per-process :class:`Service`, so
the OpenAPI schema is built without Ray (``ctxpick openapi``; checked in as
``docs/openapi.json``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import time
import uuid
from concurrent.futures import Executor, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import prometheus_client as prom
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from starlette.exceptions import HTTPException

from ctxpick.engines.ray_pool import EnginePool, init_ray
from ctxpick.picker.inference import (
    Picker,
    Selection,
    as_passages,
    caller_id,
    passage_tokens,
    resolve_picker,
    token_counter,
)
from ctxpick.picker.spec import PickerSpec
from ctxpick.serve.settings import ServeConfig

APP_NAME = "ctxpick"
# The schema clients build against, checked in (``ctxpick openapi --write`` refreshes it).
OPENAPI_FILE = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"

# ---------------------------------------------------------------- request / response shapes


class PassageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str | int | None = None
    text: str
    title: str | None = None


class PickRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1)
    passages: list[str | PassageIn] = Field(min_length=1, description="retriever order")
    token_budget: int | None = Field(None, ge=1, description="cap on the kept passages' tokens")


class PickResponse(BaseModel):
    id: str = Field(description="request id (also the X-Request-Id header)")
    model: str
    ids: list[str | int] = Field(description="kept ids (a plain string's 0-based position)")
    indices: list[int] = Field(description="kept 0-based positions, retriever order")
    passages: list[str | PassageIn]
    rationale: str
    tokens_in: int
    tokens_kept: int
    valid: bool = Field(description="the picker's output parsed")
    fallback: str | None = Field(description="why the fallback policy chose (null: the picker)")
    budget_cut: bool
    latency_ms: float


class RerankDocument(BaseModel):
    text: str


class RerankRequest(BaseModel):
    """The Cohere / vLLM rerank request."""

    model: str | None = Field(None, description="accepted and ignored: one model is served")
    query: str = Field(min_length=1)
    documents: list[str | RerankDocument] = Field(min_length=1)
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = True


class RerankResult(BaseModel):
    index: int
    relevance_score: float = Field(description="> 0.5: picked; order: picked, then the rest")
    document: RerankDocument | None = None


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage


class ErrorBody(BaseModel):
    type: str
    message: str
    limit: str | None = Field(None, description="the config key of the limit hit")


class ErrorResponse(BaseModel):
    error: ErrorBody


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    owned_by: str = "ctxpick"
    prompt_version: str
    output_format: str
    max_passages_shown: int


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: str
    model: str


# ---------------------------------------------------------------- metrics and audit

REGISTRY = prom.CollectorRegistry()
REQUESTS = prom.Counter(
    "ctxpick_requests", "Requests by endpoint and status", ["endpoint", "status"], registry=REGISTRY
)
LATENCY = prom.Histogram(
    "ctxpick_request_latency_seconds", "End-to-end latency", ["endpoint"], registry=REGISTRY
)
BATCH = prom.Histogram(
    "ctxpick_batch_size",
    "Questions in the engine call a request was part of",
    buckets=(1, 2, 4, 8, 16, 32, 64),
    registry=REGISTRY,
)
FALLBACKS = prom.Counter("ctxpick_fallbacks", "Decisions made by the fallback", registry=REGISTRY)
TOKENS_IN = prom.Counter("ctxpick_tokens_in", "Candidate tokens received", registry=REGISTRY)
TOKENS_SAVED = prom.Counter(
    "ctxpick_tokens_saved", "Candidate tokens not passed on", registry=REGISTRY
)


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, limit: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.limit = status, kind, message, limit


class AuditLog:
    """One JSON line per decision, appended with one write (whole lines under concurrency)."""

    def __init__(self, path: str, store_text: bool) -> None:
        self.path, self.store_text = (Path(path) if path else None), store_text
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any], question: str) -> None:
        if not self.path:
            return
        if self.store_text:
            record = record | {"question": question}
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------- the service


class Service:
    """One ingress replica's state: settings, the engine handle, the audit log."""

    def __init__(self, cfg: ServeConfig, engine: Any) -> None:
        self.cfg, self.engine = cfg, engine
        folder, spec = resolve_picker(cfg.picker)
        self.spec = spec or PickerSpec.load(folder)
        self.model = cfg.picker
        self.version = self.spec.version
        self.count_tokens = token_counter(folder)
        self.audit = AuditLog(cfg.audit.path, cfg.audit.store_text)
        self.api_key = ""
        if cfg.api_key_env:
            self.api_key = os.environ.get(cfg.api_key_env, "")
            if not self.api_key:
                raise RuntimeError(
                    f"serve.api_key_env={cfg.api_key_env}: that environment variable is unset "
                    "or empty on the serving node"
                )

    def check_limits(self, question: str, candidates: list[Any]) -> list[int]:
        """Refuse a request past a limit; else each candidate's tokens."""
        lim = self.cfg.limits
        if len(candidates) > lim.max_passages:
            raise ApiError(
                413,
                "too_many_passages",
                f"{len(candidates)} passages exceed {lim.max_passages}",
                "serve.limits.max_passages",
            )
        passages = as_passages(candidates)
        size = len(question.encode()) + sum(len(p.text.encode()) for p in passages)
        if size > lim.max_request_bytes:
            raise ApiError(
                413,
                "request_too_large",
                f"{size} bytes of text exceed {lim.max_request_bytes}",
                "serve.limits.max_request_bytes",
            )
        sizes = passage_tokens(self.count_tokens, passages)
        if (tokens := sum(sizes)) > lim.max_tokens_in:
            raise ApiError(
                413,
                "too_many_tokens",
                f"{tokens} passage tokens exceed {lim.max_tokens_in}",
                "serve.limits.max_tokens_in",
            )
        return sizes

    async def select(
        self, endpoint: str, rid: str, question: str, candidates: list[Any], budget: int | None
    ) -> Selection:
        """Check, pick on an engine replica (a replica that dies mid-call is retried on
        another), audit and count one request."""
        from ray.exceptions import RayActorError
        from ray.serve.exceptions import BackPressureError
        from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_fixed

        t0 = time.perf_counter()
        sizes = self.check_limits(question, candidates)
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(RayActorError),
                stop=stop_after_attempt(3),
                wait=wait_fixed(0.5),
                reraise=True,
            ):
                with attempt:
                    sel = await self.engine.pick.remote((question, candidates, budget, sizes))
        except BackPressureError:
            raise ApiError(
                429,
                "overloaded",
                "the request queue is full; retry later",
                "serve.limits.max_queued_requests",
            ) from None
        latency = time.perf_counter() - t0
        BATCH.observe(sel.batch_size)
        TOKENS_IN.inc(sel.tokens_in)
        TOKENS_SAVED.inc(sel.tokens_in - sel.tokens_kept)
        FALLBACKS.inc(sel.fallback is not None)
        record = {
            "request_id": rid,
            "time": datetime.now(UTC).isoformat(),
            "endpoint": endpoint,
            "model": self.model,
            "prompt_version": self.version,
            "candidate_ids": [caller_id(c, i) for i, c in enumerate(candidates)],
            "picked_ids": sel.ids,
            "rationale": sel.rationale,
            "tokens_in": sel.tokens_in,
            "tokens_kept": sel.tokens_kept,
            "latency_ms": round(latency * 1000, 2),
            "batch_size": sel.batch_size,
            "fallback": sel.fallback,
            "budget_cut": sel.budget_cut,
        }
        self.audit.write(record, question)
        return sel


_SERVICE: Service | None = None


def install_service(svc: Service) -> None:
    """The routes of this process answer with ``svc``."""
    global _SERVICE
    _SERVICE = svc


def service() -> Service:
    if _SERVICE is None:
        raise ApiError(503, "starting", "the service is still starting")
    return _SERVICE


def authorized(request: Request, svc: Service = Depends(service)) -> Service:
    if svc.api_key:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {svc.api_key}".encode()):
            raise ApiError(401, "unauthorized", "missing or wrong bearer token")
    return svc


def _request_id(request: Request) -> str:
    # Serve's proxy sets it (from the client's x-request-id if sent) and returns it as a header
    return request.headers.get("x-request-id") or uuid.uuid4().hex


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 413, 422, 429, 503)
}
app = FastAPI(
    title="ctxpick",
    version="0.1.0",
    description="A context picker between a retriever and a generator: it keeps a minimal "
    "sufficient subset of the retrieved passages.",
)


@app.exception_handler(ApiError)
async def _api_error(request: Request, err: ApiError) -> JSONResponse:
    REQUESTS.labels(request.url.path, str(err.status)).inc()
    body = ErrorResponse(error=ErrorBody(type=err.kind, message=err.message, limit=err.limit))
    return JSONResponse(body.model_dump(), status_code=err.status)


@app.exception_handler(RequestValidationError)
async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
    if any(e["type"] == "json_invalid" for e in err.errors()):
        return await _api_error(request, ApiError(400, "invalid_json", "the body is not JSON"))
    problems = "; ".join(
        f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in err.errors()[:5]
    )
    return await _api_error(request, ApiError(422, "invalid_request", problems))


@app.exception_handler(HTTPException)
async def _http_error(request: Request, err: HTTPException) -> JSONResponse:
    # FastAPI's own refusals (a body that is not UTF-8 or not JSON, an unknown route)
    return await _api_error(request, ApiError(err.status_code, "invalid_request", str(err.detail)))


@app.middleware("http")
async def _body_size(request: Request, call_next: Any) -> Response:
    """Refuse an oversize body before it is parsed."""
    declared = request.headers.get("content-length")
    if _SERVICE is not None and declared and declared.isdigit():
        limit = _SERVICE.cfg.limits.max_request_bytes
        if int(declared) > limit:
            return await _api_error(
                request,
                ApiError(
                    413,
                    "request_too_large",
                    f"a body of {declared} bytes exceeds {limit}",
                    "serve.limits.max_request_bytes",
                ),
            )
    return await call_next(request)


@app.post("/v1/pick", response_model=PickResponse, responses=ERRORS)
async def pick(req: PickRequest, request: Request, svc: Service = Depends(authorized)) -> Any:
    """The minimal sufficient subset of ``passages`` for ``question``."""
    rid, t0 = _request_id(request), time.perf_counter()
    candidates = [p if isinstance(p, str) else p.model_dump() for p in req.passages]
    sel = await svc.select("pick", rid, req.question, candidates, req.token_budget)
    LATENCY.labels("pick").observe(time.perf_counter() - t0)
    REQUESTS.labels(request.url.path, "200").inc()
    out = sel.to_dict() | {"id": rid, "model": svc.model}
    # Serve's proxy puts the same id in the x-request-id response header
    return JSONResponse(PickResponse.model_validate(out).model_dump())


@app.post("/v1/rerank", response_model=RerankResponse, responses=ERRORS)
async def rerank(req: RerankRequest, request: Request, svc: Service = Depends(authorized)) -> Any:
    """A reranker's contract: picked passages first (retriever order), then the rest."""
    rid, t0 = _request_id(request), time.perf_counter()
    texts = [d if isinstance(d, str) else d.text for d in req.documents]
    sel = await svc.select("rerank", rid, req.query, texts, None)
    picked = set(sel.indices)
    order = sel.indices + [i for i in range(len(texts)) if i not in picked]
    n = len(texts)
    results = [
        RerankResult(
            index=i,
            # picked in (0.5, 1], the rest in (0, 0.5]: both fall with retriever rank
            relevance_score=(1.0 if i in picked else 0.5) - rank / (2 * n) * 0.999,
            document=RerankDocument(text=texts[i]) if req.return_documents else None,
        )
        for rank, i in enumerate(order)
    ][: req.top_n]
    LATENCY.labels("rerank").observe(time.perf_counter() - t0)
    REQUESTS.labels(request.url.path, "200").inc()
    body = RerankResponse(
        id=rid, model=svc.model, results=results, usage=RerankUsage(total_tokens=sel.tokens_in)
    )
    return JSONResponse(body.model_dump(exclude_none=True))


@app.get("/v1/models", response_model=ModelList, responses=ERRORS)
async def models(svc: Service = Depends(authorized)) -> ModelList:
    card = ModelCard(
        id=svc.model,
        prompt_version=svc.version,
        output_format=svc.spec.output_format,
        max_passages_shown=svc.spec.max_passages,
    )
    return ModelList(data=[card])


@app.get("/health", response_model=Health, responses={503: {"model": ErrorResponse}})
async def health(svc: Service = Depends(service)) -> Health:
    try:
        await asyncio.wait_for(svc.engine.ready.remote(), timeout=10)
    except Exception as err:
        raise ApiError(503, "unhealthy", f"no engine replica answered: {err}") from None
    return Health(status="ok", model=svc.model)


@app.get("/metrics", response_class=Response)
async def metrics() -> Response:
    """Prometheus text format."""
    return Response(prom.generate_latest(REGISTRY), media_type=prom.CONTENT_TYPE_LATEST)


# ---------------------------------------------------------------- deployments


class Batcher:
    """Requests queued while the engine is busy go into its next call, up to
    ``max_batch_size``; an idle engine waits ``wait_s`` for company.

    Kept instead of ``serve.batch``: that forms each batch when its requests arrive, so under
    load many small batches queue behind the running one (measured by
    benchmarks/bench_serve.py: a mean batch of 4 at concurrency 32). Here a batch is formed
    when the engine is free to take it.
    """

    def __init__(
        self, fn: Any, max_batch_size: int, wait_s: float, executor: Executor | None = None
    ) -> None:
        self.fn, self.max_batch_size, self.wait_s = fn, max_batch_size, wait_s
        self.executor = executor
        self.queue: asyncio.Queue = asyncio.Queue()
        self.worker: asyncio.Task | None = None

    async def submit(self, job: Any) -> Any:
        if self.worker is None or self.worker.done():
            self.worker = asyncio.get_running_loop().create_task(self._serve())
        done = asyncio.get_running_loop().create_future()
        await self.queue.put((job, done))
        return await done

    async def _next_batch(self) -> list[tuple[Any, asyncio.Future]]:
        batch = [await self.queue.get()]
        deadline = asyncio.get_running_loop().time() + self.wait_s
        while len(batch) < self.max_batch_size:
            if not self.queue.empty():
                batch.append(self.queue.get_nowait())
                continue
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self.queue.get(), left))
            except TimeoutError:
                break
        return batch

    async def _serve(self) -> None:
        while True:
            batch = await self._next_batch()
            try:
                # the engine call blocks: off the event loop, so requests keep queueing
                jobs = [job for job, _ in batch]
                loop = asyncio.get_running_loop()
                results = await loop.run_in_executor(self.executor, self.fn, jobs)
            except Exception as err:  # every request of the batch gets the engine's error
                for _, done in batch:
                    done.set_exception(err)
                continue
            for (_, done), result in zip(batch, results, strict=True):
                done.set_result(result)


# question, candidates, token budget, each candidate's tokens (counted by the ingress)
Job = tuple[str, list[Any], int | None, list[int]]


@serve.deployment(name="PickerEngine")
class PickerEngine:
    """One picker: its vLLM engine in an actor of its own, fed one batch of the concurrent
    requests at a time.

    The engine runs outside this replica's process, as plain vLLM does: inside it, it shared
    the process with Serve's own threads and ran 17-21% slower per call of the same prompts
    (benchmarks/bench_serve.py: the engine was busy 98-99% of the time, so the service's
    shortfall against plain vLLM was the engine itself). The actor is owned by this replica
    and dies with it; a dead engine actor is replaced by the pool and its batch redone."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.picker = Picker.from_pretrained(
            cfg.picker,
            engine=lambda folder: EnginePool.start(
                folder,
                1,
                num_cpus=cfg.num_cpus_per_replica,
                num_gpus=cfg.num_gpus_per_replica,
                batch_size=cfg.max_batch_size,
                max_model_len=cfg.max_model_len,
                cpu_kv_cache_gb=cfg.cpu_kv_cache_gb,
            ),
            fallback=cfg.fallback,
            fallback_k=cfg.fallback_k,
            constrained=cfg.constrained,
            name=cfg.picker,
        )
        # One thread makes every (blocking) engine call: one batch at a time, while the next
        # queues in the Batcher.
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="picker-engine")
        self.batcher = Batcher(
            self._pick_many, cfg.max_batch_size, cfg.batch_wait_timeout_s, self.thread
        )

    def ready(self) -> bool:
        return True

    def _pick_many(self, jobs: list[Job]) -> list[Selection]:
        questions, candidates, budgets, sizes = zip(*jobs, strict=True)
        return self.picker.pick_many(questions, candidates, budgets, sizes)

    async def pick(self, job: Job) -> Selection:
        return await self.batcher.submit(job)


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
    if blocking:
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            serve.shutdown()
    return url
