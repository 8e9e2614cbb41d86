"""Framework components over a picker: the Python API (``Picker``) or the HTTP service
(``PickerClient``); both have ``pick`` and ``apick``. Install with the extras
``ctxpick[langchain]``, ``ctxpick[llamaindex]``, ``ctxpick[haystack]``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ctxpick.picker.selection import Candidate, Selection


class PickerLike(Protocol):
    def pick(
        self, question: str, passages: Sequence[Candidate], token_budget: int | None = None
    ) -> Selection: ...

    async def apick(
        self, question: str, passages: Sequence[Candidate], token_budget: int | None = None
    ) -> Selection: ...


def candidate(index: int, text: str, doc_id: Any = None, title: Any = None) -> dict[str, Any]:
    """A framework document as a pick candidate (its id, else its position)."""
    return {"id": doc_id if doc_id is not None else index, "text": text, "title": title or ""}


def annotation(sel: Selection) -> dict[str, Any]:
    """What a kept document carries in its metadata about the decision."""
    return {"ctxpick_rationale": sel.rationale, "ctxpick_fallback": sel.fallback}
