"""`ctxpick serve` on the real stack (slow): Ray Serve with two vLLM picker replicas on the
loopback cluster, real HTTP through httpx, the real LangChain / LlamaIndex / Haystack
packages, a schemathesis pass over the served OpenAPI schema."""

import asyncio
import json
import socket
import time

import httpx
import pytest
import ray

from ctxpick.config import compose
from ctxpick.serve.client import PickerClient, PickerError

pytestmark = pytest.mark.slow

KEY_ENV, KEY = "CTXPICK_TEST_API_KEY", "s3cret-token"
QUESTION = "Who wrote the play Hamlet?"
PASSAGES = [
    "Hamlet is a tragedy written by William Shakespeare around 1600.",
    "Paris is the capital and most populous city of France.",
    {"id": "ws", "text": "Shakespeare was born in Stratford-upon-Avon in 1564.", "title": "WS"},
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def service(ray_cluster, tmp_path_factory, monkeypatch_module):
    from ray import serve

    from ctxpick.serve.app import start

    monkeypatch_module.setenv(KEY_ENV, KEY)
    audit = tmp_path_factory.mktemp("serve") / "audit.jsonl"
    cfg = compose(
        [
            "serve.picker=smollm2-135m",  # the service's mechanics on the smallest built-in
            f"serve.port={_free_port()}",
            "serve.num_replicas=2",
            "serve.max_batch_size=8",
            "serve.batch_wait_timeout_s=0.05",
            "serve.max_model_len=2048",
            "serve.limits.max_request_bytes=65536",
            "serve.limits.max_passages=12",
            "serve.max_ongoing_requests=8",
            "serve.limits.max_queued_requests=8",
            f"serve.api_key_env={KEY_ENV}",
            f"serve.audit.path={audit}",
        ]
    ).serve
    url = start(cfg, blocking=False)
    yield url, audit
    serve.shutdown()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def http(service):
    with httpx.Client(
        base_url=service[0], headers={"authorization": f"Bearer {KEY}"}, timeout=300
    ) as client:
        yield client


def _audit_lines(audit):
    return [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []


def test_pick_and_rerank_answer_and_every_decision_is_audited(service, http):
    url, audit = service
    before = len(_audit_lines(audit))
    r = http.post("/v1/pick", json={"question": QUESTION, "passages": PASSAGES})
    assert r.status_code == 200, r.text
    sel = r.json()
    assert r.headers["x-request-id"] == sel["id"]
    assert sel["indices"] == sorted(sel["indices"]) and sel["indices"]  # retriever order
    assert sel["passages"] == [PASSAGES[i] for i in sel["indices"]]
    assert sel["ids"] == [
        PASSAGES[i]["id"] if isinstance(PASSAGES[i], dict) else i for i in sel["indices"]
    ]
    assert sel["valid"] or sel["fallback"]  # never a silent choice
    assert 0 < sel["tokens_kept"] <= sel["tokens_in"]
    # The response says which engine call answered it, and how (a client's Selection is whole).
    assert (sel["batch_size"] >= 1) == (sel["fallback"] != "deadline")
    assert sel["output"] or not sel["valid"]

    r = http.post(
        "/v1/rerank",
        json={
            "model": "any-reranker",
            "query": QUESTION,
            "documents": [p if isinstance(p, str) else {"text": p["text"]} for p in PASSAGES],
            "top_n": 3,
            "return_documents": True,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "model", "results", "usage"}
    usage = body["usage"]
    assert 0 < usage["prompt_tokens"] <= usage["total_tokens"]
    scores = [x["relevance_score"] for x in body["results"]]
    assert scores == sorted(scores, reverse=True) and len(scores) == 3
    picked = [x["index"] for x in body["results"] if x["relevance_score"] > 0.5]
    assert picked == sorted(picked) and all("text" in x["document"] for x in body["results"])

    # A budget too small for any passage keeps none and says so.
    r = http.post("/v1/pick", json={"question": QUESTION, "passages": PASSAGES, "token_budget": 1})
    assert r.status_code == 200 and r.json()["indices"] == [] and r.json()["budget_cut"]

    lines = _audit_lines(audit)[before:]
    assert len(lines) == 3 and [x["endpoint"] for x in lines] == ["pick", "rerank", "pick"]
    first = lines[0]
    assert first["request_id"] == sel["id"] and first["picked_ids"] == sel["ids"]
    assert first["batch_size"] == sel["batch_size"]
    assert first["candidate_ids"] == [0, 1, "ws"] and "question" not in first  # no text stored
    assert {
        "time",
        "model",
        "prompt_version",
        "rationale",
        "tokens_in",
        "latency_ms",
        "fallback",
    } <= set(first)


def test_models_health_metrics_and_the_checked_in_schema(service, http):
    from ctxpick.serve.app import OPENAPI_FILE

    assert http.get("/health").json()["status"] == "ok"
    card = http.get("/v1/models").json()["data"][0]
    assert card["id"] == "smollm2-135m" and len(card["prompt_version"]) == 12
    served = http.get("/openapi.json").json()
    # Serve ships the FastAPI app to the replica by value, and FastAPI's "unset" sentinel
    # does not survive pickling: each request body gains an empty "example".
    for path in served["paths"].values():
        for op in path.values():
            op.get("requestBody", {}).get("content", {}).get("application/json", {}).pop(
                "example", None
            )
    assert served == json.loads(OPENAPI_FILE.read_text()), "run `ctxpick openapi --write`"
    http.post("/v1/pick", json={"question": QUESTION, "passages": PASSAGES})
    text = http.get("/metrics").text
    for name in (
        "ctxpick_requests_total",
        "ctxpick_request_latency_seconds_bucket",
        "ctxpick_batch_size_bucket",
        "ctxpick_fallbacks_total",
        "ctxpick_tokens_saved_total",
    ):
        assert name in text


def test_bad_requests_get_a_clear_4xx_and_the_service_keeps_serving(service, http):
    url, _ = service
    ok = {"question": QUESTION, "passages": PASSAGES}
    cases = {
        "malformed JSON": (b'{"question": "q", "passages": [', 400, None),
        "not UTF-8": (b'{"question": "\xff\xfe", "passages": ["a"]}', 400, None),
        "missing field": (json.dumps({"passages": ["a"]}).encode(), 422, "question"),
        "wrong type": (json.dumps({"question": "q", "passages": "a"}).encode(), 422, "passages"),
        "empty passages": (json.dumps({"question": "q", "passages": []}).encode(), 422, "passages"),
        "unknown field": (json.dumps(ok | {"temperature": 2}).encode(), 422, "temperature"),
        "1 MB passage": (
            json.dumps({"question": "q", "passages": ["x " * 500_000]}).encode(),
            413,
            "serve.limits.max_request_bytes",
        ),
        "too many passages": (
            json.dumps({"question": "q", "passages": ["a"] * 13}).encode(),
            413,
            "serve.limits.max_passages",
        ),
    }
    for name, (body, status, named) in cases.items():
        r = http.post("/v1/pick", content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, (name, r.status_code, r.text)
        err = r.json()["error"]
        assert err["message"], name
        if named:
            assert named in (err["limit"] or "") + err["message"], (name, err)
    # no or a wrong bearer token
    assert httpx.post(f"{url}/v1/pick", json=ok).status_code == 401
    r = httpx.post(f"{url}/v1/pick", json=ok, headers={"authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized"
    assert http.post("/v1/pick", json=ok).status_code == 200


def test_an_over_long_request_is_refused_alone_and_its_company_is_answered(service):
    """A 6,000-character CJK passage (no spaces: the passage cut keeps it whole) makes a
    picker prompt past the engine's context: 413 naming serve.max_model_len, at once, while
    the normal request sent beside it gets its answer."""

    async def both() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=service[0], headers={"authorization": f"Bearer {KEY}"}, timeout=600
        ) as client:
            cjk = {"question": "这段文字说了什么？", "passages": ["汉字文本" * 1500, "短文"]}
            bodies = [{"question": QUESTION, "passages": PASSAGES}, cjk]
            return await asyncio.gather(*[client.post("/v1/pick", json=b) for b in bodies])

    normal, long = asyncio.run(both())
    assert normal.status_code == 200, normal.text
    assert long.status_code == 413, long.text
    err = long.json()["error"]
    assert err["type"] == "prompt_too_long" and err["limit"] == "serve.max_model_len"


def test_the_body_limit_counts_the_bytes_read_and_text_must_be_unicode(service, http):
    # chunked (no Content-Length): 100 kB of JSON whitespace around a tiny request
    def chunks():
        yield b'{"question": "q", "passages": ["a"]'
        for _ in range(100):
            yield b" " * 1000
        yield b"}"

    r = http.post("/v1/pick", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert r.status_code == 413, r.text
    assert r.json()["error"]["limit"] == "serve.limits.max_request_bytes"
    for body in (
        b'{"question": "\\ud800", "passages": ["a"]}',
        b'{"question": "q", "passages": [{"id": "x", "text": "a\\udfff"}]}',
    ):
        r = http.post("/v1/pick", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_text", r.text
    assert http.post("/v1/pick", json={"question": QUESTION, "passages": PASSAGES}).is_success


def test_top_n_zero_returns_every_document(http):
    docs = [p if isinstance(p, str) else p["text"] for p in PASSAGES]
    for top_n in (0, None):
        r = http.post("/v1/rerank", json={"query": QUESTION, "documents": docs, "top_n": top_n})
        assert r.status_code == 200, r.text
        assert sorted(x["index"] for x in r.json()["results"]) == [0, 1, 2]


def test_past_its_deadline_a_request_gets_the_fallback_and_the_service_serves_on(service, http):
    """A deadline (the body's ``timeout`` or the x-request-timeout header) that passes
    before the engine answers gets the fallback policy's passages (top 2 of the retriever
    order), marked "deadline"; the engine replica drops the cancelled request and serves
    the next."""
    url, audit = service
    body = {"question": QUESTION, "passages": PASSAGES}
    for r in (
        http.post("/v1/pick", json=body | {"timeout": 1e-6}),
        http.post("/v1/pick", json=body, headers={"x-request-timeout": "1e-6"}),
    ):
        assert r.status_code == 200, r.text
        sel = r.json()
        assert sel["fallback"] == "deadline" and not sel["valid"] and sel["batch_size"] == 0
        assert sel["indices"] == [0, 1] and sel["passages"] == PASSAGES[:2]
    assert _audit_lines(audit)[-1]["fallback"] == "deadline"
    r = http.post("/v1/pick", json=body, headers={"x-request-timeout": "soon"})
    assert r.status_code == 400 and "x-request-timeout" in r.json()["error"]["message"]
    r = http.post("/v1/pick", json=body | {"timeout": 600})
    assert r.status_code == 200 and r.json()["fallback"] != "deadline"


def test_a_full_queue_answers_429_naming_the_limit(service):
    """2 replicas x 8 ongoing + 8 queued: a flood of 60 gets 429s naming the limit, and the
    requests within it succeed."""
    url, _ = service

    async def flood(n: int) -> list[int]:
        async with httpx.AsyncClient(
            base_url=url, headers={"authorization": f"Bearer {KEY}"}, timeout=600
        ) as client:
            body = {"question": QUESTION, "passages": PASSAGES}
            rs = await asyncio.gather(*[client.post("/v1/pick", json=body) for _ in range(n)])
            for r in rs:
                if r.status_code == 429:
                    assert r.json()["error"]["limit"] == "serve.limits.max_queued_requests"
            return [r.status_code for r in rs]

    codes = asyncio.run(flood(60))
    assert set(codes) <= {200, 429} and codes.count(200) > 0 and codes.count(429) > 0


def test_a_killed_replica_is_replaced_and_requests_keep_succeeding(service, http):
    from ray import serve

    def replicas() -> list[str]:
        return sorted(
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::ctxpick#PickerEngine#")
        )

    names = replicas()
    assert len(names) == 2
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
    body = {"question": QUESTION, "passages": PASSAGES}
    for _ in range(6):
        assert http.post("/v1/pick", json=body).status_code == 200
    deadline = time.time() + 300
    while time.time() < deadline:
        status = serve.status().applications["ctxpick"].deployments["PickerEngine"]
        now = replicas()
        if status.status == "HEALTHY" and len(now) == 2 and names[0] not in now:
            break
        time.sleep(2)
    else:
        pytest.fail(f"replica not replaced: {replicas()}")
    assert http.post("/v1/pick", json=body).status_code == 200


def test_client_and_framework_components_over_http(service):
    from haystack import Document as HSDocument
    from langchain_core.documents import Document as LCDocument
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    from ctxpick.serve.integrations.haystack import CtxPickRanker
    from ctxpick.serve.integrations.langchain import CtxPickCompressor
    from ctxpick.serve.integrations.llama_index import CtxPickPostprocessor

    client = PickerClient(service[0], api_key=KEY)
    sel = client.pick(QUESTION, PASSAGES)
    assert sel.indices and (sel.valid or sel.fallback)
    assert asyncio.run(client.apick(QUESTION, PASSAGES)).indices == sel.indices  # greedy
    with pytest.raises(PickerError, match="422"):
        client.pick(QUESTION, [])
    texts = [p if isinstance(p, str) else p["text"] for p in PASSAGES]

    lc = CtxPickCompressor(picker=client)
    docs = [LCDocument(page_content=t, metadata={"n": i}) for i, t in enumerate(texts)]
    kept = lc.compress_documents(docs, QUESTION)
    assert [d.metadata["n"] for d in kept] == sel.indices
    assert "ctxpick_rationale" in kept[0].metadata
    akept = asyncio.run(lc.acompress_documents(docs, QUESTION))
    assert [d.metadata["n"] for d in akept] == sel.indices

    li = CtxPickPostprocessor(picker=client)
    nodes = [NodeWithScore(node=TextNode(text=t, id_=f"n{i}")) for i, t in enumerate(texts)]
    kept = li.postprocess_nodes(nodes, query_str=QUESTION)
    assert [n.node.node_id for n in kept] == [f"n{i}" for i in sel.indices]
    akept = asyncio.run(li.apostprocess_nodes(nodes, QueryBundle(QUESTION)))
    assert [n.node.node_id for n in akept] == [f"n{i}" for i in sel.indices]

    hs = CtxPickRanker(picker=client)
    hdocs = [HSDocument(content=t, id=f"d{i}") for i, t in enumerate(texts)]
    out = hs.run(query=QUESTION, documents=hdocs)["documents"]
    assert [d.id for d in out] == [f"d{i}" for i in sel.indices]
    assert [d.id for d in hs.run(query=QUESTION, documents=hdocs, top_k=1)["documents"]] == [
        f"d{sel.indices[0]}"
    ]
    aout = asyncio.run(hs.run_async(query=QUESTION, documents=hdocs))["documents"]
    assert [d.id for d in aout] == [d.id for d in out]
    client.close()


def test_components_over_the_python_api(engine_actor):
    """The same components in process: the Python API over a real vLLM engine."""
    from haystack import Document as HSDocument

    from ctxpick.config import compose, picker_spec
    from ctxpick.engines.ray_pool import EnginePool
    from ctxpick.picker.inference import Picker
    from ctxpick.serve.integrations.haystack import CtxPickRanker

    picker = Picker(EnginePool([engine_actor]), picker_spec(compose([])), fallback="all")
    texts = [p if isinstance(p, str) else p["text"] for p in PASSAGES]
    sel = picker.pick(QUESTION, PASSAGES)
    assert sel.valid or sel.indices == [0, 1, 2]  # fallback "all": the whole pool
    out = CtxPickRanker(picker=picker).run(
        query=QUESTION, documents=[HSDocument(content=t) for t in texts]
    )["documents"]
    assert [d.content for d in out] == [texts[i] for i in sel.indices]
    aout = asyncio.run(
        CtxPickRanker(picker=picker).run_async(
            query=QUESTION, documents=[HSDocument(content=t) for t in texts]
        )
    )["documents"]
    assert [d.content for d in aout] == [d.content for d in out]


def test_fuzzing_the_openapi_schema_finds_no_server_error(service):
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error

    url, _ = service
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    failures = []

    def fuzz(operation):
        @settings(
            # Each pick runs the model: 12 an operation took 213 s on a float32 CPU.
            max_examples=6,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def run(case):
            response = case.call(headers={"authorization": f"Bearer {KEY}"}, timeout=300)
            if response.status_code >= 500:
                failures.append((operation.label, response.status_code, response.text[:200]))
            case.validate_response(response, checks=[not_a_server_error])

        run()

    for result in schema.get_all_operations():
        fuzz(result.ok())
    assert not failures, failures
