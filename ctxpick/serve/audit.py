"""What the service records: one audit line per decision, and the Prometheus metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import prometheus_client as prom

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
DEADLINES = prom.Counter(
    "ctxpick_deadlines", "Requests answered by the fallback at their deadline", registry=REGISTRY
)
TOKENS_IN = prom.Counter("ctxpick_tokens_in", "Candidate tokens received", registry=REGISTRY)
TOKENS_SAVED = prom.Counter(
    "ctxpick_tokens_saved", "Candidate tokens not passed on", registry=REGISTRY
)


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
