"""What a pick sends: the candidates a caller hands in, the selection it gets back, the token
budget that caps it and the fallback policy that decides when the picker does not. Serving,
evaluation and the framework components all build selections here, so they cannot drift."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxpick.data.schema import Passage
from ctxpick.engines.prompts import format_passages

FALLBACKS = ("top_k", "all")

# What a caller may hand in as a candidate: plain text, or a record with ``text`` and
# optional ``id`` / ``title`` (a retriever's hit).
Candidate = str | Mapping[str, Any]


@dataclass(frozen=True)
class Selection:
    """What :meth:`Picker.pick` decided for one question."""

    ids: list[str | int]  # the kept candidates' ids (their 0-based position if they had none)
    indices: list[int]  # their 0-based positions in the request: retriever order
    passages: list[Candidate]  # the kept candidates as given, in retriever order
    rationale: str
    tokens_in: int  # tokens of every candidate (picker tokenizer)
    tokens_kept: int  # tokens of the kept ones
    valid: bool  # the picker's output parsed
    fallback: str | None  # why the fallback policy chose instead of the picker (None: it did)
    budget_cut: bool  # ``token_budget`` dropped picked passages (the last ones in order)
    latency_ms: float  # the engine call this question was part of
    output: str = ""  # the picker's raw output
    batch_size: int = 1  # questions in that engine call
    # max_tokens cut the picker's rationale; the decision written before it is kept
    rationale_cut: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def apply_budget(
    passages: list[Passage], budget: int | None, count: Callable[[Passage], int]
) -> tuple[list[Passage], bool]:
    """Keep passages in order while their tokens fit in ``budget``; True if any was cut."""
    if budget is None:
        return passages, False
    kept, used = [], 0
    for p in passages:
        n = count(p)
        if used + n > budget:
            return kept, True
        kept.append(p)
        used += n
    return kept, False


def caller_id(candidate: Candidate, index: int) -> str | int:
    """A candidate's id as its caller knows it: its own, else its 0-based position."""
    own = None if isinstance(candidate, str) else candidate.get("id")
    return index if own is None else own


def as_passages(candidates: Sequence[Candidate]) -> list[Passage]:
    """Candidates as passages whose ``doc_index`` is their position in the request."""
    if not candidates:
        raise ValueError("passages: empty list (nothing to pick from)")
    out = []
    for i, c in enumerate(candidates):
        if isinstance(c, str):
            out.append(Passage(str(i), i, 0, len(c), c))
            continue
        if not isinstance(c, Mapping) or not isinstance(c.get("text"), str):
            raise ValueError(f"passages[{i}]: expected a string or a mapping with a 'text' string")
        title = c.get("title") or ""
        if not isinstance(title, str):
            raise ValueError(f"passages[{i}].title: expected a string")
        out.append(Passage(str(caller_id(c, i)), i, 0, len(c["text"]), c["text"], title))
    return out


def select_within_budget(
    candidates: Sequence[Candidate],
    chosen: Sequence[Passage],
    sizes: Sequence[int],
    budget: int | None,
    **decision: Any,
) -> Selection:
    """``chosen`` (retriever order) within ``budget``, as the caller knows its candidates."""
    kept, cut = apply_budget(list(chosen), budget, lambda p: sizes[p.doc_index])
    return Selection(
        ids=[caller_id(candidates[p.doc_index], p.doc_index) for p in kept],
        indices=[p.doc_index for p in kept],
        passages=[candidates[p.doc_index] for p in kept],
        tokens_in=sum(sizes),
        tokens_kept=sum(sizes[p.doc_index] for p in kept),
        budget_cut=cut,
        **decision,
    )


def fallback_passages(pool: Sequence[Passage], policy: str, k: int) -> list[Passage]:
    """What the fallback ``policy`` keeps of a pool in retriever order: its top ``k``, or
    all of it. The one place the policy is applied, for serving and evaluation alike."""
    return list(pool[:k] if policy == "top_k" else pool)


def fallback_selection(
    candidates: Sequence[Candidate],
    sizes: Sequence[int],
    budget: int | None,
    policy: str,
    k: int,
    reason: str,
    latency_ms: float = 0.0,
    batch_size: int = 0,
) -> Selection:
    """What the fallback ``policy`` keeps of the retriever order when the picker did not
    decide; ``reason`` says why (``batch_size`` 0: no engine call answered)."""
    return select_within_budget(
        candidates,
        fallback_passages(as_passages(candidates), policy, k),
        sizes,
        budget,
        rationale="",
        valid=False,
        fallback=reason,
        latency_ms=latency_ms,
        batch_size=batch_size,
    )


def token_counter(tokenizer: Any) -> Callable[[str], int]:
    """Tokens of a text under the picker's own tokenizer (or the one in the folder given)."""
    if isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def passage_tokens(count_tokens: Callable[[str], int], passages: Sequence[Passage]) -> list[int]:
    """Each passage's tokens as the generator reads it (its context line)."""
    return [count_tokens(format_passages([p])) for p in passages]
