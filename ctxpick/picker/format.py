"""The picker's output formats.

Input: an instruction (system), then the question and the candidate passages numbered
``[1]..[N]``. Output, strictly, in one of three formats (``picker.output``):

* ``rationale_ids`` (the paper's): ``<rationale>why</rationale><ids>[2, 5]</ids>``
* ``ids_rationale``: ``<ids>[2, 5]</ids><rationale>why</rationale>``: the decision comes first,
  so it is not conditioned on a rationale a small model writes badly, and its tokens are not
  a small tail of the sequence the loss averages over.
* ``ids``: ``<ids>[2, 5]</ids>``: no rationale (the paper's ablation).

Whitespace is allowed between and around the tags and nothing else. ``ids`` is a JSON list of
distinct integers in 1..N; an empty list is a valid (empty) selection. Anything else is invalid
and :func:`parse_pick` says exactly why, because the reward gives invalid outputs the format
penalty and the reason is logged.

Training's reward reads outputs strictly (:func:`parse_pick`). A caller reads them as
:func:`read_pick` does: an ids-first output that the token budget cut off inside its rationale
keeps its decision, which was complete before the cut. Bump :data:`READER_VERSION` when what a
caller reads changes, so evaluation does not reuse rows read the old way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ctxpick.data.schema import Passage
from ctxpick.engines.base import Chat
from ctxpick.engines.prompts import format_passages

_ORDER = {
    "rationale_ids": ("rationale", "ids"),
    "ids_rationale": ("ids", "rationale"),
    "ids": ("ids",),
}
_TEMPLATE = {"rationale": "<rationale>...</rationale>", "ids": "<ids>[...]</ids>"}
FORMATS = {name: "".join(_TEMPLATE[t] for t in order) for name, order in _ORDER.items()}
OUTPUT_FORMAT = FORMATS["rationale_ids"]
_TAG = {
    "rationale": r"<rationale>(?P<rationale>.*?)</rationale>",
    "ids": r"<ids>(?P<ids>.*?)</ids>",
}


READER_VERSION = 2  # 2: read_pick keeps an ids-first decision whose rationale was cut


@dataclass(frozen=True)
class Pick:
    rationale: str  # empty in the ids-only format
    ids: tuple[int, ...]  # 1-based positions in the pool shown to the picker, in output order
    cut: bool = False  # the rationale is unfinished (read_pick): the output ended inside it


class InvalidPick(ValueError):
    """``str(err)`` is the precise reason an output is not a valid pick."""


def _parts(fmt: str) -> tuple[str, ...]:
    """The tags of ``fmt`` (one of :data:`FORMATS`' values) in output order."""
    for name, order in _ORDER.items():
        if FORMATS[name] == fmt:
            return order
    raise ValueError(f"unknown picker output format {fmt!r} (known: {list(FORMATS.values())})")


def parse_pick(text: str, num_passages: int, fmt: str = OUTPUT_FORMAT) -> Pick:
    parts = _parts(fmt)
    for tag in parts:
        if f"<{tag}>" not in text or f"</{tag}>" not in text:
            raise InvalidPick(f"missing <{tag}>...</{tag}>")
    m = re.fullmatch(r"\s*" + r"\s*".join(_TAG[t] for t in parts) + r"\s*", text, re.DOTALL)
    if m is None:
        raise InvalidPick(f"text outside {fmt}, or tags out of order")
    rationale = m["rationale"].strip() if "rationale" in parts else ""
    if "rationale" in parts and not rationale:
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


def read_pick(
    text: str, num_passages: int, fmt: str = OUTPUT_FORMAT, truncated: bool = False
) -> Pick:
    """An output as a caller reads it: :func:`parse_pick`, except that an ids-first output
    (``ids_rationale``) that the token budget cut (``truncated``) inside its rationale, or its
    opening tag, is its complete ``<ids>`` decision with ``cut`` set. Only the rationale was
    lost: a small model's rationale can run past the budget (copying a passage), and sending
    the fallback instead would discard the decision it made first. Any other defect, an
    output that stopped on its own unclosed included, stays invalid."""
    try:
        return parse_pick(text, num_passages, fmt)
    except InvalidPick:
        m = re.fullmatch(r"\s*<ids>(.*?)</ids>\s*(.*)", text, re.DOTALL)
        if not truncated or fmt != FORMATS["ids_rationale"] or m is None:
            raise
        rest, tag = m[2], "<rationale>"
        if not (tag.startswith(rest) or (rest.startswith(tag) and "</rationale>" not in rest)):
            raise
    ids = parse_pick(f"<ids>{m[1]}</ids>", num_passages, FORMATS["ids"]).ids
    rationale = rest[len(tag) :]
    closing = "</rationale>"  # cut before it ended: drop the part of it that was written
    ends = [k for k in range(1, len(closing)) if rationale.endswith(closing[:k])]
    rationale = rationale[: len(rationale) - max(ends, default=0)]
    return Pick(rationale.strip(), ids, cut=True)


def render_pick(pick: Pick, fmt: str = OUTPUT_FORMAT) -> str:
    text = {
        "rationale": f"<rationale>{pick.rationale}</rationale>",
        "ids": f"<ids>{json.dumps(list(pick.ids))}</ids>",
    }
    return "".join(text[t] for t in _parts(fmt))


def picker_chat(instruction: str, question: str, passages: Sequence[Passage]) -> Chat:
    return [
        {"role": "system", "content": instruction},
        {
            "role": "user",
            "content": f"Question: {question}\n\nPassages:\n{format_passages(passages)}",
        },
    ]


def output_regex(
    num_passages: int, fmt: str = OUTPUT_FORMAT, max_rationale_chars: int = 400
) -> str:
    """The output format as a regex for vLLM's structured outputs: constrained decoding can
    then only produce parseable picks, with ids in ascending order (how the warm start writes
    them), so a list cannot repeat an id, leave the pool or run on: it holds at most
    ``num_passages`` ids. Its size grows as ``num_passages`` squared (each first id, then each
    later one optional), not with the 2**N sets it allows."""
    ascending = "|".join(
        str(first) + "".join(f"(, {i})?" for i in range(first + 1, num_passages + 1))
        for first in range(1, num_passages + 1)
    )
    text = {
        "rationale": rf"<rationale>[^<]{{1,{max_rationale_chars}}}</rationale>",
        "ids": rf"<ids>\[({ascending})?\]</ids>",
    }
    return "".join(text[t] for t in _parts(fmt))
