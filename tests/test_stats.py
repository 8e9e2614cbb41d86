"""Bootstrap intervals and the paired comparison, against hand-computed and seeded cases."""

import numpy as np
import pytest

from ctxpick.eval.report import ablation_table, ci_table, paired_table, rounded
from ctxpick.eval.stats import bootstrap_mean, stratified_mean


def test_bootstrap_of_a_constant_is_the_constant():
    e = bootstrap_mean([0.5] * 10)
    assert (e.mean, e.lo, e.hi, e.n) == (0.5, 0.5, 0.5, 10)
    assert e.excludes_zero()


def test_bootstrap_interval_matches_the_normal_approximation():
    """Accuracy of 120/200: the bootstrap interval is close to p ± 1.96 sqrt(p(1-p)/n)."""
    values = [1.0] * 120 + [0.0] * 80
    e = bootstrap_mean(values, n_boot=4000, seed=1)
    half = 1.96 * np.sqrt(0.6 * 0.4 / 200)
    assert e.mean == pytest.approx(0.6)
    assert e.lo == pytest.approx(0.6 - half, abs=0.01)
    assert e.hi == pytest.approx(0.6 + half, abs=0.01)
    assert bootstrap_mean(values, seed=3) == bootstrap_mean(values, seed=3)  # seeded


def _rec(method, example_id, correct, tokens, dataset="hotpotqa", recall=None, precision=None):
    return {
        "dataset": dataset,
        "method": method,
        "example_id": example_id,
        "correct": correct,
        "context_tokens": tokens,
        "evidence_recall": recall,
        "evidence_precision": precision,
    }


def _row(table, picker, baseline, dataset):
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if cells[:3] == [picker, baseline, dataset]:
            return cells[3:]
    raise AssertionError(f"no row {picker} / {baseline} / {dataset}")


def test_paired_comparison_keeps_the_pairing():
    """A picker that is right exactly where the baseline is, with 100 fewer tokens on every
    question: accuracy difference 0 [0, 0], tokens -100 [-100, -100]*, though both methods'
    own accuracies spread widely. Questions only one method answered are left out."""
    rng = np.random.default_rng(0)
    correct = rng.random(40) < 0.5
    recs = [_rec("bm25@5", f"q{i}", bool(c), 300) for i, c in enumerate(correct)]
    recs += [_rec("picker:s2", f"q{i}", bool(c), 200) for i, c in enumerate(correct)]
    recs += [_rec("picker:s2", "extra", True, 10)]
    n, acc, _, tok = _row(
        paired_table(recs, ["picker:s2"], ["bm25@5"]), "picker:s2", "bm25@5", "hotpotqa"
    )
    assert n == "40" and acc == "0.0 [0.0, 0.0]" and tok == "-100 [-100, -100]*"
    assert bootstrap_mean(correct.astype(float)).hi - bootstrap_mean(correct.astype(float)).lo > 0.2


def test_paired_comparison_by_hand_and_on_the_average():
    """Accuracy differences [+1, 0, 0, -1]: mean 0 with an interval around it (no *); the
    average over two datasets weights each dataset equally."""
    recs = []
    for i, (p, b) in enumerate([(1, 0), (0, 0), (1, 1), (0, 1)]):
        recs += [_rec("picker:s2", f"q{i}", bool(p), 100), _rec("bm25@5", f"q{i}", bool(b), 100)]
    recs += [
        _rec("picker:s2", "m0", True, 50, "musique"),
        _rec("bm25@5", "m0", False, 50, "musique"),
    ]
    table = paired_table(recs, ["picker:s2"], ["bm25@5"])
    n, acc, ev, tok = _row(table, "picker:s2", "bm25@5", "hotpotqa")
    lo, hi = (float(x) for x in acc.split("[")[1].rstrip("]").split(","))
    assert n == "4" and acc.startswith("0.0 [") and lo < 0 < hi and "*" not in acc
    assert ev == "n/a" and tok == "0 [0, 0]"
    n, acc, _, _ = _row(table, "picker:s2", "bm25@5", "average")
    assert n == "5" and acc.startswith("50.0 [")  # (0 + 100) / 2


def test_ci_table_says_what_each_cell_rests_on():
    recs = [
        _rec("bm25@5", f"q{i}", i % 2 == 0, 100 + i, recall=1.0, precision=0.5) for i in range(10)
    ]
    table = ci_table(recs, ["bm25@5"])
    row = [c.strip() for c in table.splitlines()[2].split("|")[1:-1]]
    assert row[:3] == ["hotpotqa", "bm25@5", "10"]
    assert row[3].startswith("50.0 [") and row[4] == "66.7 [66.7, 66.7]"  # F1 of P=.5, R=1
    assert table.splitlines()[3].split("|")[1].strip() == "average"


def test_a_value_that_rounds_to_zero_prints_without_a_minus():
    assert [rounded(x, 1) for x in (-0.04, 0.04, -0.06)] == ["+0.0", "+0.0", "-0.1"]
    assert [rounded(x, 1, sign=False) for x in (-0.04, 1.25, -0.06)] == ["0.0", "1.2", "-0.1"]


def test_stratified_average_weights_datasets_equally():
    e = stratified_mean([[1.0] * 4, [0.0] * 100])
    assert e.mean == 0.5 and e.lo == 0.5 and e.hi == 0.5 and e.n == 104
    spread = stratified_mean([[1.0, 0.0] * 20, [1.0, 0.0] * 20], seed=2)
    assert spread.lo < 0.5 < spread.hi


def test_ablation_table_rows_are_variants_with_intervals():
    recs = [
        _rec("picker:full", f"q{i}", i < 6, 50, dataset=d) for d in ("a", "b") for i in range(10)
    ]
    recs += [_rec("picker:abl", f"q{i}", i < 2, 80, dataset="a") for i in range(10)]
    table = ablation_table(recs, {"picker:full": "full", "picker:abl": "w/o X", "picker:x": "none"})
    lines = table.splitlines()
    assert len(lines) == 6  # header, rule, two variants (one without rows is left out), note
    assert (
        lines[-1] == "Averages over a: the datasets every method has; left out: b (no picker:abl)."
    )
    assert [c.strip() for c in lines[0].split("|")[1:-1]][:4] == [
        "variant",
        "n",
        "a acc %",
        "b acc %",
    ]
    full = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert full[:2] == ["full", "20"] and full[2].startswith("60.0 [") and full[-1] == "50 [50, 50]"
    abl = [c.strip() for c in lines[3].split("|")[1:-1]]
    assert abl[:4] == ["w/o X", "10", abl[2], "n/a"] and abl[2].startswith("20.0 [")


def test_seed_spread_is_over_runs_and_pairs_each_run_with_the_baseline():
    """Three runs right on 2, 3 and 4 of 4 questions where the baseline is right on 2: their
    accuracies 50, 75, 100 (mean 75, sd 25); each run's paired difference +0, +25, +50, and only
    an interval off 0 is starred. A run with no records is named, not read as zero."""
    from ctxpick.eval.seeds import seed_table

    recs = [_rec("bm25@2", f"q{i}", i < 2, 100) for i in range(4)]
    for run, right in (("picker:s0", 2), ("picker:s1", 3), ("picker:s2", 4)):
        recs += [_rec(run, f"q{i}", i < right, 80) for i in range(4)]
    runs = ["picker:s0", "picker:s1", "picker:s2"]
    rows = {
        (cells[0], cells[1]): cells[2:]
        for line in seed_table(recs, runs, ["bm25@2"]).splitlines()[2:]
        if len(cells := [c.strip() for c in line.split("|")[1:-1]]) > 1
    }
    assert rows[("acc %", "average")] == ["50.0", "75.0", "100.0", "75.0", "25.0", "50.0 – 100.0"]
    assert rows[("Δ acc % vs bm25@2", "hotpotqa")][:4] == ["+0.0", "+25.0", "+50.0", "+25.0"]
    assert rows[("Δ tok vs bm25@2", "average")] == ["-20*"] * 3 + ["-20", "0", "-20 – -20"]
    assert rows[("ev. F1 %", "average")] == ["n/a"] * 6
    with pytest.raises(ValueError, match=r"no records of \['picker:s3'\]"):
        seed_table(recs, [*runs, "picker:s3"], ["bm25@2"])
    with pytest.raises(ValueError, match="2 distinct runs"):
        seed_table(recs, ["picker:s0", "picker:s0"], ["bm25@2"])
    recs += [_rec("crossenc@size:s0", f"q{i}", True, 80) for i in range(4)]
    with pytest.raises(ValueError, match="take one run's set sizes"):
        seed_table(recs, runs, ["crossenc@size:s0"])


def test_seed_spread_averages_over_the_datasets_every_row_has():
    """Two runs alike on HotpotQA, the second not evaluated on MuSiQue: the average, the
    paired average and the note are over HotpotQA alone, so the runs do not differ there;
    MuSiQue's rows are n/a for the second run and have no spread."""
    from ctxpick.eval.seeds import seed_table

    recs = []
    for method, right in (("bm25@2", 1), ("picker:s0", 3), ("picker:s1", 3)):
        recs += [_rec(method, f"q{i}", i < right, 100) for i in range(4)]
    recs += [_rec(m, "m0", m != "bm25@2", 100, "musique") for m in ("bm25@2", "picker:s0")]
    table = seed_table(recs, ["picker:s0", "picker:s1"], ["bm25@2"])
    rows = {
        (cells[0], cells[1]): cells[2:]
        for line in table.splitlines()[2:]
        if len(cells := [c.strip() for c in line.split("|")[1:-1]]) > 1
    }
    assert rows[("acc %", "average")] == ["75.0", "75.0", "75.0", "0.0", "75.0 – 75.0"]
    assert rows[("Δ acc % vs bm25@2", "average")][:2] == ["+50.0", "+50.0"]
    assert rows[("Δ acc % vs bm25@2", "average")][3] == "0.0"  # sd
    assert rows[("acc %", "musique")] == ["100.0", "n/a", "n/a", "n/a", "n/a"]
    assert rows[("Δ acc % vs bm25@2", "musique")][1:] == ["n/a"] * 4
    assert "Averages over hotpotqa" in table
