"""``serve.*``: what ``ctxpick serve`` serves, how it scales and what it refuses."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ctxpick.picker.selection import FALLBACKS
from ctxpick.picker.shipped import DEFAULT_PICKER


@dataclass
class ServeLimits:
    """Past any of these a request gets a 4xx/429 JSON error naming the limit."""

    max_passages: int = 64  # candidates per request
    max_request_bytes: int = 262144  # the HTTP body
    # Tokens of all candidates (picker tokenizer): the generator's input, not the picker's,
    # which sees each passage cut; the picker's prompt is held to serve.max_model_len.
    max_tokens_in: int = 16384
    max_queued_requests: int = 64  # waiting for an engine replica, beyond its ongoing ones

    def __post_init__(self) -> None:
        if min(self.max_passages, self.max_request_bytes, self.max_tokens_in) < 1:
            raise ValueError("serve.limits: every limit must be >= 1")


@dataclass
class ServeAudit:
    path: str = "outputs/serve/audit.jsonl"  # one JSON line per decision; empty: no audit
    store_text: bool = False  # also record the question text


@dataclass
class ServeConfig:
    # A shipped picker (the default: `ctxpick models list`), a trained model folder, a run
    # folder (its pickers.json: the last stage) or a built-in alias (an untrained base model:
    # most outputs fall back).
    picker: str = DEFAULT_PICKER
    host: str = "127.0.0.1"
    port: int = 8000
    num_replicas: int = 1  # engine replicas, unless autoscaling is on
    min_replicas: int = 0  # autoscaling between min and max replicas when max_replicas > 0
    max_replicas: int = 0
    target_ongoing_requests: float = 8  # autoscaling target per replica
    max_ongoing_requests: int = 32  # per engine replica
    max_batch_size: int = 32  # requests batched into one engine call
    batch_wait_timeout_s: float = 0.05  # how long an idle engine waits for a batch to fill
    num_cpus_per_replica: float = 1
    num_gpus_per_replica: float = 0
    max_model_len: int = 4096
    cpu_kv_cache_gb: int = 1
    fallback: str = "top_k"  # top_k | all: what is kept when the picker's output is invalid
    fallback_k: int = 2
    # constrained decoding to the picker's output format; null: as its picker.json says
    constrained: bool | None = None
    timeout_s: float = 60.0  # a request's deadline, and the most it may ask; then the fallback
    api_key_env: str = ""  # if set, requests need "Authorization: Bearer $<this variable>"
    limits: ServeLimits = field(default_factory=ServeLimits)
    audit: ServeAudit = field(default_factory=ServeAudit)

    def __post_init__(self) -> None:
        if self.fallback not in FALLBACKS:
            raise ValueError(f"serve.fallback {self.fallback!r}: expected one of {FALLBACKS}")
        if self.num_replicas < 1 or self.max_batch_size < 1 or self.max_ongoing_requests < 1:
            raise ValueError("serve: num_replicas, max_batch_size, max_ongoing_requests >= 1")
        if not self.timeout_s > 0:
            raise ValueError(f"serve.timeout_s={self.timeout_s}: expected seconds > 0")
        if not (math.isfinite(self.batch_wait_timeout_s) and self.batch_wait_timeout_s >= 0):
            wait = self.batch_wait_timeout_s
            raise ValueError(f"serve.batch_wait_timeout_s={wait}: expected finite seconds >= 0")
        if self.max_replicas and not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError("serve: autoscaling needs 0 <= min_replicas <= max_replicas")
