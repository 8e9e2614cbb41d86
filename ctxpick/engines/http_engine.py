"""An OpenAI-compatible chat-completions client behind the Engine interface, so the generator
or the judge can be any served model (`vllm serve`, a hosted API).

Requests run concurrently up to ``concurrency``; each has a timeout and is retried under the
project's one retry policy (:mod:`ctxpick.engines.retry`).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import Retrying

from ctxpick.engines.base import Chat, Completion, SamplingConfig
from ctxpick.engines.retry import RETRY_STATUS, StatusError, retrying


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
        if not self.timeout_s > 0 or self.max_retries < 0 or self.concurrency < 1:
            raise ValueError("http engine needs timeout_s > 0, max_retries >= 0, concurrency >= 1")


class HTTPEngineError(StatusError):
    """The endpoint refused the request (a status outside RETRY_STATUS): retrying won't help."""


class HTTPEngineUnavailable(HTTPEngineError):
    """Every retry timed out or was refused: worth trying again later, unlike a 4xx."""


class HTTPEngine:
    def __init__(self, cfg: HTTPEngineConfig) -> None:
        self.cfg = cfg
        self.url = cfg.base_url.rstrip("/") + "/chat/completions"
        key = os.environ.get(cfg.api_key_env, "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        # One client for every worker thread: httpx clients are thread-safe and pool connections.
        self.client = httpx.Client(headers=headers, timeout=cfg.timeout_s)

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        def attempt() -> dict[str, Any]:
            resp = self.client.post(self.url, json=body)
            if resp.status_code != 200:
                cls = StatusError if resp.status_code in RETRY_STATUS else HTTPEngineError
                raise cls(
                    resp.status_code, f"{self.url}: HTTP {resp.status_code}: {resp.text[:500]}"
                )
            return resp.json()

        tries = self.cfg.max_retries + 1
        try:
            return retrying(Retrying, tries, self.cfg.backoff_s)(attempt)
        except HTTPEngineError:
            raise
        except (httpx.TransportError, StatusError) as err:
            raise HTTPEngineUnavailable(
                0, f"{self.url}: gave up after {tries} tries ({type(err).__name__}: {err})"
            ) from None

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
