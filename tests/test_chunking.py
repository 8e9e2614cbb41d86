import pytest
from conftest import SAMPLES

from ctxpick.data.loaders import load_examples
from ctxpick.data.schema import Document, Evidence, Example
from ctxpick.retrieval.chunking import Chunker, ChunkingConfig, sentence_spans, window_spans


@pytest.fixture(scope="module")
def hotpot():
    return load_examples(SAMPLES / "hotpotqa_distractor_30.jsonl", limit=6).examples


def _check_gold(item):
    """Every gold span lies inside (or overlaps) a gold passage and only gold passages do."""
    ex = item.example
    gold = set(item.gold_pids)
    for p in item.passages:
        overlaps = any(
            e.doc_index == p.doc_index and e.start < p.end and p.start < e.end for e in ex.evidence
        )
        assert (p.pid in gold) == overlaps
    for ev in ex.evidence:
        text = ex.documents[ev.doc_index].text[ev.start : ev.end]
        start = ev.start + len(text) - len(text.lstrip())
        end = ev.end - (len(text) - len(text.rstrip()))
        assert any(
            p.doc_index == ev.doc_index and p.start <= start and end <= p.end
            for p in item.passages
            if p.pid in gold
        )


def test_semantic_chunks_keep_gold_and_ids_are_stable(hotpot):
    cfg = ChunkingConfig(method="semantic", threshold=0.75)
    first = Chunker(cfg).chunk_all(hotpot)
    again = Chunker(cfg).chunk_all(hotpot)
    assert [p.pid for c in first for p in c.passages] == [p.pid for c in again for p in c.passages]
    n_docs = sum(len(ex.documents) for ex in hotpot)
    n_chunks = sum(len(c.passages) for c in first)
    assert n_chunks > n_docs  # paragraphs do get split at similarity drops
    for item in first:
        _check_gold(item)
        for p in item.passages:
            assert item.example.documents[p.doc_index].text[p.start : p.end] == p.text


def test_threshold_extremes(hotpot):
    ex = hotpot[:2]
    never = Chunker(ChunkingConfig(threshold=-1.0, max_words=10_000)).chunk_all(ex)
    always = Chunker(ChunkingConfig(threshold=1.0)).chunk_all(ex)
    assert sum(len(c.passages) for c in never) == sum(len(e.documents) for e in ex)
    assert sum(len(c.passages) for c in always) == sum(
        len(sentence_spans(d)) for e in ex for d in e.documents
    )


def test_window_chunker_and_gold_mapping():
    text = " ".join(f"w{i}" for i in range(25))
    spans = window_spans(text, 10, 2)
    assert [text[s:e].split()[0] for s, e in spans] == ["w0", "w8", "w16"]
    gold_start = text.index("w12")
    ex = Example(
        "e", "t", "q", ["a"], [Document("d0", text)], [Evidence(0, gold_start, gold_start + 3)]
    )
    item = Chunker(ChunkingConfig(method="window", window_words=10, overlap_words=2)).chunk(ex)
    assert item.gold_pids == ["e/d0/1"]


def test_none_chunker_shares_corpus_between_questions():
    res = load_examples(SAMPLES / "locomo10_conv26.json", limit=5)
    chunker = Chunker(ChunkingConfig(method="none"))
    items = chunker.chunk_all(res.examples)
    assert all(it.passages is items[0].passages for it in items)
    assert all(set(it.gold_pids) <= {p.pid for p in it.passages} for it in items if it.gold_pids)
    assert items[0].passages[0].pid == "conv-26/D1:1/0"


def test_bad_chunking_config():
    with pytest.raises(ValueError, match="chunking.method"):
        ChunkingConfig(method="paragraph")
    with pytest.raises(ValueError, match="overlap"):
        ChunkingConfig(window_words=10, overlap_words=10)
