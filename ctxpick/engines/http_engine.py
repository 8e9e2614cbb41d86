"""An OpenAI-compatible chat-completions client behind the Engine interface, so the generator
or the judge can be any served model (`vllm serve`, a hosted API).

Requests run concurrently up to ``concurrency``; each has a timeout and is retried with
exponential backoff on connection errors, timeouts, 429 and 5xx.
"""

from __future__ import annotations

import logging
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import requests

from ctxpick.engines.base import Chat, Completion, SamplingConfig

log = logging.getLogger(__name__)
RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


@dataclass
class HTTPEngineConfig:
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"  # the key is read from this variable, never from config
    timeout_s: float = 60.0
    max_retries: int = 4
    backoff_s: float = 0.5
    concurrency: int = 8

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"http engine base_url must be an http(s) URL, got {self.base_url!r}")
        if self.timeout_s <= 0 or self.max_retries < 0 or self.concurrency < 1:
            raise ValueError("http engine needs timeout_s > 0, max_retries >= 0, concurrency >= 1")


class HTTPEngineError(RuntimeError):
    pass


class HTTPEngineUnavailable(HTTPEngineError):
    """Every retry timed out or was refused: worth trying again later, unlike a 4xx."""


class HTTPEngine:
    def __init__(self, cfg: HTTPEngineConfig) -> None:
        self.cfg = cfg
        self.url = cfg.base_url.rstrip("/") + "/chat/completions"
        key = os.environ.get(cfg.api_key_env, "")
        self.headers = {"Content-Type": "application/json"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
        self.session = requests.Session()

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        last = ""
        for attempt in range(self.cfg.max_retries + 1):
            if attempt:
                # Full jitter keeps many workers from retrying in lockstep.
                time.sleep(random.uniform(0, self.cfg.backoff_s * 2 ** (attempt - 1)))
            try:
                resp = self.session.post(
                    self.url, json=body, headers=self.headers, timeout=self.cfg.timeout_s
                )
            except (requests.ConnectionError, requests.Timeout) as err:
                last = f"{type(err).__name__}: {err}"
                continue
            if resp.status_code in RETRY_STATUS:
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                continue
            if resp.status_code != 200:
                raise HTTPEngineError(f"{self.url}: HTTP {resp.status_code}: {resp.text[:500]}")
            return resp.json()
        raise HTTPEngineUnavailable(
            f"{self.url}: gave up after {self.cfg.max_retries + 1} tries ({last})"
        )

    def _one(self, chat: Chat, sampling: SamplingConfig) -> list[Completion]:
        body: dict[str, Any] = {
            "model": self.cfg.model,
            "messages": chat,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "n": sampling.n,
            "seed": sampling.seed,
        }
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.logprobs:
            body["logprobs"] = True
        data = self._post(body)
        prompt_tokens = int((data.get("usage") or {}).get("prompt_tokens", 0))
        out = []
        for choice in sorted(data["choices"], key=lambda c: c.get("index", 0)):
            lps = ((choice.get("logprobs") or {}).get("content")) or []
            out.append(
                Completion(
                    text=choice["message"]["content"] or "",
                    token_ids=[],
                    prompt_tokens=prompt_tokens,
                    finish_reason=choice.get("finish_reason"),
                    logprobs=[float(t["logprob"]) for t in lps],
                )
            )
        return out

    def generate(self, chats: list[Chat], sampling: SamplingConfig) -> list[list[Completion]]:
        with ThreadPoolExecutor(max_workers=self.cfg.concurrency) as pool:
            return list(pool.map(lambda c: self._one(c, sampling), chats))
