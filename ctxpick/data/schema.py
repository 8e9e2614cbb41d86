"""The one data schema every loader produces and every later stage consumes.

A loader yields :class:`Example` records made of raw :class:`Document` units (a paragraph, a
dialogue turn, a long article) and gold :class:`Evidence` as character spans inside those
documents. Chunking turns documents into :class:`Passage` objects; gold evidence then maps onto
the passages whose span overlaps it, so evidence survives any chunking.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Document:
    """One source unit as the dataset gives it."""

    doc_id: str
    text: str
    title: str = ""
    # Character offsets of sentence starts when the dataset provides the segmentation
    # (HotpotQA, 2Wiki); chunkers prefer them over re-splitting.
    sentence_starts: tuple[int, ...] = ()


@dataclass(frozen=True)
class Evidence:
    """A gold-evidence span: characters [start, end) of documents[doc_index]."""

    doc_index: int
    start: int
    end: int


@dataclass
class Example:
    id: str
    dataset: str
    question: str
    answers: list[str]
    documents: list[Document]
    # None: the dataset has no evidence annotation for this example.
    evidence: list[Evidence] | None
    # How many gold units the dataset annotates, and how many of them resolved to the context
    # (HotpotQA fullwiki often lists supporting pages that were not retrieved).
    gold_units: int = 0
    gold_resolved: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    # Examples that share documents (LoCoMo: every question about one conversation) share a
    # corpus id, so chunking and indexing happen once per corpus and passage ids agree.
    corpus_id: str = ""

    def __post_init__(self) -> None:
        if not self.corpus_id:
            self.corpus_id = self.id

    @property
    def gold_complete(self) -> bool:
        return (
            self.evidence is not None
            and self.gold_units > 0
            and (self.gold_resolved == self.gold_units)
        )


@dataclass(frozen=True)
class Passage:
    """A chunk of a document: the unit a pool holds and a picker selects."""

    pid: str
    doc_index: int
    start: int
    end: int
    text: str
    title: str = ""


@dataclass
class ChunkedExample:
    example: Example
    passages: list[Passage]
    gold_pids: list[str] | None


@dataclass
class Pool:
    """Candidate passages for one question, best first."""

    example_id: str
    dataset: str
    question: str
    answers: list[str]
    passages: list[Passage]
    scores: list[float]
    gold_pids: list[str] | None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def gold_recall(self) -> float | None:
        """Fraction of the example's gold passages that made it into this pool."""
        if not self.gold_pids:
            return None
        present = {p.pid for p in self.passages}
        return sum(pid in present for pid in self.gold_pids) / len(self.gold_pids)
