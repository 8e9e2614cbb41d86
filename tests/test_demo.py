"""The main job on the bundled sample, shrunk to two questions per dataset."""

import json

import pytest

from ctxpick.config import compose
from ctxpick.eval.pipeline import run_demo

pytestmark = pytest.mark.slow


def test_demo_prints_summary_table(ray_cluster, tmp_path, capsys):
    overrides = ["experiment=demo", f"output_dir={tmp_path}", "model.engine.num_cpus_per_actor=1"]
    overrides += [f"data.sources.{i}.limit=2" for i in range(5)]
    rows = run_demo(compose(overrides))
    out = capsys.readouterr().out
    assert "| dataset" in out and "accuracy (full pool)" in out
    assert {r.dataset for r in rows} == {
        "hotpotqa",
        "2wikimultihopqa",
        "musique",
        "locomo",
        "multifieldqa_en",
    }
    assert all(r.questions == 2 and r.passages_per_pool > 0 for r in rows)
    assert all(r.mining_recall is not None for r in rows if r.dataset != "multifieldqa_en")
    lines = (tmp_path / "examples.jsonl").read_text().splitlines()
    assert len(lines) == 10 and all("prediction" in json.loads(x) for x in lines)
