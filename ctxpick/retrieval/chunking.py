"""Chunk documents into passages and map gold evidence onto them.

``semantic`` follows the paper: split a document between adjacent sentences whose embedding
cosine similarity falls below ``threshold``. ``window`` cuts fixed windows of words. ``none``
keeps each document unit (paragraph, dialogue turn) as one passage. Passage ids are
``<corpus>/<doc>/<n>``: a pure function of the data and the chunking config, so they are the
same on every run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ctxpick.data.schema import ChunkedExample, Document, Example, Passage

Span = tuple[int, int]
_SENT_END = re.compile(r"(?<=[.!?。！？])[\"')\]]*\s+|\n\s*\n")
_WORD = re.compile(r"\S+")


@dataclass
class ChunkingConfig:
    method: str = "semantic"  # semantic | window | none
    threshold: float = 0.75
    max_words: int = 200  # a semantic chunk is also cut once it grows past this
    window_words: int = 128
    overlap_words: int = 0
    embedder: str = "all-minilm-l6-v2"

    def __post_init__(self) -> None:
        if self.method not in ("semantic", "window", "none"):
            raise ValueError(
                f"chunking.method must be semantic, window or none, not {self.method!r}"
            )
        if not -1.0 <= self.threshold <= 1.0:
            raise ValueError(
                f"chunking.threshold must be a cosine in [-1, 1], got {self.threshold}"
            )
        if self.window_words <= 0 or not 0 <= self.overlap_words < self.window_words:
            raise ValueError(
                "chunking needs window_words > 0 and 0 <= overlap_words < window_words"
            )
        if self.max_words <= 0:
            raise ValueError("chunking.max_words must be positive")


def sentence_spans(doc: Document) -> list[Span]:
    """Sentences as character spans: the dataset's own segmentation when it has one."""
    if doc.sentence_starts:
        ends = list(doc.sentence_starts[1:]) + [len(doc.text)]
        spans = list(zip(doc.sentence_starts, ends, strict=True))
    else:
        spans, start = [], 0
        for m in _SENT_END.finditer(doc.text):
            spans.append((start, m.end()))
            start = m.end()
        spans.append((start, len(doc.text)))
    return [(s, e) for s, e in spans if doc.text[s:e].strip()]


def window_spans(text: str, size: int, overlap: int) -> list[Span]:
    words = [m.span() for m in _WORD.finditer(text)]
    if not words:
        return []
    spans, step = [], size - overlap
    for i in range(0, len(words), step):
        chunk = words[i : i + size]
        spans.append((chunk[0][0], chunk[-1][1]))
        if i + size >= len(words):
            break
    return spans


class Chunker:
    def __init__(self, cfg: ChunkingConfig) -> None:
        self.cfg = cfg
        self._embedder = None
        # LoCoMo asks hundreds of questions over one conversation: chunk each corpus once.
        self._cache: dict[str, list[Passage]] = {}

    def _embed(self, sentences: list[str]) -> np.ndarray:
        from ctxpick.retrieval.embed import encode, load_embedder

        if self._embedder is None:
            self._embedder = load_embedder(self.cfg.embedder)
        return encode(self._embedder, sentences)

    def _semantic_spans(self, docs: list[Document]) -> list[list[Span]]:
        sents = [sentence_spans(d) for d in docs]
        texts = [d.text[s:e] for d, spans in zip(docs, sents, strict=True) for s, e in spans]
        emb = self._embed(texts) if texts else np.zeros((0, 1))
        out, pos = [], 0
        for doc, spans in zip(docs, sents, strict=True):
            vecs = emb[pos : pos + len(spans)]
            pos += len(spans)
            chunks: list[Span] = []
            for i, (s, e) in enumerate(spans):
                if chunks:
                    cur = chunks[-1]
                    similar = float(vecs[i - 1] @ vecs[i]) >= self.cfg.threshold
                    words = len(doc.text[cur[0] : e].split())
                    if similar and words <= self.cfg.max_words:
                        chunks[-1] = (cur[0], e)
                        continue
                chunks.append((s, e))
            out.append(chunks)
        return out

    def _spans(self, docs: list[Document]) -> list[list[Span]]:
        if self.cfg.method == "none":
            return [[(0, len(d.text))] if d.text.strip() else [] for d in docs]
        if self.cfg.method == "window":
            return [
                window_spans(d.text, self.cfg.window_words, self.cfg.overlap_words) for d in docs
            ]
        return self._semantic_spans(docs)

    def passages(self, corpus_id: str, docs: list[Document]) -> list[Passage]:
        if corpus_id not in self._cache:
            self._cache[corpus_id] = self._build(corpus_id, docs, self._spans(docs))
        return self._cache[corpus_id]

    def chunk(self, example: Example) -> ChunkedExample:
        passages = self.passages(example.corpus_id, example.documents)
        return ChunkedExample(example, passages, gold_passages(example, passages))

    def chunk_all(self, examples: Iterable[Example]) -> list[ChunkedExample]:
        examples = list(examples)
        # Embed every uncached corpus in one batch: far faster than one encode call per example.
        if self.cfg.method == "semantic":
            todo = {
                ex.corpus_id: ex.documents for ex in examples if ex.corpus_id not in self._cache
            }
            if todo:
                ids = list(todo)
                all_docs = [d for cid in ids for d in todo[cid]]
                spans = self._semantic_spans(all_docs)
                pos = 0
                for cid in ids:
                    n = len(todo[cid])
                    self._cache[cid] = self._build(cid, todo[cid], spans[pos : pos + n])
                    pos += n
        return [self.chunk(ex) for ex in examples]

    @staticmethod
    def _build(corpus_id: str, docs: list[Document], spans: list[list[Span]]) -> list[Passage]:
        out = []
        for di, (doc, doc_spans) in enumerate(zip(docs, spans, strict=True)):
            for n, (s, e) in enumerate(doc_spans):
                # Strip surrounding whitespace but keep offsets pointing into the document.
                raw = doc.text[s:e]
                s += len(raw) - len(raw.lstrip())
                e -= len(raw) - len(raw.rstrip())
                out.append(
                    Passage(f"{corpus_id}/{doc.doc_id}/{n}", di, s, e, doc.text[s:e], doc.title)
                )
        return out


def gold_passages(example: Example, passages: list[Passage]) -> list[str] | None:
    """Passages whose span overlaps any gold evidence span, in passage order."""
    if example.evidence is None:
        return None
    gold = []
    for p in passages:
        if any(
            ev.doc_index == p.doc_index and ev.start < p.end and p.start < ev.end
            for ev in example.evidence
        ):
            gold.append(p.pid)
    return gold
