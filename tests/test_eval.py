"""Evaluation: each baseline's selection on real samples, the token budget, metric and report
functions against hand-computed cases."""

import json

import numpy as np
import pytest
from conftest import SAMPLES

from ctxpick.config import compose
from ctxpick.data.schema import ChunkedExample, Example, Passage
from ctxpick.eval import methods as M
from ctxpick.eval.harness import method_labels, retrieve, select
from ctxpick.eval.plots import plot_accuracy_vs_tokens
from ctxpick.eval.report import aggregate, main_table
from ctxpick.picker.selection import apply_budget


def test_largest_gap_cutoff_by_hand():
    assert M.largest_gap_cutoff([9, 8, 3, 2]) == 2  # biggest drop is 8 -> 3
    assert M.largest_gap_cutoff([9, 2, 1.5, 1]) == 1
    assert M.largest_gap_cutoff([9, 2, 1.5, 1], min_k=2) == 2  # drop 2 -> 1.5 is the largest left
    assert M.largest_gap_cutoff([5]) == 1 and M.largest_gap_cutoff([]) == 0


def test_token_budget_keeps_passages_in_order_until_full():
    ps = [Passage(f"p{i}", 0, 0, 0, "w " * n) for i, n in enumerate([3, 4, 5])]
    count = lambda p: len(p.text.split())  # noqa: E731
    assert apply_budget(ps, 7, count) == (ps[:2], True)
    assert apply_budget(ps, 12, count) == (ps, False)
    assert apply_budget(ps, 2, count) == ([], True)
    assert apply_budget(ps, None, count) == (ps, False)


def test_oracle_and_adaptive_on_a_hand_built_pool():
    ps = [Passage(f"d/{i}", i, 0, 1, f"text {i}") for i in range(4)]
    ex = Example("q", "toy", "?", ["a"], [], None)
    r = M.Retrieved(
        ChunkedExample(ex, ps, ["d/2", "d/0"]), np.array([1.0, 9.0, 0.5, 8.5]), [1, 3, 0, 2]
    )
    assert [p.pid for p in M.adaptive(r)] == ["d/1", "d/3"]  # 9, 8.5 | gap 7.5 | 1, 0.5
    assert [p.pid for p in M.oracle(r)] == ["d/0", "d/2"]
    no_gold = M.Retrieved(ChunkedExample(ex, ps, None), r.bm25, r.pool)
    assert M.oracle(no_gold) is None


def _cfg(tmp_path, *extra):
    return compose(
        [
            f"output_dir={tmp_path}",
            "retrieval.chunking.method=window",
            "retrieval.pool.k=6",
            "eval.methods=[none,bm25,dense,adaptive,full_pool,oracle]",
            "eval.topk=[2,4]",
            "+eval.topk_by_dataset.locomo=[3]",
            *extra,
        ]
    )


def test_each_baseline_selects_from_real_samples(tmp_path):
    cfg = _cfg(tmp_path)
    cfg.data.sources = [
        type(cfg.data.sources[0])(str(SAMPLES / "hotpotqa_distractor_30.jsonl"), "hotpotqa", 3),
        type(cfg.data.sources[0])(str(SAMPLES / "locomo10_conv26.json"), "locomo", 2),
    ]
    items = retrieve(cfg)
    assert method_labels(cfg, "hotpotqa") == [
        "none",
        "bm25@2",
        "bm25@4",
        "dense@2",
        "dense@4",
        "adaptive",
        "full_pool",
        "oracle",
    ]
    assert "bm25@3" in method_labels(cfg, "locomo") and "bm25@2" not in method_labels(cfg, "locomo")
    sel = select(cfg, items)
    for i, r in enumerate(items):
        hotpot = r.item.example.dataset == "hotpotqa"
        assert sel["none"][i].passages == []
        if hotpot:
            assert len(sel["bm25@2"][i].passages) == 2 and len(sel["dense@4"][i].passages) == 4
            assert sel["bm25@3"][i].passages is None  # not a method for this dataset
            # BM25 top-k are the best-scored passages, dense top-k the most similar
            best = max(r.bm25)
            assert r.bm25[r.item.passages.index(sel["bm25@2"][i].passages[0])] == best
            top_dense = sel["dense@2"][i].passages[0]
            assert r.dense[r.item.passages.index(top_dense)] == pytest.approx(max(r.dense))
        else:
            assert len(sel["bm25@3"][i].passages) == 3 and sel["bm25@2"][i].passages is None
        assert len(sel["full_pool"][i].passages) == 6
        cut = sel["adaptive"][i].passages
        assert 1 <= len(cut) <= 6 and cut == sel["full_pool"][i].passages[: len(cut)]
        gold = set(r.item.gold_pids or [])
        assert {p.pid for p in sel["oracle"][i].passages} == gold and gold


def test_a_dense_pool_is_what_the_pool_methods_read_and_bm25_topk_is_unchanged(tmp_path):
    """retrieval.pool.retriever=dense: the inference pool (the picker's, full_pool's and
    adaptive's) is the dense top-k in dense order; BM25 Top-K still ranks by BM25."""
    dense = ["retrieval.pool.retriever=dense", "mining.pool.retriever=dense"]
    cfg, ref = _cfg(tmp_path / "dense", *dense), _cfg(tmp_path / "bm25")
    for c in (cfg, ref):
        c.data.sources = [
            type(c.data.sources[0])(str(SAMPLES / "hotpotqa_distractor_30.jsonl"), "hotpotqa", 4)
        ]
    items, ref_items = retrieve(cfg), retrieve(ref)
    sel, ref_sel = select(cfg, items), select(ref, ref_items)
    assert any(r.pool != b.pool for r, b in zip(items, ref_items, strict=True))
    for i, r in enumerate(items):
        assert r.pool == [int(j) for j in np.argsort(-r.dense, kind="stable")[:6]]
        assert sel["full_pool"][i].passages == [r.item.passages[j] for j in r.pool]
        cut = sel["adaptive"][i].passages
        scores = [float(r.dense[j]) for j in r.pool]
        assert cut == sel["full_pool"][i].passages[: M.largest_gap_cutoff(scores)]
        assert sel["bm25@2"][i].passages == ref_sel["bm25@2"][i].passages
        assert sel["dense@2"][i].passages == sel["full_pool"][i].passages[:2]


def test_a_picker_recorded_for_every_question_does_not_run_again(tmp_path):
    """Re-running an evaluation must not redo a picker's inference when every question has its
    record: the picker is not even loaded (this folder holds no model)."""
    from ctxpick.config import ConfigError

    cfg = _cfg(tmp_path)
    cfg.eval.methods = ["none", "picker"]
    cfg.eval.pickers = {"gone": str(tmp_path / "deleted_model")}
    items = retrieve(cfg)
    rows = [{"pick_ids": [1]}] * len(items)
    sel = select(cfg, items, recorded=lambda label: rows if label == "picker:gone" else None)
    assert len(sel["picker:gone"]) == len(items) and len(sel["none"]) == len(items)
    with pytest.raises(ConfigError, match="not a model folder"):
        select(cfg, items)  # not recorded: the picker would run
    cfg.eval.methods = ["none"]  # no method needs a picker: none is loaded
    assert list(select(cfg, items)) == ["none"]


def test_config_refuses_unknown_methods(tmp_path):
    from ctxpick.config import ConfigError

    with pytest.raises(ConfigError, match="unknown method 'bm42'"):
        compose(["eval.methods=[bm42]"])


def _rec(dataset, method, correct, em, f1, recall, prec, passages, tokens, **kw):
    return {
        "dataset": dataset,
        "method": method,
        "correct": correct,
        "em": em,
        "f1": f1,
        "evidence_recall": recall,
        "evidence_precision": prec,
        "passages": passages,
        "context_tokens": tokens,
        "prompt_tokens": tokens + 50,
        "select_s": 0.01,
        "budget_cut": False,
        **kw,
    }


def test_aggregate_report_and_plot_by_hand(tmp_path):
    records = [
        _rec("hotpotqa", "bm25@5", True, True, 1.0, 0.5, 0.2, 5, 500),
        _rec("hotpotqa", "bm25@5", False, False, 0.5, 1.0, 0.4, 5, 700),
        _rec("hotpotqa", "picker:stage2", True, False, 0.8, 1.0, 1.0, 2, 200, pick_valid=True),
        _rec("hotpotqa", "picker:stage2", True, True, 1.0, None, None, 1, 100, pick_valid=False),
        _rec("locomo", "bm25@5", True, True, 1.0, None, None, 5, 300),
    ]
    res = {
        (r.dataset, r.method): r
        for r in aggregate(records, {("hotpotqa", "bm25@5"): {"generate": 4.0, "judge": 1.0}})
    }
    b = res[("hotpotqa", "bm25@5")]
    assert (b.questions, b.accuracy, b.em, b.f1) == (2, 0.5, 0.5, 0.75)
    assert (b.evidence_recall, b.evidence_precision) == (0.75, pytest.approx(0.3))
    assert (b.context_tokens, b.prompt_tokens, b.generate_s, b.judge_s) == (600, 650, 2.0, 0.5)
    p = res[("hotpotqa", "picker:stage2")]
    assert p.evidence_recall == 1.0 and p.fallback_rate == 0.5 and p.accuracy == 1.0
    assert res[("locomo", "bm25@5")].evidence_recall is None
    table = main_table(list(res.values()), ["bm25@5", "picker:stage2", "oracle"])
    lines = table.splitlines()
    assert "hotpotqa acc" in lines[0] and "locomo tok" in lines[0]
    bm25_row = [c.strip() for c in lines[2].split("|")[1:-1]]
    # hotpotqa 50% / 600 tok, locomo 100% / 300 tok; the picker has no locomo row, so the
    # averages are hotpotqa's: 50% / 600 tok / 5 passages
    assert bm25_row == ["bm25@5", "50.0", "600", "100.0", "300", "50.0", "600", "5.0", "-"]
    picker_row = [c.strip() for c in lines[3].split("|")[1:-1]]
    assert picker_row[3:5] == ["-", "-"] and picker_row[-1] == "50.0" and "oracle" not in table
    assert lines[-1].startswith("Averages over hotpotqa: ")
    pngs = plot_accuracy_vs_tokens(list(res.values()), tmp_path)
    assert [p.name for p in pngs] == [
        "accuracy_vs_tokens_hotpotqa.png",
        "accuracy_vs_tokens_locomo.png",
    ]
    assert all(p.stat().st_size > 1000 for p in pngs)
    json.dumps([r.__dict__ for r in res.values()])


def test_picker_shows_cut_passages_returns_full_ones_and_falls_back_on_bad_output():
    from ctxpick.engines.base import Completion
    from ctxpick.picker.inference import Picker
    from ctxpick.picker.spec import PickerSpec

    class Scripted:
        def generate(self, chats, sampling):
            assert "w w ..." in chats[0][1]["content"]  # cut to 2 words for the picker
            outs = ["<rationale>x</rationale><ids>[2]</ids>", "no tags"]
            return [[Completion(t, [], 0)] for t in outs]

    ps = [Passage(f"p{i}", i, 0, 0, "w " * 10, "T") for i in range(5)]
    good, bad = Picker(Scripted(), PickerSpec("sys", 3, 2, 16)).decide(["q1", "q2"], [ps, ps])
    assert good.valid and [p.pid for p in good.passages] == ["p1"]
    assert good.passages[0].text == ps[1].text  # the generator gets the full passage
    # the fallback (top 2 by default, as served), not the 3 passages shown
    assert not bad.valid and [p.pid for p in bad.passages] == ["p0", "p1"]
    assert "missing <rationale>" in bad.reason
    everything = Picker(Scripted(), PickerSpec("sys", 3, 2, 16), fallback="all")
    assert everything.decide(["q1", "q2"], [ps, ps])[1].passages == ps


def test_results_are_keyed_by_what_produced_them(tmp_path):
    """A re-run with another picker (same label), budget, generator or dtype gets new record
    keys, so the old rows are neither skipped-as-done nor reported."""
    from ctxpick.eval.records import fingerprint

    for name, weights in (("a", b"weights A"), ("b", b"weights B")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(weights)
        (tmp_path / name / "picker.json").write_text('{"instruction": "x"}')
    base = ["eval.methods=[bm25,picker]"]
    a = compose([*base, f"+eval.pickers.s2={tmp_path / 'a'}"])
    b = compose([*base, f"+eval.pickers.s2={tmp_path / 'b'}"])
    again = compose([*base, f"+eval.pickers.s2={tmp_path / 'a'}"])
    assert fingerprint(a, "picker:s2") == fingerprint(again, "picker:s2")
    assert fingerprint(a, "picker:s2") != fingerprint(b, "picker:s2")
    assert fingerprint(a, "bm25@5") == fingerprint(b, "bm25@5")  # the baseline did not change
    budget = compose([*base, "eval.token_budget=300", f"+eval.pickers.s2={tmp_path / 'a'}"])
    assert fingerprint(a, "bm25@5") != fingerprint(budget, "bm25@5")
    other_gen = compose([*base, "model=smollm2-135m", f"+eval.pickers.s2={tmp_path / 'a'}"])
    assert fingerprint(a, "bm25@5") != fingerprint(other_gen, "bm25@5")
    # The generator's dtype keys every row, the evaluated pickers' only theirs.
    s2 = f"+eval.pickers.s2={tmp_path / 'a'}"
    gen16 = compose([*base, "model.engine.dtype=float16", s2])
    assert fingerprint(a, "bm25@5") != fingerprint(gen16, "bm25@5")
    picker16 = compose([*base, "rl.rollout.dtype=float16", s2])
    assert fingerprint(a, "bm25@5") == fingerprint(picker16, "bm25@5")
    assert fingerprint(a, "picker:s2") != fingerprint(picker16, "picker:s2")
    before = fingerprint(a, "picker:s2")
    (tmp_path / "a" / "picker.json").write_text('{"instruction": "y"}')  # another prompt
    assert fingerprint(a, "picker:s2") != before
