"""What a trained picker was trained with, saved beside its weights as ``picker.json``.

A picker is only as good as the match between the prompt it was trained on and the prompt it
is asked with. Training writes the exact system prompt, output format and passage-cut settings
into the model folder; inference, evaluation and serving read them from there and never from
the current config, so a changed ``picker.instruction`` cannot silently change a trained
picker's input.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from ctxpick.data.schema import Passage
from ctxpick.engines.base import Chat
from ctxpick.paths import CONF_DIR
from ctxpick.picker.examples import shown
from ctxpick.picker.format import FORMATS, OUTPUT_FORMAT, picker_chat

SPEC_FILE = "picker.json"
# What defines the order and the passages a picker reads (``retrieval.pool`` and
# ``retrieval.chunking``); ``k`` is recorded but not checked: the picker reads only its first
# ``max_passages`` of any pool.
ORDER_KEYS = ("retriever", "embedder", "reranker", "query", "chunking")


def pool_settings(pool: Any, chunking: Any, order: str = "pool") -> dict[str, Any]:
    """A pool as ``picker.json`` records it, from ``retrieval.pool`` / ``retrieval.chunking``
    (dataclasses or mappings); ``order``: ``pool`` (trained in the retriever's order) or
    ``shuffle``. Settings that do not shape this pool's order are recorded as None, so a
    difference there is no mismatch."""
    pool, chunking = _plain(pool), _plain(chunking)
    crossenc = pool["retriever"] == "crossenc"
    first = pool["rerank_first_stage"] if crossenc else pool["retriever"]
    return {
        "retriever": pool["retriever"],
        "embedder": pool["embedder"] if first == "dense" else None,
        "reranker": (f"{pool['reranker']} over {first}@{pool['rerank_n']}" if crossenc else None),
        "query": pool["query"],
        "k": pool["k"],
        "chunking": chunking,
        "order": order,
    }


def _plain(settings: Any) -> dict[str, Any]:
    return asdict(settings) if is_dataclass(settings) else dict(settings)


@dataclass(frozen=True)
class PickerSpec:
    instruction: str  # the system prompt, verbatim
    max_passages: int  # candidates shown (the first of a best-first pool)
    max_passage_words: int  # each passage cut to this many words
    max_tokens: int  # output budget
    output_format: str = OUTPUT_FORMAT
    # The candidate pool it was trained on (:func:`pool_settings`): the order it learnt to
    # read. None: not recorded (an untrained base model, or a picker from before issue 18).
    pool: dict[str, Any] | None = None
    # Decode constrained to the output format (:func:`~ctxpick.picker.format.output_regex`):
    # as its rollouts were, or as chosen on validation when it ships.
    constrained: bool = False

    def __post_init__(self) -> None:
        if not self.instruction.strip():
            raise ValueError("picker spec: empty instruction")
        if min(self.max_passages, self.max_passage_words, self.max_tokens) < 1:
            raise ValueError("picker spec: max_passages, max_passage_words, max_tokens >= 1")
        if not isinstance(self.constrained, bool):
            raise ValueError(f"picker spec: constrained is {self.constrained!r}, not true/false")
        if self.output_format not in FORMATS.values():
            raise ValueError(
                f"picker spec: output format {self.output_format!r} is not one this version "
                f"parses ({list(FORMATS.values())})"
            )

    def chat(self, question: str, passages: Sequence[Passage]) -> Chat:
        """The picker's prompt for a best-first pool: training and inference both build it
        here, from passages cut the same way."""
        visible = [shown(p, self.max_passage_words) for p in passages[: self.max_passages]]
        return picker_chat(self.instruction, question, visible)

    @property
    def version(self) -> str:
        """A digest of everything ``picker.json`` fixes: the prompt version that serving
        reports and audits. ``constrained`` counts only when set, so the pickers recorded
        before it existed keep their version."""
        fixed = asdict(self)
        if not self.constrained:
            del fixed["constrained"]
        return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:12]

    @classmethod
    def from_settings(
        cls, picker: Mapping[str, Any], pool: Mapping[str, Any] | None = None
    ) -> PickerSpec:
        """The spec of picker settings as ``conf/picker`` and ``picker.*`` hold them."""
        return cls(
            picker["instruction"],
            picker["max_passages"],
            picker["max_passage_words"],
            picker["max_tokens"],
            FORMATS[picker.get("output", "rationale_ids")],
            dict(pool) if pool is not None else None,
            bool(picker.get("constrained", False)),
        )

    @classmethod
    def builtin(cls, alias: str) -> PickerSpec:
        """The prompt a built-in base model trains with (``conf/picker/<alias>.yaml``)."""
        from omegaconf import OmegaConf

        path = CONF_DIR / "picker" / f"{alias}.yaml"
        if not path.exists():
            path = CONF_DIR / "picker" / "smollm2-135m.yaml"  # the default picker group
        return cls.from_settings(OmegaConf.to_container(OmegaConf.load(path)))

    def pool_mismatch(self, pool: Mapping[str, Any]) -> list[str]:
        """Where candidates ranked by ``pool`` (:func:`pool_settings`) differ from the pool this
        picker was trained on, as ``key: trained -> given``; empty when they agree or the
        picker records none. A picker trained on shuffled pools reads no order, so only the
        chunking counts for it."""
        if self.pool is None:
            return []
        keys = ["chunking"] if self.pool.get("order") == "shuffle" else list(ORDER_KEYS)
        return [
            f"{key}: {self.pool.get(key)!r} -> {pool.get(key)!r}"
            for key in keys
            if self.pool.get(key) != pool.get(key)
        ]

    def save(self, folder: str | Path) -> Path:
        path = Path(folder) / SPEC_FILE
        path.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, folder: str | Path) -> PickerSpec:
        path = Path(folder) / SPEC_FILE
        if not path.exists():
            raise FileNotFoundError(
                f"{path} is missing: {folder} is not a trained picker (a stage's final/ carries "
                "the prompt and settings it was trained with)"
            )
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not JSON ({err})") from None
        known = {f.name for f in fields(cls)}
        required = {f.name for f in fields(cls) if f.default is MISSING}
        unknown, missing = set(raw) - known, required - set(raw)
        if unknown or missing:
            raise ValueError(
                f"{path}: unknown fields {sorted(unknown)}, missing fields {sorted(missing)}"
            )
        try:
            return cls(**raw)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: {err}") from None
