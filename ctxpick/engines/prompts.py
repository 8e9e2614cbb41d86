"""Chat prompts the generator answers from."""

from __future__ import annotations

from collections.abc import Sequence

from ctxpick.data.schema import Passage
from ctxpick.engines.base import Chat

DEFAULT_ANSWER_SYSTEM = (
    "Answer the question using only the numbered passages. Reply with the answer alone, in as "
    "few words as possible, with no explanation. If the passages do not contain the answer, "
    "reply: not mentioned."
)


def format_passages(passages: Sequence[Passage]) -> str:
    lines = []
    for i, p in enumerate(passages, 1):
        title = f"({p.title}) " if p.title else ""
        lines.append(f"[{i}] {title}{p.text}")
    return "\n".join(lines)


def answer_chat(question: str, passages: Sequence[Passage], system: str = "") -> Chat:
    context = format_passages(passages) if passages else "(no passages)"
    return [
        {"role": "system", "content": system or DEFAULT_ANSWER_SYSTEM},
        {"role": "user", "content": f"Passages:\n{context}\n\nQuestion: {question}\nAnswer:"},
    ]
