import json

import pytest
from conftest import SAMPLES, SHARED, needs_shared

from ctxpick.data.errors import DataError
from ctxpick.data.loaders import UNANSWERABLE, load_examples
from ctxpick.data.stats import compute_stats


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@needs_shared
@pytest.mark.parametrize(
    "path, fmt, questions, rejects, complete, units",
    [
        ("hotpotqa/migres_hotpot_200.jsonl", "hotpotqa", 200, 0, 200, None),
        (
            "hotpotqa/tts_project_hotpot_dev_fullwiki_sampled_500.json",
            "hotpotqa",
            500,
            0,
            134,
            None,
        ),
        ("2wikimultihopqa/migres_wikihop_200.jsonl", "2wikimultihopqa", 164, 36, 164, None),
        ("musique/migres_musique_200.jsonl", "musique", 200, 0, 200, {2: 145, 3: 32, 4: 23}),
        (
            "longbench_multifieldqa_en/multifieldqa_en_first59.jsonl",
            "multifieldqa_en",
            59,
            0,
            0,
            None,
        ),
    ],
)
def test_real_files_match_sources_md(path, fmt, questions, rejects, complete, units):
    res = load_examples(SHARED / path, fmt, strict=False)
    stats = compute_stats(res)
    assert (stats.questions, stats.rejects, stats.gold_complete) == (questions, rejects, complete)
    if units:
        assert dict(stats.gold_units) == units
    # auto-detection agrees with the named format
    assert load_examples(SHARED / path, "auto", strict=False).format == fmt


@needs_shared
def test_locomo_real_file():
    res = load_examples(SHARED / "locomo/locomo10_conv0-6.json", "locomo", strict=False)
    assert len({ex.corpus_id for ex in res.examples}) == 7
    # the malformed ids SOURCES.md lists ('D', 'D:11:26', past-the-end turns) are rejected
    bad = " ".join(r.problem for r in res.rejects)
    assert "'D'" in bad and "'D:11:26'" in bad
    cats = {ex.meta["category"] for ex in res.examples}
    assert cats == {1, 2, 3, 4, 5}
    adversarial = [ex for ex in res.examples if ex.meta["category"] == 5]
    assert all(ex.answers == [UNANSWERABLE] and ex.meta["unanswerable"] for ex in adversarial)


def test_hotpot_sentence_evidence_maps_to_spans():
    ex = load_examples(SAMPLES / "hotpotqa_distractor_30.jsonl", "hotpotqa").examples[0]
    rec = _lines(SAMPLES / "hotpotqa_distractor_30.jsonl")[0]
    assert ex.gold_complete and ex.gold_units == len(rec["supporting_facts"])
    for ev, (title, idx) in zip(ex.evidence, rec["supporting_facts"], strict=True):
        doc = ex.documents[ev.doc_index]
        assert doc.title == title
        assert doc.text[ev.start : ev.end] == dict(rec["context"])[title][idx]


def test_other_containers_of_the_same_data(tmp_path):
    """JSON list (original HotpotQA/2Wiki/MuSiQue releases) and pandas column-oriented JSON."""
    recs = _lines(SAMPLES / "hotpotqa_distractor_30.jsonl")[:5]
    as_list = tmp_path / "hotpot_dev_distractor_v1.json"
    as_list.write_text(json.dumps(recs, indent=1))
    columns = {f: {str(100 + i): r[f] for i, r in enumerate(recs)} for f in recs[0]}
    as_columns = tmp_path / "columns.json"
    as_columns.write_text(json.dumps(columns))
    base = load_examples(SAMPLES / "hotpotqa_distractor_30.jsonl", limit=5).examples
    for path in (as_list, as_columns):
        res = load_examples(path)
        assert res.format == "hotpotqa"
        assert [e.id for e in res.examples] == [e.id for e in base]
        assert [e.evidence for e in res.examples] == [e.evidence for e in base]


def test_ircot_processed_format(tmp_path):
    """IRCoT's processed JSONL: question_text, answers_objects, contexts[].is_supporting."""
    rec = _lines(SAMPLES / "musique_30.jsonl")[0]
    ircot = {
        "question_id": rec["id"],
        "question_text": rec["question"],
        "answers_objects": [
            {"number": "", "date": {"day": "", "month": "", "year": ""}, "spans": [rec["answer"]]}
        ],
        "contexts": [
            {
                "idx": p["idx"],
                "title": p["title"],
                "paragraph_text": p["paragraph_text"],
                "is_supporting": p["is_supporting"],
            }
            for p in rec["paragraphs"]
        ],
    }
    path = tmp_path / "dev_subsampled.jsonl"
    path.write_text(json.dumps(ircot) + "\n" + json.dumps({**ircot, "question_id": "x2"}) + "\n")
    for fmt in ("auto", "ircot", "hotpotqa", "musique"):
        res = load_examples(path, fmt)
        ex = res.examples[0]
        assert ex.answers == [rec["answer"]]
        assert ex.gold_units == sum(p["is_supporting"] for p in rec["paragraphs"])


def test_generic_jsonl(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(
        json.dumps(
            {
                "id": "q1",
                "question": "Who?",
                "answers": ["Ann"],
                "passages": [
                    {"id": "a", "text": "Ann did it."},
                    {"id": "b", "text": "Bob did not."},
                ],
                "gold": ["a"],
            }
        )
        + "\n"
    )
    ex = load_examples(path).examples[0]
    assert ex.dataset == "jsonl" and ex.evidence[0].doc_index == 0


@pytest.mark.parametrize(
    "record, problem",
    [
        ({"_id": "x", "question": "q", "answer": "a"}, "missing field(s) 'context'"),
        ({"_id": "x", "question": "q", "answer": "a", "context": []}, "empty context"),
        (
            {
                "_id": "x",
                "question": "q",
                "answer": "a",
                "context": [["T", ["s."]]],
                "supporting_facts": [["T", 3]],
            },
            "does not resolve",
        ),
        ({"_id": "x", "question": "q", "answer": "", "context": [["T", ["s."]]]}, "empty answer"),
    ],
)
def test_bad_records_name_file_line_and_problem(tmp_path, record, problem):
    good = _lines(SAMPLES / "hotpotqa_distractor_30.jsonl")[0]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(DataError) as err:
        load_examples(path, "hotpotqa", strict=True)
    assert str(path) in str(err.value) and "line 2" in str(err.value) and problem in str(err.value)
    assert "(id x)" in str(err.value)
    rejects = tmp_path / "rejects.jsonl"
    res = load_examples(path, "hotpotqa", strict=False, rejects_path=rejects)
    assert len(res.examples) == 1 and len(res.rejects) == 1
    assert problem in json.loads(rejects.read_text())["problem"]


def test_unparsable_line_and_bad_locomo_evidence(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"_id": 1}\n{not json\n')
    res = load_examples(path, "hotpotqa", strict=False)
    assert [r.locator for r in res.rejects] == ["line 1", "line 2"]
    assert "invalid JSON" in res.rejects[1].problem
    conv = json.loads((SAMPLES / "locomo10_conv26.json").read_text())[0]
    conv["qa"] = conv["qa"][:2] + [
        {"question": "q", "answer": "a", "category": 1, "evidence": ["D99:1"]}
    ]
    bad = tmp_path / "locomo.json"
    bad.write_text(json.dumps([conv]))
    with pytest.raises(DataError, match=r"index 0 qa\[2\].*D99:1"):
        load_examples(bad, "locomo")


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="file is empty"):
        load_examples(tmp_path / "empty.jsonl")
    with pytest.raises(DataError, match="no such file"):
        load_examples(tmp_path / "nope.jsonl")
