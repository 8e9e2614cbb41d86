"""A LlamaIndex node postprocessor: ``index.as_query_engine(node_postprocessors=
[CtxPickPostprocessor(picker=...)])`` answers from the picked nodes."""

from __future__ import annotations

from typing import Any

from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
from pydantic import Field

from ctxpick.picker.selection import Selection
from ctxpick.serve.integrations import annotation, candidate


class CtxPickPostprocessor(BaseNodePostprocessor):
    """Returns copies of the picked nodes, annotated with the decision. The annotation is kept
    out of the text the LLM and the embedder read unless ``show_decision``: a rationale in
    the generator's context would be read as evidence."""

    picker: Any = Field(exclude=True, description="a ctxpick Picker or PickerClient")
    token_budget: int | None = None
    show_decision: bool = False

    @classmethod
    def class_name(cls) -> str:
        return "CtxPickPostprocessor"

    @staticmethod
    def _query(query_bundle: QueryBundle | None) -> str:
        if query_bundle is None:
            raise ValueError("CtxPickPostprocessor needs the query (query_bundle or query_str)")
        return query_bundle.query_str

    @staticmethod
    def _candidates(nodes: list[NodeWithScore]) -> list[dict[str, Any]]:
        return [
            candidate(
                i,
                n.node.get_content(MetadataMode.NONE),
                n.node.node_id,
                n.node.metadata.get("title"),
            )
            for i, n in enumerate(nodes)
        ]

    def _kept(self, nodes: list[NodeWithScore], sel: Selection) -> list[NodeWithScore]:
        notes = annotation(sel)
        hidden = [] if self.show_decision else list(notes)
        out = []
        for i in sel.indices:
            node = nodes[i].node
            copy = node.model_copy(
                update={
                    "metadata": node.metadata | notes,
                    "excluded_llm_metadata_keys": [*node.excluded_llm_metadata_keys, *hidden],
                    "excluded_embed_metadata_keys": [*node.excluded_embed_metadata_keys, *hidden],
                }
            )
            out.append(nodes[i].model_copy(update={"node": copy}))
        return out

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if not nodes:
            return []
        sel = self.picker.pick(
            self._query(query_bundle), self._candidates(nodes), self.token_budget
        )
        return self._kept(nodes, sel)

    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if not nodes:
            return []
        query = self._query(query_bundle)
        sel = await self.picker.apick(query, self._candidates(nodes), self.token_budget)
        return self._kept(nodes, sel)
