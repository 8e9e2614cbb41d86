"""The service's request and response bodies (the OpenAPI schema is built from these)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

# Pydantic's error type for a string that is not Unicode text. Its JSON parser refuses a lone
# surrogate ("\ud800", valid JSON syntax) in a plain string field, but not inside a union's
# model (a passage's text): there this validator does, with the same error type.
NOT_UNICODE = "string_unicode"


def _unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise PydanticCustomError(NOT_UNICODE, f"a lone surrogate at {err.start}") from None
    return text


Text = Annotated[str, AfterValidator(_unicode)]
Timeout = Field(
    None,
    gt=0,
    description="seconds this request may take (also the x-request-timeout header); past it "
    "the answer is the fallback policy's, with fallback 'deadline'. Default and most: "
    "serve.timeout_s",
)


class PassageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: Text | int | None = None
    text: Text
    title: Text | None = None


class PassageOut(PassageIn):
    """A passage echoed back as sent. Keys a later server echoes are ignored, not refused, so a
    deployed client reads its answers."""

    model_config = ConfigDict(extra="ignore")


class PickRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: Text = Field(min_length=1)
    passages: list[Text | PassageIn] = Field(min_length=1, description="retriever order")
    token_budget: int | None = Field(None, ge=1, description="cap on the kept passages' tokens")
    timeout: float | None = Timeout


class PickResponse(BaseModel):
    id: str = Field(description="request id (also the X-Request-Id header)")
    model: str
    ids: list[str | int] = Field(description="kept ids (a plain string's 0-based position)")
    indices: list[int] = Field(description="kept 0-based positions, retriever order")
    passages: list[str | PassageOut]
    rationale: str
    tokens_in: int
    tokens_kept: int
    valid: bool = Field(description="the picker's output parsed")
    fallback: str | None = Field(
        description="why the fallback policy chose (null: the picker; 'deadline': the "
        "request's timeout passed first)"
    )
    budget_cut: bool
    latency_ms: float = Field(
        description="the engine call this question was part of; with 'deadline': the wait"
    )
    # Defaults for fields added on 2026-12-04, which older servers do not send: as a Selection's.
    batch_size: int = Field(
        1,
        description="questions in that engine call (0: none, e.g. 'deadline'; after an engine "
        "error: the call it was sent in)",
    )
    output: str = Field("", description="the picker's raw output ('': no engine call answered)")
    rationale_cut: bool = Field(
        False, description="max_tokens cut the rationale; the ids written before it are kept"
    )


class RerankDocument(BaseModel):
    text: Text


class RerankRequest(BaseModel):
    """The Cohere / vLLM rerank request."""

    model: str | None = Field(None, description="accepted and ignored: one model is served")
    query: Text = Field(min_length=1)
    documents: list[Text | RerankDocument] = Field(min_length=1)
    top_n: int | None = Field(None, ge=0, description="results returned; 0 or null: all")
    return_documents: bool = True
    timeout: float | None = Timeout


class RerankResult(BaseModel):
    index: int
    relevance_score: float = Field(description="> 0.5: picked; order: picked, then the rest")
    document: RerankDocument | None = None


class RerankUsage(BaseModel):
    prompt_tokens: int = Field(description="tokens of the picker's prompt")
    total_tokens: int = Field(description="the prompt's and the picker's output tokens")


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage


class ErrorBody(BaseModel):
    type: str
    message: str
    limit: str | None = Field(None, description="the config key of the limit hit")


class ErrorResponse(BaseModel):
    error: ErrorBody


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    owned_by: str = "ctxpick"
    prompt_version: str
    output_format: str
    max_passages_shown: int
    # The pool the picker was trained to read (picker.json): send candidates ranked and
    # chunked this way, or its picks read another order than it learnt. None: not recorded.
    expected_pool: dict[str, Any] | None = None


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: str
    model: str
