"""A picker is evaluated as it is served (issue 18): the served fallback on an invalid output,
recorded in the fingerprint and shown in the main table; averages over the same datasets for
every method; record keys that follow the data."""

import json
from pathlib import Path

import pytest
from conftest import SAMPLES

from ctxpick.config import ConfigError, EvalConfig, compose
from ctxpick.engines.base import Completion
from ctxpick.eval.harness import retrieve
from ctxpick.eval.picking import picks_as_served
from ctxpick.eval.records import fingerprint, record_keys
from ctxpick.eval.report import aggregate, ci_table, main_table
from ctxpick.picker.inference import Picker
from ctxpick.picker.spec import PickerSpec
from ctxpick.serve.settings import ServeConfig

VALID = "<rationale>x</rationale><ids>[3, 1]</ids>"


class Scripted:
    """Answers every other question with an output that does not parse."""

    def generate(self, chats, sampling):
        return [[Completion(VALID if i % 2 == 0 else "no tags", [], 0)] for i in range(len(chats))]


def _items(tmp_path, n=4, path=SAMPLES / "hotpotqa_distractor_30.jsonl"):
    cfg = compose([f"output_dir={tmp_path}", "retrieval.pool.k=6", "eval.methods=[none,picker]"])
    cfg.data.sources = [type(cfg.data.sources[0])(str(path), "hotpotqa", n)]
    return retrieve(cfg)


def _picker(**fallback):
    spec = PickerSpec("sys", 4, 8, 16)
    return Picker(Scripted(), spec, count_tokens=lambda text: len(text.split()), **fallback)


def test_an_invalid_output_gets_the_served_top_k_in_evaluation(tmp_path):
    items = _items(tmp_path)
    picker = _picker()
    served = picker.pick_many(
        [r.item.example.question for r in items],
        [[r.item.passages[i].text for i in r.pool] for r in items],
    )
    for i, (sel, r) in enumerate(zip(picks_as_served(picker, items), items, strict=True)):
        pool = [r.item.passages[j] for j in r.pool]
        assert [pool.index(p) for p in sel.passages] == served[i].indices  # what a client gets
        if i % 2 == 0:  # ids [3, 1]: sent in the retriever's order, as the service sends them
            assert sel.passages == [pool[0], pool[2]] and sel.extra["pick_ids"] == [1, 3]
            assert sel.extra["pick_valid"] and sel.extra["pick_fallback"] is None
        else:  # the service's default fallback: the retriever's top 2, not every shown passage
            assert sel.passages == pool[:2] and sel.extra["fallback_ids"] == [1, 2]
            assert not sel.extra["pick_valid"] and sel.extra["pick_ids"] is None
            assert sel.extra["pick_fallback"].startswith("invalid output (")
    whole = picks_as_served(_picker(fallback="all"), items)[1]
    assert whole.passages == [items[1].item.passages[j] for j in items[1].pool]  # all 6


def test_the_eval_fallback_defaults_to_the_served_one_and_keys_the_records(tmp_path):
    folder = tmp_path / "picker"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "picker.json").write_text('{"instruction": "x"}')
    base = ["eval.methods=[bm25,picker]", f"+eval.pickers.s2={folder}"]
    cfg = compose(base)
    assert (cfg.eval.picker_fallback, cfg.eval.picker_fallback_k) == ("top_k", 2)
    assert (cfg.serve.fallback, cfg.serve.fallback_k) == ("top_k", 2)
    assert (EvalConfig().picker_fallback, EvalConfig().picker_fallback_k) == (
        ServeConfig().fallback,
        ServeConfig().fallback_k,
    )
    assert compose([*base, "serve.fallback_k=3"]).eval.picker_fallback_k == 3  # as served
    others = [compose([*base, "eval.picker_fallback_k=3"]), compose([*base, "serve.fallback=all"])]
    prints = {fingerprint(c, "picker:s2") for c in (cfg, *others)}
    assert len(prints) == 3
    assert {fingerprint(c, "bm25@5") for c in (cfg, *others)} == {fingerprint(cfg, "bm25@5")}
    with pytest.raises(ConfigError, match="eval.picker_fallback 'first'"):
        compose(["eval.picker_fallback=first"])
    with pytest.raises(ConfigError, match="eval.picker_fallback_k must be >= 1"):
        compose(["eval.picker_fallback_k=0"])


def _rec(dataset, method, q, correct, **kw):
    return {
        "dataset": dataset,
        "method": method,
        "example_id": q,
        "correct": correct,
        "em": correct,
        "f1": float(correct),
        "evidence_recall": None,
        "evidence_precision": None,
        "passages": 2,
        "context_tokens": 100,
        "prompt_tokens": 150,
        "select_s": 0.0,
        "budget_cut": False,
        **kw,
    }


def test_averages_are_over_the_datasets_every_method_has(tmp_path):
    """eval.topk_by_dataset runs bm25@5 everywhere but LoCoMo and bm25@20 on LoCoMo only (as
    the demo does): neither narrows the datasets the others average over (that would leave
    none); they get no average, and the note says so. The oracle (no gold on MultiFieldQA)
    does not narrow them either."""
    records = [
        _rec("hotpotqa", "bm25@5", "h1", True),
        _rec("hotpotqa", "bm25@5", "h2", False),
        _rec("mfqa", "bm25@5", "m1", True),
        _rec("mfqa", "bm25@5", "m2", True),
        _rec("locomo", "bm25@20", "l1", True),
        _rec("hotpotqa", "picker:s2", "h1", True, pick_valid=True),
        _rec("hotpotqa", "picker:s2", "h2", True, pick_valid=False),
        _rec("mfqa", "picker:s2", "m1", True, pick_valid=False),
        _rec("mfqa", "picker:s2", "m2", False, pick_valid=False),
        _rec("locomo", "picker:s2", "l1", False, pick_valid=True),
        _rec("locomo", "picker:s2", "l2", False, pick_valid=True),
        _rec("hotpotqa", "oracle", "h1", True),
        _rec("locomo", "oracle", "l1", False),
    ]
    methods = ["bm25@5", "bm25@20", "oracle", "picker:s2"]
    table = main_table(aggregate(records, {}), methods)
    lines = table.splitlines()
    head = [c.strip() for c in lines[0].split("|")[1:-1]]
    rows = {r[0]: dict(zip(head, r, strict=True)) for r in _rows(lines[2:6])}
    # picker: hotpotqa 100, locomo 0, mfqa 50; fallback 50%, 0% and 100% there
    assert (rows["picker:s2"]["avg acc"], rows["picker:s2"]["fallback %"]) == ("50.0", "50.0")
    assert (rows["bm25@5"]["avg acc"], rows["bm25@5"]["fallback %"]) == ("-", "-")
    assert rows["bm25@20"]["avg acc"] == "-"
    assert rows["oracle"]["avg acc"] == "50.0"  # hotpotqa and locomo: the common ones it has
    assert lines[-1] == (
        "Averages over hotpotqa, locomo, mfqa. No average (not run on all of them): bm25@5, "
        "bm25@20. oracle: over hotpotqa, locomo (gold evidence)."
    )
    ci = ci_table(records, methods)
    average = next(r for r in _rows(ci.splitlines()) if r[:2] == ["average", "picker:s2"])
    assert average[2] == "6" and average[3].startswith("50.0 [")
    assert not [r for r in _rows(ci.splitlines()) if r[:2] == ["average", "bm25@5"]]
    assert ci.splitlines()[-1] == lines[-1]
    # Without topk_by_dataset, a method missing a dataset narrows every average, and is named.
    narrowed = [r for r in records if r["method"] != "bm25@20"]
    narrowed += [_rec("hotpotqa", "adaptive", "h1", True), _rec("mfqa", "adaptive", "m1", False)]
    note = main_table(aggregate(narrowed, {}), [*methods, "adaptive"]).splitlines()[-1]
    assert note.startswith(
        "Averages over hotpotqa, mfqa: the datasets every method has; left out: locomo (no "
        "bm25@5, adaptive)"
    )


def _rows(lines):
    return [[c.strip() for c in line.split("|")[1:-1]] for line in lines if line.startswith("|")]


def test_an_edited_data_file_with_the_same_ids_gets_new_record_keys(tmp_path):
    lines = (SAMPLES / "hotpotqa_distractor_30.jsonl").read_text().splitlines()[:2]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    prints = {"none": "fp", "bm25@5": "fp2"}
    before = record_keys(_items(tmp_path / "a", 2, path), prints)
    assert before == record_keys(_items(tmp_path / "b", 2, path), prints)  # stable
    edited = json.loads(lines[1])
    edited["context"][0][1][0] = "An edited sentence."  # same id, other text
    path.write_text(lines[0] + "\n" + json.dumps(edited) + "\n")
    after = record_keys(_items(tmp_path / "c", 2, path), prints)
    for label in prints:
        assert after[label][0] == before[label][0]  # the untouched question keeps its rows
        assert after[label][1] != before[label][1]
        assert after[label][1].startswith(f"{edited['_id']}|{label}|")


def test_an_untrained_picker_is_evaluated_with_the_served_fallback(tmp_path, ray_cluster):
    """The real path: `select` loads the picker into a Ray engine pool and runs vLLM. An
    untrained SmolLM2 writes mostly invalid outputs; each of those sends the retriever's top 2,
    what `ctxpick serve` sends, never the whole pool."""
    from ctxpick.config import picker_spec
    from ctxpick.engines.models import resolve
    from ctxpick.eval.harness import select

    folder = tmp_path / "untrained"
    folder.mkdir()
    for f in Path(resolve("smollm2-135m")).iterdir():
        (folder / f.name).symlink_to(f)
    cfg = compose(
        [
            f"output_dir={tmp_path}",
            "retrieval.pool.k=6",
            "eval.methods=[none,picker]",
            f"+eval.pickers.untrained={folder}",
            "rl.rollout.max_model_len=4096",
            "rl.rollout.cpu_kv_cache_gb=1",
        ]
    )
    picker_spec(cfg).save(folder)
    cfg.data.sources = [
        type(cfg.data.sources[0])(str(SAMPLES / "hotpotqa_distractor_30.jsonl"), "hotpotqa", 6)
    ]
    items = retrieve(cfg)
    picks = select(cfg, items)["picker:untrained"]
    invalid = [(sel, r) for sel, r in zip(picks, items, strict=True) if not sel.extra["pick_valid"]]
    assert invalid  # an untrained picker does not keep the format
    for sel, r in invalid:
        assert sel.passages == [r.item.passages[i] for i in r.pool[:2]]
        assert sel.extra["fallback_ids"] == [1, 2]


class Refusing:
    """An engine that fails: a dead actor, or a prompt past its context."""

    def generate(self, chats, sampling):
        raise RuntimeError("engine died")


def test_an_engine_failure_is_raised_in_evaluation_never_recorded_as_a_fallback(tmp_path):
    """The service answers a failed engine call with the fallback; evaluation must not: a
    recorded fallback row would stand for the picker on every re-run."""
    items = _items(tmp_path, n=2)
    picker = Picker(Refusing(), PickerSpec("sys", 4, 8, 16), count_tokens=len)
    served = picker.pick_many(["q"], [["a", "b", "c"]])
    assert served[0].fallback.startswith("engine error (RuntimeError: engine died)")
    with pytest.raises(RuntimeError, match="engine died"):
        picks_as_served(picker, items)
