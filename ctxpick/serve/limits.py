"""What the service refuses, and how: a JSON error naming the config key of the limit hit.

Every limit is checked at the ingress, before a request joins an engine batch: a request the
engine cannot take (a prompt past its context) must be refused alone, never fail the batch it
would have shared."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ctxpick.engines.vllm_engine import chat_prompt_ids
from ctxpick.picker.selection import Candidate, as_passages, passage_tokens, token_counter
from ctxpick.picker.spec import PickerSpec
from ctxpick.serve.audit import REQUESTS
from ctxpick.serve.schemas import ErrorBody, ErrorResponse
from ctxpick.serve.settings import ServeConfig


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, limit: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.limit = status, kind, message, limit


def error_response(path: str, err: ApiError) -> JSONResponse:
    REQUESTS.labels(path, str(err.status)).inc()
    body = ErrorResponse(error=ErrorBody(type=err.kind, message=err.message, limit=err.limit))
    return JSONResponse(body.model_dump(), status_code=err.status)


class BodyLimit:
    """ASGI middleware: a body past ``limit()`` bytes gets 413 as its bytes arrive. Counted on
    what is read, not on Content-Length, which a chunked body does not send."""

    def __init__(self, app: ASGIApp, limit: Callable[[], int | None]) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.limit() if scope["type"] == "http" else None
        if limit is None:
            await self.app(scope, receive, send)
            return
        read: list[Message] = []
        size, more = 0, True
        while more:
            message = await receive()
            read.append(message)
            if message["type"] != "http.request":  # the client left
                break
            size += len(message.get("body", b""))
            if size > limit:
                err = ApiError(
                    413,
                    "request_too_large",
                    f"the body exceeds {limit} bytes",
                    "serve.limits.max_request_bytes",
                )
                await error_response(scope["path"], err)(scope, receive, send)
                return
            more = message.get("more_body", False)

        async def replay() -> Message:
            return read.pop(0) if read else await receive()

        await self.app(scope, replay, send)


@dataclass(frozen=True)
class Counted:
    sizes: list[int]  # each candidate's tokens, as the generator reads it
    prompt_tokens: int  # the picker's prompt, chat template included


class RequestLimits:
    """``serve.limits`` and the engine's context, checked on one request's text."""

    def __init__(self, cfg: ServeConfig, folder: str, spec: PickerSpec) -> None:
        from transformers import AutoTokenizer

        self.limits, self.spec = cfg.limits, spec
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.count_tokens = token_counter(self.tokenizer)
        # the engine refuses a prompt that leaves no room for the picker's whole output
        self.max_prompt_tokens = cfg.max_model_len - spec.max_tokens
        if self.max_prompt_tokens < 1:
            raise ValueError(
                f"serve.max_model_len={cfg.max_model_len} leaves no room for a prompt beside "
                f"the picker's {spec.max_tokens} output tokens ({folder}/picker.json)"
            )

    def check(self, question: str, candidates: Sequence[Candidate]) -> Counted:
        """Refuse a request past a limit; else its token counts."""
        lim = self.limits
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
        chat: Any = self.spec.chat(question, passages)
        prompt = len(chat_prompt_ids(self.tokenizer, chat))
        if prompt > self.max_prompt_tokens:
            raise ApiError(
                413,
                "prompt_too_long",
                f"the picker's prompt is {prompt} tokens, over the {self.max_prompt_tokens} "
                f"its engine takes (serve.max_model_len minus {self.spec.max_tokens} output "
                "tokens): shorten the question or the first passages",
                "serve.max_model_len",
            )
        return Counted(sizes, prompt)
