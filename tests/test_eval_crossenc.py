"""The baselines users deploy instead of a picker (a cross-encoder's top-K and score cut), the
matched-size rows that separate a picker's reading from its sizing, and each picker read on
the pool it was trained on (or refused where this evaluation cannot rank it so)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import SAMPLES

from ctxpick.config import ConfigError, compose, picker_spec
from ctxpick.engines.base import Completion
from ctxpick.eval import methods as M
from ctxpick.eval.harness import all_labels, report_header, retrieve, select
from ctxpick.eval.picking import picker_rankings, picks_as_served
from ctxpick.eval.records import fingerprint
from ctxpick.eval.report import paired_table
from ctxpick.picker.inference import Picker
from ctxpick.picker.spec import PickerSpec


def _cfg(tmp_path, *extra):
    cfg = compose(
        [
            f"output_dir={tmp_path}",
            "retrieval.chunking.method=window",
            "retrieval.pool.k=6",
            "retrieval.pool.rerank_n=8",
            "eval.methods=[bm25,dense,crossenc,crossenc_threshold,picker,matched]",
            "eval.topk=[2]",
            "eval.crossenc_threshold=0.0",
            *extra,
        ]
    )
    cfg.data.sources = [
        type(cfg.data.sources[0])(str(SAMPLES / "hotpotqa_distractor_30.jsonl"), "hotpotqa", 4)
    ]
    return cfg


def _trained_folder(path, cfg):
    path.mkdir()
    (path / "config.json").write_text("{}")
    picker_spec(cfg).save(path)
    return str(path)


def test_cross_encoder_rows_and_a_pickers_matched_rows(tmp_path):
    cfg = _cfg(tmp_path)
    cfg.eval.pickers = {"p": _trained_folder(tmp_path / "p", cfg)}
    items = retrieve(cfg)
    sizes = [1, 3, 2, 4]
    rows = [{"pick_ids": list(range(1, n + 1))} for n in sizes]
    sel = select(cfg, items, recorded=lambda label: rows if label == "picker:p" else None)
    assert {lb for lb in all_labels(cfg, items) if M.matched_picker(lb)} == {
        "bm25@size:p",
        "dense@size:p",
        "crossenc@size:p",
    }
    for r, n, i in zip(items, sizes, range(len(items)), strict=True):
        cross, first = r.crossenc, np.argsort(-r.dense, kind="stable")
        read, rest = first[:8], first[8:]  # the first stage's top rerank_n, and the rest
        order = np.argsort(-cross, kind="stable")
        # the ones it read first, by its logits; then the rest in the first stage's order
        assert set(order[:8]) == set(read) and list(order[8:]) == list(rest)
        assert sel["crossenc@2"][i].passages == [r.item.passages[j] for j in order[:2]]
        kept = sel["crossenc_threshold"][i].passages
        assert len(kept) == max(1, int((cross[read] >= 0.0).sum()))
        assert {p.pid for p in kept} <= {r.item.passages[j].pid for j in read}
        for ranking in M.RANKINGS:  # each ranking's own top-|S|
            matched = sel[f"{ranking}@size:p"][i].passages
            assert matched == M.top_passages(r, r.scores(ranking), n)
    # A matched row is keyed by its picker: another picker folder, other records.
    before = fingerprint(cfg, "dense@size:p")
    (tmp_path / "p" / "adapter.safetensors").write_bytes(b"other weights")
    assert fingerprint(cfg, "dense@size:p") != before
    assert fingerprint(cfg, "dense@2") == fingerprint(cfg, "dense@2")


def test_a_matched_row_is_paired_with_its_own_picker_only():
    recs = [
        {"dataset": "d", "method": m, "example_id": q, "correct": True, "context_tokens": 1}
        for m in ("picker:a", "picker:b", "dense@size:a", "dense@size:b", "dense@2")
        for q in ("q1", "q2")
    ]
    table = paired_table(
        recs, ["picker:a", "picker:b"], ["dense@size:a", "dense@size:b", "dense@2"]
    )
    pairs = {tuple(line.split("|")[1:3]) for line in table.splitlines()[2:]}
    pairs = {(p.strip(), b.strip()) for p, b in pairs}
    assert pairs == {
        ("picker:a", "dense@size:a"),
        ("picker:a", "dense@2"),
        ("picker:b", "dense@size:b"),
        ("picker:b", "dense@2"),
    }


class FirstTwo:
    """An engine whose picker keeps the first two passages shown, whatever the question."""

    def generate(self, chats, sampling):
        return [[Completion("<ids>[1, 2]</ids><rationale>x</rationale>", [], 0)] for _ in chats]


def test_a_picker_reads_the_order_it_was_trained_on_and_another_chunking_is_refused(tmp_path):
    """One evaluation holds pickers trained on different orders of the same chunks: each is
    shown its own order (a picker trained on the dense order, under a BM25 pool, reads dense;
    the BM25 rows keep BM25's). A pool no ranking here reproduces (other chunks) is refused
    before any engine starts."""
    dense = ["retrieval.pool.retriever=dense", "mining.pool.retriever=dense"]
    cfg = _cfg(tmp_path, "eval.methods=[bm25,picker]")
    cfg.eval.pickers = {"p": _trained_folder(tmp_path / "p", _cfg(tmp_path, *dense))}
    assert picker_rankings(cfg) == {"p": "dense"}
    items = retrieve(cfg)  # the dense scores are computed for the picker alone
    spec = PickerSpec.load(tmp_path / "p")
    picks = picks_as_served(Picker(FirstTwo(), spec, count_tokens=len), items, "dense")
    orders = [[int(j) for j in np.argsort(-r.dense, kind="stable")[:6]] for r in items]
    assert any(r.pool != order for r, order in zip(items, orders, strict=True))  # BM25's
    for r, sel, order in zip(items, picks, orders, strict=True):
        assert sel.extra["shown_pids"] == [r.item.passages[j].pid for j in order]
        assert sel.passages == [r.item.passages[j] for j in order[:2]]
    assert "picker:p reads the dense order; full_pool and adaptive keep the bm25" in report_header(
        cfg
    )

    window = _cfg(tmp_path, *dense, "retrieval.chunking.window_words=64")
    cfg.eval.pickers = {"w": _trained_folder(tmp_path / "w", window)}
    with pytest.raises(ConfigError, match=r"no ranking here reproduces it.*chunking"):
        select(cfg, retrieve(cfg))
    spec = json.loads((tmp_path / "w" / "picker.json").read_text())
    assert spec["pool"]["retriever"] == "dense"


def test_a_crossenc_pool_is_what_the_pool_methods_read(tmp_path):
    crossenc = [
        "retrieval.pool.retriever=crossenc",
        "mining.pool.retriever=crossenc",
        "mining.pool.rerank_n=8",
        "mining.pool.k=6",
    ]
    cfg = _cfg(tmp_path, *crossenc, "eval.methods=[crossenc,full_pool]")
    items = retrieve(cfg)
    sel = select(cfg, items)
    for i, r in enumerate(items):
        assert r.pool == [int(j) for j in np.argsort(-r.crossenc, kind="stable")[:6]]
        assert sel["crossenc@2"][i].passages == sel["full_pool"][i].passages[:2]
