"""The ``Api`` ingress: FastAPI routes over one per-process :class:`Service`, which checks
limits and the bearer token, calls an engine replica within the request's deadline, and
writes the audit trail and the metrics. The routes are module functions, so the OpenAPI
schema is built without Ray (``ctxpick openapi``; checked in as ``docs/openapi.json``)."""

from __future__ import annotations

import asyncio
import hmac
import os
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import prometheus_client as prom
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from ctxpick.picker.inference import load_spec
from ctxpick.picker.selection import Candidate, Selection, caller_id, fallback_selection
from ctxpick.serve.audit import (
    BATCH,
    DEADLINES,
    FALLBACKS,
    LATENCY,
    REGISTRY,
    REQUESTS,
    TOKENS_IN,
    TOKENS_SAVED,
    AuditLog,
)
from ctxpick.serve.limits import ApiError, BodyLimit, Counted, RequestLimits, error_response
from ctxpick.serve.replica import Job
from ctxpick.serve.schemas import (
    NOT_UNICODE,
    ErrorResponse,
    Health,
    ModelCard,
    ModelList,
    PickRequest,
    PickResponse,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
)
from ctxpick.serve.settings import ServeConfig

TIMEOUT_HEADER = "x-request-timeout"  # seconds, when the body has no ``timeout``


class Service:
    """One ingress replica's state: settings, the engine handle, the audit log."""

    def __init__(self, cfg: ServeConfig, engine: Any) -> None:
        self.cfg, self.engine = cfg, engine
        folder, self.spec = load_spec(cfg.picker)
        self.model, self.version = cfg.picker, self.spec.version
        self.limits = RequestLimits(cfg, folder, self.spec)
        # Counting tokens takes a while (up to max_tokens_in): off the event loop, where the
        # other requests' deadlines run, and one at a time: a fast tokenizer shared by threads
        # can fail with "Already borrowed".
        self._counting = ThreadPoolExecutor(1, thread_name_prefix="ctxpick-limits")
        self.audit = AuditLog(cfg.audit.path, cfg.audit.store_text)
        self.api_key = ""
        if cfg.api_key_env:
            self.api_key = os.environ.get(cfg.api_key_env, "")
            if not self.api_key:
                raise RuntimeError(
                    f"serve.api_key_env={cfg.api_key_env}: that environment variable is unset "
                    "or empty on the serving node"
                )

    async def _engine_pick(self, job: Job) -> Selection:
        """One engine replica's answer; a replica that dies mid-call is retried on another."""
        from ray.exceptions import RayActorError
        from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_fixed

        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(RayActorError),
            stop=stop_after_attempt(3),
            wait=wait_fixed(0.5),
            reraise=True,
        ):
            with attempt:
                response = self.engine.pick.remote(job)
                try:
                    return await response
                except asyncio.CancelledError:
                    # the replica then drops the job, unless its engine call has started
                    response.cancel()
                    raise
        raise AssertionError("unreachable")  # tenacity re-raises the last error

    async def select(
        self,
        endpoint: str,
        rid: str,
        question: str,
        candidates: list[Candidate],
        budget: int | None,
        timeout: float | None,
    ) -> tuple[Selection, Counted]:
        """Check, pick on an engine replica within ``timeout`` seconds (else the fallback
        policy's passages, ``fallback`` "deadline"), audit and count one request."""
        from ray.serve.exceptions import BackPressureError

        t0 = time.perf_counter()
        counted = await asyncio.get_running_loop().run_in_executor(
            self._counting, self.limits.check, question, candidates
        )
        # serve.timeout_s is the default and the cap: a request cannot switch its deadline off.
        deadline = min(timeout or self.cfg.timeout_s, self.cfg.timeout_s)
        job = (question, candidates, budget, counted.sizes)
        try:
            left = deadline - (time.perf_counter() - t0)
            sel = await asyncio.wait_for(self._engine_pick(job), max(left, 0))
        except BackPressureError:
            raise ApiError(
                429,
                "overloaded",
                "the request queue is full; retry later",
                "serve.limits.max_queued_requests",
            ) from None
        except TimeoutError:
            DEADLINES.inc()
            sel = fallback_selection(
                candidates,
                counted.sizes,
                budget,
                self.cfg.fallback,
                self.cfg.fallback_k,
                "deadline",
                latency_ms=(time.perf_counter() - t0) * 1000,
            )
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
            "prompt_tokens": counted.prompt_tokens,
            "latency_ms": round(latency * 1000, 2),
            "batch_size": sel.batch_size,
            "fallback": sel.fallback,
            "budget_cut": sel.budget_cut,
            "rationale_cut": sel.rationale_cut,
        }
        self.audit.write(record, question)
        return sel, counted


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


def _timeout(given: float | None, request: Request) -> float | None:
    """The request's own deadline: the body's ``timeout``, else the header's."""
    if given is not None or (header := request.headers.get(TIMEOUT_HEADER)) is None:
        return given
    try:
        seconds = float(header)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ApiError(400, "invalid_request", f"{TIMEOUT_HEADER}: {header!r} is not seconds > 0")
    return seconds


def _max_body() -> int | None:
    return _SERVICE.cfg.limits.max_request_bytes if _SERVICE is not None else None


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 413, 422, 429, 503)
}
app = FastAPI(
    title="ctxpick",
    version="0.1.0",
    description="A context picker between a retriever and a generator: it keeps a minimal "
    "sufficient subset of the retrieved passages.",
)
app.add_middleware(BodyLimit, limit=_max_body)


@app.exception_handler(ApiError)
async def _api_error(request: Request, err: ApiError) -> JSONResponse:
    return error_response(request.url.path, err)


@app.exception_handler(RequestValidationError)
async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
    errors: Sequence[Any] = err.errors()

    def where(e: Any) -> str:
        return ".".join(str(x) for x in e["loc"])

    if any(e["type"] == "json_invalid" for e in errors):
        return error_response(request.url.path, ApiError(400, "invalid_json", "not JSON"))
    if text := [e for e in errors if e["type"] == NOT_UNICODE]:
        # not echoed: a lone surrogate cannot be written as UTF-8
        problem = f"{where(text[0])}: not Unicode text (a lone surrogate?)"
        return error_response(request.url.path, ApiError(400, "invalid_text", problem))
    problems = "; ".join(f"{where(e)}: {e['msg']}" for e in errors[:5])
    return error_response(request.url.path, ApiError(422, "invalid_request", problems))


@app.exception_handler(HTTPException)
async def _http_error(request: Request, err: HTTPException) -> JSONResponse:
    # FastAPI's own refusals (a body that is not UTF-8 or not JSON, an unknown route)
    return error_response(
        request.url.path, ApiError(err.status_code, "invalid_request", str(err.detail))
    )


@app.post("/v1/pick", response_model=PickResponse, responses=ERRORS)
async def pick(req: PickRequest, request: Request, svc: Service = Depends(authorized)) -> Any:
    """The minimal sufficient subset of ``passages`` for ``question``."""
    rid, t0 = _request_id(request), time.perf_counter()
    candidates = [p if isinstance(p, str) else p.model_dump() for p in req.passages]
    timeout = _timeout(req.timeout, request)
    sel, _ = await svc.select("pick", rid, req.question, candidates, req.token_budget, timeout)
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
    timeout = _timeout(req.timeout, request)
    sel, counted = await svc.select("rerank", rid, req.query, texts, None, timeout)
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
    ][: req.top_n or None]  # the rerank APIs' convention: 0 returns all
    LATENCY.labels("rerank").observe(time.perf_counter() - t0)
    REQUESTS.labels(request.url.path, "200").inc()
    # On the counting thread: the fast tokenizer must not be shared across threads.
    loop = asyncio.get_running_loop()
    count = svc.limits.count_tokens
    output = await loop.run_in_executor(svc._counting, count, sel.output) if sel.output else 0
    usage = RerankUsage(
        prompt_tokens=counted.prompt_tokens, total_tokens=counted.prompt_tokens + output
    )
    body = RerankResponse(id=rid, model=svc.model, results=results, usage=usage)
    return JSONResponse(body.model_dump(exclude_none=True))


@app.get("/v1/models", response_model=ModelList, responses=ERRORS)
async def models(svc: Service = Depends(authorized)) -> ModelList:
    card = ModelCard(
        id=svc.model,
        prompt_version=svc.version,
        output_format=svc.spec.output_format,
        max_passages_shown=svc.spec.max_passages,
        expected_pool=svc.spec.pool,
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
