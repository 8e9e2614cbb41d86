"""A deterministic fake generator for pure algorithm tests (mining strategies): it reads which
passages the prompt holds and answers correctly iff one of the hidden sufficient sets is among
them. Real-engine tests cover the same code paths with vLLM."""

from __future__ import annotations

import re

from ctxpick.data.schema import Passage, Pool
from ctxpick.engines.base import Chat, Completion, SamplingConfig

_FACT = re.compile(r"FACT(\d+)\b")


class FakeGenerator:
    def __init__(self, sufficient: list[set[int]], answer: str = "Paris") -> None:
        self.sufficient = sufficient
        self.answer = answer
        self.prompts = 0

    def generate(self, chats: list[Chat], sampling: SamplingConfig) -> list[list[Completion]]:
        out = []
        for chat in chats:
            self.prompts += 1
            present = {int(m) for m in _FACT.findall(chat[-1]["content"])}
            ok = any(s <= present for s in self.sufficient)
            text = self.answer if ok else "not mentioned"
            out.append([Completion(text, [], len(chat[-1]["content"]))])
        return out


def fake_pool(n: int, example_id: str = "ex") -> Pool:
    passages = [Passage(f"{example_id}/d{i}/0", i, 0, 10, f"FACT{i} filler") for i in range(n)]
    return Pool(
        example_id,
        "fake",
        "Capital of France?",
        ["Paris"],
        passages,
        [float(n - i) for i in range(n)],
        None,
    )
