"""The picker's one input/output format.

Input: an instruction (system), then the question and the candidate passages numbered
``[1]..[N]``. Output, strictly::

    <rationale>why these passages are needed</rationale><ids>[2, 5]</ids>

Whitespace is allowed between and around the two tags and nothing else. ``ids`` is a JSON list
of distinct integers in 1..N; an empty list is a valid (empty) selection. Anything else is
invalid and :func:`parse_pick` says exactly why, because the reward gives invalid outputs the
format penalty and the reason is logged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ctxpick.data.schema import Passage
from ctxpick.engines.base import Chat
from ctxpick.engines.prompts import format_passages

OUTPUT_FORMAT = "<rationale>...</rationale><ids>[...]</ids>"

_PICK_RE = re.compile(
    r"\s*<rationale>(?P<rationale>.*?)</rationale>\s*<ids>(?P<ids>.*?)</ids>\s*", re.DOTALL
)


@dataclass(frozen=True)
class Pick:
    rationale: str
    ids: tuple[int, ...]  # 1-based positions in the pool shown to the picker, in output order


class InvalidPick(ValueError):
    """``str(err)`` is the precise reason an output is not a valid pick."""


def parse_pick(text: str, num_passages: int) -> Pick:
    if "<rationale>" not in text or "</rationale>" not in text:
        raise InvalidPick("missing <rationale>...</rationale>")
    if "<ids>" not in text or "</ids>" not in text:
        raise InvalidPick("missing <ids>[...]</ids>")
    m = _PICK_RE.fullmatch(text)
    if m is None:
        raise InvalidPick(
            "text outside <rationale>...</rationale><ids>[...]</ids>, or tags out of order"
        )
    rationale = m["rationale"].strip()
    if not rationale:
        raise InvalidPick("empty rationale")
    try:
        raw = json.loads(m["ids"])
    except json.JSONDecodeError:
        raise InvalidPick(f"ids are not a JSON list: {m['ids'].strip()!r}") from None
    if not isinstance(raw, list):
        raise InvalidPick(f"ids are not a JSON list: {m['ids'].strip()!r}")
    seen: list[int] = []
    for v in raw:
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidPick(f"non-integer id {v!r}")
        if not 1 <= v <= num_passages:
            raise InvalidPick(f"id {v} out of range 1..{num_passages}")
        if v in seen:
            raise InvalidPick(f"duplicate id {v}")
        seen.append(v)
    return Pick(rationale, tuple(seen))


def render_pick(pick: Pick) -> str:
    return f"<rationale>{pick.rationale}</rationale><ids>{json.dumps(list(pick.ids))}</ids>"


def picker_chat(instruction: str, question: str, passages: Sequence[Passage]) -> Chat:
    return [
        {"role": "system", "content": instruction},
        {
            "role": "user",
            "content": f"Question: {question}\n\nPassages:\n{format_passages(passages)}",
        },
    ]


def output_regex(num_passages: int, max_rationale_chars: int = 400) -> str:
    """The output format as a regex for vLLM's structured outputs: constrained decoding can
    then only produce parseable picks (ids may still repeat; the parser catches that)."""
    digit = "|".join(str(i) for i in range(num_passages, 0, -1))
    ids = rf"\[(({digit})(, ({digit}))*)?\]"
    return rf"<rationale>[^<]{{1,{max_rationale_chars}}}</rationale><ids>{ids}</ids>"
