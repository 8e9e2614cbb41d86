"""The HTTP client of ``ctxpick serve``: the same ``pick`` / ``apick`` as the Python API
(:class:`ctxpick.picker.inference.Picker`), so framework components take either.

Transport errors, 429 and 503 are retried with backoff (tenacity); any other 4xx is the
caller's mistake and raised at once as :class:`PickerError` with the service's message."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import httpx
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from ctxpick.picker.inference import Candidate, Selection

_RETRIED = (429, 503)


class PickerError(RuntimeError):
    def __init__(self, status: int, body: Any) -> None:
        err = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(f"ctxpick service answered {status}: {err.get('message', body)}")
        self.status, self.body = status, body


def _transient(err: BaseException) -> bool:
    return isinstance(err, httpx.TransportError) or (
        isinstance(err, PickerError) and err.status in _RETRIED
    )


class PickerClient:
    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        api_key_env: str = "CTXPICK_API_KEY",
        timeout_s: float = 120.0,
        max_attempts: int = 4,
    ) -> None:
        key = api_key if api_key is not None else os.environ.get(api_key_env, "")
        headers = {"authorization": f"Bearer {key}"} if key else {}
        self.base_url, self.max_attempts = base_url.rstrip("/"), max_attempts
        self._sync = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)
        self._async_args = {"base_url": self.base_url, "headers": headers, "timeout": timeout_s}

    def _retrying(self, cls: type) -> Any:
        return cls(
            retry=retry_if_exception(_transient),
            stop=stop_after_attempt(self.max_attempts),
            wait=wait_exponential(multiplier=0.2, max=5),
            reraise=True,
        )

    @staticmethod
    def _body(question: str, passages: Sequence[Candidate], budget: int | None) -> dict:
        return {"question": question, "passages": list(passages), "token_budget": budget}

    @staticmethod
    def _selection(resp: httpx.Response) -> Selection:
        body = resp.json()
        if resp.status_code != 200:
            raise PickerError(resp.status_code, body)
        body.pop("id"), body.pop("model")
        return Selection(**body)

    def pick(
        self, question: str, passages: Sequence[Candidate], token_budget: int | None = None
    ) -> Selection:
        for attempt in self._retrying(Retrying):
            with attempt:
                resp = self._sync.post(
                    "/v1/pick", json=self._body(question, passages, token_budget)
                )
                return self._selection(resp)
        raise AssertionError("unreachable")  # tenacity re-raises the last error

    async def apick(
        self, question: str, passages: Sequence[Candidate], token_budget: int | None = None
    ) -> Selection:
        async with httpx.AsyncClient(**self._async_args) as client:
            async for attempt in self._retrying(AsyncRetrying):
                with attempt:
                    body = self._body(question, passages, token_budget)
                    return self._selection(await client.post("/v1/pick", json=body))
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._sync.close()
