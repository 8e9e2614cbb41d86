"""The main job end to end on the bundled sample, shrunk: mining -> warm start -> Stage I ->
Stage II -> evaluation against the baselines, with the real engines on the test cluster."""

import json
import re

import pytest

from ctxpick.config import compose
from ctxpick.eval import harness
from ctxpick.pipeline import eval_config, run_demo

pytestmark = pytest.mark.slow

SHRINK = [
    "data.path=sample:hotpotqa_distractor_30.jsonl",
    "data.format=hotpotqa",
    "data.limit=4",
    "mining.split_ratios=[1.0,0.0,0.0]",
    "mining.rewrites.k=1",
    "picker.max_tokens=32",
    "rl.val_size=2",
    "rl.prompts_per_step=2",
    "demo.stages.warmup=['stage=warmup','stage.max_steps=2','rl.prompts_per_step=2',"
    "'rl.val_every=5']",
    "demo.stages.stage1=['stage=stage1','stage.max_steps=1','stage.group_size=2']",
    "demo.stages.stage2=['stage=stage2','stage.max_steps=1','stage.group_size=2']",
    "eval.methods=[none,bm25,adaptive,oracle,picker]",
    "eval.topk=[2]",
    "eval.token_budget=400",
    "wandb.mode=disabled",
]


PICKERS = ("stage1", "stage2", "shipped")


def test_main_job_end_to_end(ray_cluster, tmp_path, capsys, monkeypatch):
    overrides = ["experiment=demo", f"output_dir={tmp_path}", *SHRINK]
    cfg = compose(overrides)
    cfg.demo.eval_sources = cfg.demo.eval_sources[:1]
    cfg.demo.eval_sources[0].limit = 2
    report = run_demo(cfg, overrides)
    out = capsys.readouterr().out
    for phase in (
        "pools and evidence mining",
        "training: warmup",
        "training: stage2",
        "evaluation",
    ):
        assert phase in out
    assert "| method" in out and "reward curve:" in out and "plots:" in out
    assert (tmp_path / "reward_curve.png").stat().st_size > 1000
    assert (tmp_path / "eval" / "accuracy_vs_tokens_hotpotqa.png").exists()
    text = report.read_text()
    assert "picker:stage1" in text and "picker:stage2" in text
    # The shipped picker is evaluated beside the job's own, on the order it was trained on.
    assert "picker:shipped" in text and "picker:shipped reads the crossenc order" in text
    for section in ("With 95% confidence intervals", "Is each picker reading its input?"):
        assert section in text
    assert "Pickers against baselines (paired)" in text and "with 95% confidence" in out
    # A warm start syncs the rollout workers only for validation (here its last step)
    steps = [
        json.loads(x) for x in (tmp_path / "warmup" / "metrics.jsonl").read_text().splitlines()
    ]
    assert ["time/sync" in m for m in steps] == [False, True] and "val/reward" in steps[1]
    recs = [json.loads(x) for x in (tmp_path / "eval" / "examples.jsonl").read_text().splitlines()]
    methods = {r["method"] for r in recs}
    assert methods == {"none", "bm25@2", "adaptive", "oracle", *(f"picker:{p}" for p in PICKERS)}
    assert len(recs) == 2 * len(methods)
    assert all(r["context_tokens"] <= 400 for r in recs)  # the token budget caps every method
    assert all(r["context_tokens"] == 0 for r in recs if r["method"] == "none")

    # A re-run of the evaluation with every answer recorded reports the same rows and starts
    # no engine: neither a picker's nor the generator's.
    def no_engine(*args, **kwargs):
        raise AssertionError("an engine was started for answers already recorded")

    monkeypatch.setattr(harness.EnginePool, "from_config", no_engine)
    pickers = json.loads((tmp_path / "pickers.json").read_text())
    again = harness.run_eval(eval_config(cfg, overrides, tmp_path / "eval", pickers))
    assert sorted(r["id"] for r in again.records) == sorted(r["id"] for r in recs)


def test_a_main_job_on_its_own_dense_pools_trains_grpo_on_the_warm_start_data(
    ray_cluster, tmp_path, capsys
):
    """demo.rl_data=warmup_data: the GRPO stages train on the warm-start records, so no stage
    needs the generator's mined sets and none are mined; and with pools ranked by the dense
    retriever, every training prompt shows its passages in dense order, as inference does.
    The warm-start stage itself is skipped: the test above trains one, and what is pinned
    here is the data each stage reads."""
    import numpy as np

    from ctxpick.retrieval.embed import encode, load_embedder

    overrides = [
        "experiment=demo",
        f"output_dir={tmp_path}",
        *SHRINK,
        "demo.warmup_data=['mining.miner=human']",
        "demo.rl_data=warmup_data",
        "~demo.stages.stage2",
        "demo.skip=[warmup]",
        "demo.evaluate=false",
        "retrieval.pool.retriever=dense",
        "mining.pool.retriever=dense",
        "mining.pool.k=6",
    ]
    assert run_demo(compose(overrides), overrides) is None
    out = capsys.readouterr().out
    assert "no mining: every stage trains on the warm-start data" in out
    assert not (tmp_path / "mine").exists()
    records = [json.loads(x) for x in (tmp_path / "warmup_data" / "mined.jsonl").open()]
    kept = sum(r["kept"] and r["split"] == "train" for r in records)
    assert f"[stage1] {kept} train" in out  # Stage I read the warm-start records
    # Each validation with invalid greedy outputs says why they are invalid
    partly_valid = [v for v in re.findall(r"val reward \S+ valid (\d+)%", out) if v != "100"]
    assert partly_valid  # the untrained model's Stage I validation: not every output parses
    assert len(re.findall(r"validation: \d+/\d+ invalid: \S", out)) == len(partly_valid)
    assert json.loads((tmp_path / "pickers.json").read_text())["stage1"].endswith("final")
    model = load_embedder()
    for r in records:
        pool = encode(model, [f"{p['title']} {p['text']}" for p in r["pool"]])
        cosines = pool @ encode(model, [r["question"]])[0]
        assert len(r["pool"]) == 6 and np.all(np.diff(cosines) <= 1e-5)
