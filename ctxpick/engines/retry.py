"""The one retry policy of ctxpick's HTTP clients (the generator/judge engine and the picker
service's client): tenacity over httpx, retrying transport errors and the statuses a server
uses for "try again later", with full-jitter exponential backoff so that many workers never
retry in lockstep. Any other status is the caller's mistake and is raised at once."""

from __future__ import annotations

from typing import Any

import httpx
from tenacity import AsyncRetrying, Retrying, retry_if_exception, stop_after_attempt
from tenacity import wait_random_exponential as full_jitter

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class StatusError(RuntimeError):
    """A non-2xx answer; retried when its status is in :data:`RETRY_STATUS`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self) -> tuple[Any, ...]:
        # Crosses Ray's process boundaries: rebuild with both arguments, not just ``args``.
        return type(self), (self.status, str(self))


def transient(err: BaseException) -> bool:
    return isinstance(err, httpx.TransportError) or (
        isinstance(err, StatusError) and err.status in RETRY_STATUS
    )


def retrying(cls: type[Retrying] | type[AsyncRetrying], attempts: int, backoff_s: float) -> Any:
    """``for attempt in retrying(Retrying, ...): with attempt: ...`` (``async for`` with
    :class:`AsyncRetrying`); the last error is re-raised as itself."""
    return cls(
        retry=retry_if_exception(transient),
        stop=stop_after_attempt(attempts),
        wait=full_jitter(multiplier=backoff_s, max=30 * backoff_s),
        reraise=True,
    )
