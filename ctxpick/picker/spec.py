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
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

from ctxpick.data.schema import Passage
from ctxpick.engines.base import Chat
from ctxpick.picker.examples import shown
from ctxpick.picker.format import FORMATS, OUTPUT_FORMAT, picker_chat

SPEC_FILE = "picker.json"


@dataclass(frozen=True)
class PickerSpec:
    instruction: str  # the system prompt, verbatim
    max_passages: int  # candidates shown (the first of a best-first pool)
    max_passage_words: int  # each passage cut to this many words
    max_tokens: int  # output budget
    output_format: str = OUTPUT_FORMAT

    def __post_init__(self) -> None:
        if not self.instruction.strip():
            raise ValueError("picker spec: empty instruction")
        if min(self.max_passages, self.max_passage_words, self.max_tokens) < 1:
            raise ValueError("picker spec: max_passages, max_passage_words, max_tokens >= 1")
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
        reports and audits."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

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
