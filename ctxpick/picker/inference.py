"""Picker inference: one batched engine call picks evidence for many questions.

An output that fails to parse falls back to every passage shown to the picker: a picker that
cannot decide must not starve the generator. The fallback is counted, never hidden.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ctxpick.data.schema import Passage
from ctxpick.engines.base import Engine, SamplingConfig
from ctxpick.picker.examples import shown
from ctxpick.picker.format import InvalidPick, parse_pick, picker_chat


@dataclass(frozen=True)
class PickResult:
    passages: list[Passage]  # the selected passages, full text, in the order picked
    text: str  # the picker's raw output
    rationale: str
    valid: bool
    reason: str = ""  # why the output was invalid


class Picker:
    def __init__(
        self,
        engine: Engine,
        instruction: str,
        max_passages: int = 10,
        max_passage_words: int = 80,
        max_tokens: int = 96,
    ) -> None:
        self.engine, self.instruction = engine, instruction
        self.max_passages, self.max_words, self.max_tokens = (
            max_passages,
            max_passage_words,
            max_tokens,
        )

    def pick(
        self, questions: Sequence[str], pools: Sequence[Sequence[Passage]]
    ) -> list[PickResult]:
        """``pools[i]`` best first; the picker sees its first ``max_passages``, cut to
        ``max_passage_words`` words each, and returns full passages."""
        visible = [list(p[: self.max_passages]) for p in pools]
        chats = [
            picker_chat(
                self.instruction,
                q,
                [shown(p, self.max_words) for p in ps],
            )
            for q, ps in zip(questions, visible, strict=True)
        ]
        outs = self.engine.generate(
            chats, SamplingConfig(temperature=0.0, max_tokens=self.max_tokens)
        )
        results = []
        for out, ps in zip(outs, visible, strict=True):
            text = out[0].text
            try:
                pick = parse_pick(text, len(ps))
            except InvalidPick as err:
                results.append(PickResult(ps, text, "", False, str(err)))
                continue
            results.append(PickResult([ps[i - 1] for i in pick.ids], text, pick.rationale, True))
        return results
