"""A Haystack 2 component: put ``CtxPickRanker(picker=...)`` between a retriever and the
prompt builder (``pipeline.connect("retriever", "picker")``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from haystack import Document, component

from ctxpick.picker.selection import Selection
from ctxpick.serve.integrations import annotation, candidate


@component
class CtxPickRanker:
    def __init__(self, picker: Any, token_budget: int | None = None) -> None:
        self.picker, self.token_budget = picker, token_budget  # Picker or PickerClient

    @staticmethod
    def _candidates(documents: list[Document]) -> list[dict[str, Any]]:
        return [
            candidate(i, d.content or "", d.id, (d.meta or {}).get("title"))
            for i, d in enumerate(documents)
        ]

    @staticmethod
    def _kept(documents: list[Document], sel: Selection, top_k: int | None) -> dict[str, Any]:
        kept = [
            replace(documents[i], meta={**documents[i].meta, **annotation(sel)})
            for i in sel.indices
        ]
        return {"documents": kept[:top_k] if top_k else kept}

    @component.output_types(documents=list[Document])
    def run(
        self, query: str, documents: list[Document], top_k: int | None = None
    ) -> dict[str, Any]:
        """The picked documents, retriever order; ``top_k`` caps how many."""
        if not documents:
            return {"documents": []}
        sel = self.picker.pick(query, self._candidates(documents), self.token_budget)
        return self._kept(documents, sel, top_k)

    @component.output_types(documents=list[Document])
    async def run_async(
        self, query: str, documents: list[Document], top_k: int | None = None
    ) -> dict[str, Any]:
        if not documents:
            return {"documents": []}
        sel = await self.picker.apick(query, self._candidates(documents), self.token_budget)
        return self._kept(documents, sel, top_k)
