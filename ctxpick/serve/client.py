"""The HTTP client of ``ctxpick serve``: the same ``pick`` / ``apick`` as the Python API
(:class:`ctxpick.picker.inference.Picker`), so framework components take either.

Transport errors and the "try again later" statuses (an overloaded or restarting service, or a
proxy before it, whose body need not be JSON) are retried under the project's one retry
policy (:mod:`ctxpick.engines.retry`); any other error status is raised at once as
:class:`PickerError` with the service's message."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import httpx
from tenacity import AsyncRetrying, Retrying

from ctxpick.engines.retry import StatusError, retrying
from ctxpick.picker.selection import Candidate, Selection
from ctxpick.serve.schemas import PickResponse

BACKOFF_S = 0.2


class PickerError(StatusError):
    def __init__(self, status: int, body: Any) -> None:
        err = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(status, f"ctxpick service answered {status}: {err.get('message', body)}")
        self.body = body

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.status, self.body)


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

    @staticmethod
    def _body(question: str, passages: Sequence[Candidate], budget: int | None) -> dict:
        return {"question": question, "passages": list(passages), "token_budget": budget}

    @staticmethod
    def _selection(resp: httpx.Response) -> Selection:
        if resp.status_code != 200:
            try:
                error: Any = resp.json()
            except ValueError:  # a proxy's or a crashed server's plain text
                error = resp.text
            raise PickerError(resp.status_code, error)
        # Read through the response schema, whose unknown fields are ignored: a newer server's
        # added field never breaks a deployed client, and a proxy's page or another service
        # answering 200 is an error here, not a bad Selection in the caller's hands. The
        # Selection holds the validated values (a "5" read as 5), its passages as they came.
        try:
            body = resp.json()
            answer = PickResponse.model_validate(body).model_dump(exclude={"passages"})
        except ValueError as err:  # not JSON (JSONDecodeError), or not a pick (ValidationError)
            raise PickerError(200, f"malformed answer ({err}): {resp.text[:200]!r}") from err
        fields = {k: v for k, v in answer.items() if k in Selection.__dataclass_fields__}
        return Selection(**fields, passages=body["passages"])

    def pick(
        self, question: str, passages: Sequence[Candidate], token_budget: int | None = None
    ) -> Selection:
        body = self._body(question, passages, token_budget)
        return retrying(Retrying, self.max_attempts, BACKOFF_S)(
            lambda: self._selection(self._sync.post("/v1/pick", json=body))
        )

    async def apick(
        self, question: str, passages: Sequence[Candidate], token_budget: int | None = None
    ) -> Selection:
        body = self._body(question, passages, token_budget)
        async with httpx.AsyncClient(**self._async_args) as client:

            async def attempt() -> Selection:
                return self._selection(await client.post("/v1/pick", json=body))

            return await retrying(AsyncRetrying, self.max_attempts, BACKOFF_S)(attempt)

    def close(self) -> None:
        self._sync.close()
