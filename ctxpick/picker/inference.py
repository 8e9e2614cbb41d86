"""Picker inference: one batched engine call picks evidence for many questions.

A picker is loaded from its model folder: the weights and ``picker.json``, the prompt and
passage cut it was trained with (:mod:`ctxpick.picker.spec`). An output that fails to parse
falls back to every passage shown to the picker: a picker that cannot decide must not starve
the generator. The fallback is counted, never hidden.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ctxpick.data.schema import Passage
from ctxpick.engines.base import Chat, Engine, SamplingConfig
from ctxpick.picker.format import InvalidPick, parse_pick
from ctxpick.picker.spec import PickerSpec


@dataclass(frozen=True)
class PickResult:
    passages: list[Passage]  # the selected passages, full text, in the order picked
    text: str  # the picker's raw output
    rationale: str
    valid: bool
    reason: str = ""  # why the output was invalid
    ids: tuple[int, ...] | None = None  # 1-based positions picked among those shown


class Picker:
    def __init__(self, engine: Engine, spec: PickerSpec) -> None:
        self.engine, self.spec = engine, spec

    @classmethod
    def from_folder(cls, folder: str | Path, engine: Engine) -> Picker:
        """The one way to load a trained picker: ``engine`` serves the folder's weights."""
        return cls(engine, PickerSpec.load(folder))

    def chats(self, questions: Sequence[str], pools: Sequence[Sequence[Passage]]) -> list[Chat]:
        return [self.spec.chat(q, ps) for q, ps in zip(questions, pools, strict=True)]

    def pick(
        self, questions: Sequence[str], pools: Sequence[Sequence[Passage]]
    ) -> list[PickResult]:
        """``pools[i]`` best first; the picker sees its first ``max_passages``, cut to
        ``max_passage_words`` words each, and returns full passages."""
        outs = self.engine.generate(
            self.chats(questions, pools),
            SamplingConfig(temperature=0.0, max_tokens=self.spec.max_tokens),
        )
        results = []
        for out, pool in zip(outs, pools, strict=True):
            ps, text = list(pool[: self.spec.max_passages]), out[0].text
            try:
                pick = parse_pick(text, len(ps), self.spec.output_format)
            except InvalidPick as err:
                results.append(PickResult(ps, text, "", False, str(err)))
                continue
            chosen = [ps[i - 1] for i in pick.ids]
            results.append(PickResult(chosen, text, pick.rationale, True, ids=pick.ids))
        return results
