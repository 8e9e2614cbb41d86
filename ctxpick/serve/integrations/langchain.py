"""A LangChain document compressor: ``ContextualCompressionRetriever(base_compressor=
CtxPickCompressor(picker=...), base_retriever=...)`` keeps the picked documents."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import ConfigDict

from ctxpick.picker.selection import Selection
from ctxpick.serve.integrations import annotation, candidate


class CtxPickCompressor(BaseDocumentCompressor):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    picker: Any  # a ctxpick Picker (in process) or PickerClient (the HTTP service)
    token_budget: int | None = None

    @staticmethod
    def _candidates(documents: Sequence[Document]) -> list[dict[str, Any]]:
        return [
            candidate(i, d.page_content, d.id, d.metadata.get("title"))
            for i, d in enumerate(documents)
        ]

    @staticmethod
    def _kept(documents: Sequence[Document], sel: Selection) -> list[Document]:
        return [
            documents[i].model_copy(update={"metadata": documents[i].metadata | annotation(sel)})
            for i in sel.indices
        ]

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        if not documents:
            return []
        sel = self.picker.pick(query, self._candidates(documents), self.token_budget)
        return self._kept(documents, sel)

    async def acompress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        if not documents:
            return []
        sel = await self.picker.apick(query, self._candidates(documents), self.token_budget)
        return self._kept(documents, sel)
