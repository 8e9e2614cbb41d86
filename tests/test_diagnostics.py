"""Collapse diagnostics: a constant picker, a prefix copier and a reading picker, by hand."""

import random

from ctxpick.eval.report import main_table, picker_diagnostics
from ctxpick.picker.diagnostics import PickRecord, diagnose, set_f1


def _records(method, picks, golds, shown=8):
    return [
        {
            "method": method,
            "dataset": "hotpotqa",
            "shown_pids": [f"p{i}" for i in range(1, shown + 1)],
            "gold_pids": [f"p{i}" for i in gold],
            "pick_ids": list(p) if p is not None else None,
        }
        for p, gold in zip(picks, golds, strict=True)
    ]


def test_set_f1_and_diagnose_by_hand():
    assert set_f1([1, 2], [2, 3]) == 0.5 and set_f1([4], [1]) == 0.0
    d = diagnose(
        [
            PickRecord((7, 8), 8, (1, 2)),
            PickRecord((8, 7), 8, (2, 5)),
            PickRecord(None, 8, (1,), fallback=(1, 2)),
        ]
    )
    assert d.valid == 2 / 3 and d.distinct_sets == 0.5 and d.top_set == (7, 8)
    assert d.top_set_share == 1.0 and d.prefix_share == 0.0
    assert d.picked_by_position[6:] == [1.0, 1.0] and d.gold_by_position[0] == 2 / 3
    # the invalid output is scored on what its fallback sent: the top 2 against 1 gold
    assert d.f1 == [0.0, 0.0, set_f1((1, 2), [1])]


def test_collapsed_and_copying_pickers_are_flagged_a_reading_one_is_not():
    rng = random.Random(12345)  # not the controls' seed, which would redraw these sets
    golds = [tuple(sorted(rng.sample(range(1, 9), 2))) for _ in range(60)]
    records = _records("picker:constant", [(7, 8)] * 60, golds)
    records += _records("picker:prefix", [(1, 2)] * 60, golds)
    records += _records("picker:reads", golds, golds)
    text, flags = picker_diagnostics(records, ["picker:constant", "picker:prefix", "picker:reads"])
    assert "not above random" in flags["picker:constant"]
    assert "not above its constant set" in flags["picker:constant"]
    assert "copies the retriever's top-|S| in 100%" in flags["picker:prefix"]
    assert "picker:reads" not in flags
    row = next(line for line in text.splitlines() if line.startswith("| picker:reads"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[:3] == ["picker:reads", "60", "100"] and cells[-1] == "ok"
    from ctxpick.eval.report import MethodResult

    res = [
        MethodResult("hotpotqa", m, 60, 0.5, 0.5, 0.5, None, None, 2, 100, 150, 0, 0, 0, 0)
        for m in ("picker:constant", "picker:reads")
    ]
    table = main_table(res, ["picker:constant", "picker:reads"], flags)
    assert "picker:constant (!)" in table and "picker:reads (!)" not in table
