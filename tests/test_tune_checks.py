"""The checks `benchmarks/tune_picker_max_tokens.py` makes before a paired comparison (pure):
another run's per-question file is read line by line, and it must hold every question of this
run, with gold in both or in neither, or no pairing is printed."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def tune(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import tune_picker_max_tokens

    return tune_picker_max_tokens


def _item(dataset, qid, gold):
    example = SimpleNamespace(dataset=dataset, id=qid)
    return SimpleNamespace(item=SimpleNamespace(example=example, gold_pids=gold))


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


ROW = {"id": "q1", "dataset": "hotpotqa", "f1": 0.5}


@pytest.mark.parametrize(
    "rows,message",
    [
        ([ROW, "{not json"], "line 2: not JSON"),
        ([{"id": "q1", "f1": 0.5}], "line 1: needs an object with id, dataset and f1"),
        ([{**ROW, "f1": "high"}], "line 1: f1 is 'high'"),
        ([ROW, ROW], "line 2: hotpotqa question q1 is listed twice"),
        ([], "no questions in it"),
    ],
)
def test_a_reference_file_is_refused_naming_its_line(tune, tmp_path, rows, message):
    with pytest.raises(SystemExit, match=message):
        tune._read_per_question(_write(tmp_path / "ref.jsonl", rows))


def test_a_reference_must_hold_the_same_questions_with_gold_alike(tune, tmp_path):
    path = _write(tmp_path / "ref.jsonl", [ROW, {"id": "q2", "dataset": "locomo", "f1": None}])
    reference = tune._read_per_question(path)
    tune._check_same_questions(
        [_item("hotpotqa", "q1", ("p1",)), _item("locomo", "q2", ())], reference, path
    )
    with pytest.raises(SystemExit, match="1 of these 2 questions are not in it"):
        tune._check_same_questions(
            [_item("hotpotqa", "q1", ("p1",)), _item("hotpotqa", "q3", ("p1",))], reference, path
        )
    with pytest.raises(SystemExit, match="locomo question q2 has gold here, not there"):
        tune._check_same_questions([_item("locomo", "q2", ("p9",))], reference, path)
    with pytest.raises(SystemExit, match="lists a question twice"):
        tune._check_same_questions([_item("hotpotqa", "q1", ("p1",))] * 2, reference, path)
