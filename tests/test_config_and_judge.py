import subprocess
import sys

import pytest
from conftest import SAMPLES

from ctxpick.config import ConfigError, compose
from ctxpick.judge.rules import abstains, contains_answer, exact_match, rule_judge, token_f1


def test_demo_config_composes():
    cfg = compose(["experiment=demo"])
    assert cfg.model.name == "qwen2.5-coder-0.5b"  # chosen from benchmarks/RESULTS.md
    # The picker trains on the pool inference shows it, in its order (rl.pool_order=pool).
    assert cfg.mining.pool.query == cfg.retrieval.pool.query == "question"
    assert cfg.rl.pool_order == "pool"
    assert all(s.resolved_path().is_file() for s in cfg.data.sources)
    assert compose(["stage=stage2"]).stage.redundancy_margin < compose([]).stage.redundancy_margin


@pytest.mark.parametrize(
    "override, message",
    [
        ("+retrieval.pool.kk=3", "Key 'kk' not in 'PoolConfig'"),
        ("retrieval.pool.kk=3", "Key 'kk' not in 'PoolConfig'"),
        ("retrieval.pool.k=0", "'retrieval': pool k must be positive"),
        ("stage.gamma=lots", "could not be converted"),
        ("retrieval.chunking.method=paragraph", "chunking.method"),
        ("data.sources.0.format=csv", "unknown format 'csv'"),
        ("wandb.mode=cloud", "wandb.mode"),
        ("picker.output=json", "picker.output must be one of"),
        ("stage.id_weight=0", "stage.id_weight must be > 0"),
        ("rl.pool_order=ranked", "rl.pool_order must be pool or shuffle"),
        # ranked with the answer, the pool's order would leak it into training
        ("mining.pool.query=question_answer", "rl.pool_order=pool trains on the mining pool"),
        ("retrieval.pool.retriever=dense", "ranked by mining.pool.retriever='bm25'"),
        ("retrieval.pool.retriever=splade", "pool retriever must be one of"),
        ("demo.reuse=[warmup]", "demo.reuse takes stages from another run"),
        ("demo.rl_data=human", "demo.rl_data must be mined or warmup_data"),
        ("rl.placement_strategy=RANDOM", "unknown rl.placement_strategy"),
        ("ray.reserve_timeout_s=0", "ray.reserve_timeout_s=0.0: seconds > 0, or null"),
        # NaN compares false both ways: a `<= 0` check would let it wait forever
        ("ray.reserve_timeout_s=nan", "ray.reserve_timeout_s=nan: seconds > 0, or null"),
        ("rewards.timeout_s=nan", "rewards.timeout_s must be > 0"),
        ("serve.batch_wait_timeout_s=nan", "serve.batch_wait_timeout_s=nan: expected finite"),
        ("serve.batch_wait_timeout_s=inf", "serve.batch_wait_timeout_s=inf: expected finite"),
        ("+rl.dataset_repeats.musique=0", "rl.dataset_repeats must be whole numbers >= 1"),
        ("rl.async_level=2", "rl.async_level must be 0 or 1"),
        ("model.engine.dtype=fp8", "engine dtype 'fp8': expected one of"),
        ("stage.rationale=why", "stage.rationale must be one of .'titles', 'contributions'."),
        # samples one version old need the sampler's log-probs to correct them
        ("rl.async_level=1", "set rl.learner.grpo.tis_cap"),
        # ZeRO-3 ranks gather the LM head once per chunk: one chunk each, or they would wait
        ("rl.learner.zero_stage=3,picker.max_tokens=300", "needs rl.learner.logprob_chunk"),
    ],
)
def test_bad_config_fails_at_start(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        compose(override.split(","))


@pytest.mark.parametrize(
    "ablation", ["no_stage1", "no_rationale", "no_redundancy", "warmup_only", "human_rl"]
)
def test_ablations_compose_on_the_quality_recipe(ablation):
    """Each of the paper's ablations (and the human-evidence lever) changes one thing of the
    recipe, on the recipe's data."""
    recipe = compose(["experiment=cpu_quality"])
    cfg = compose(["experiment=cpu_quality", f"ablation={ablation}", "demo.from_run=runs/q"])
    assert not cfg.demo.evaluate and cfg.demo.stages == recipe.demo.stages
    assert cfg.data == recipe.data and cfg.mining == recipe.mining
    changed = {
        "no_stage1": (["stage1"], ["warmup"], [], "rationale_ids"),
        "no_rationale": ([], [], [], "ids"),
        "no_redundancy": (
            [],
            ["warmup"],
            ["stage.gamma=0", "stage.redundancy_margin=100"],
            "rationale_ids",
        ),
        "warmup_only": (["stage1", "stage2"], ["warmup"], [], "rationale_ids"),
        "human_rl": ([], ["warmup"], [], "rationale_ids"),
    }[ablation]
    got = (cfg.demo.skip, cfg.demo.reuse, cfg.demo.stage_overrides, cfg.picker.output)
    assert got == changed
    assert cfg.demo.rl_data == ("warmup_data" if ablation == "human_rl" else "mined")
    if ablation == "no_rationale":
        assert "<ids>[passage numbers]</ids>" in cfg.picker.instruction
        assert "<rationale>" not in cfg.picker.instruction


def test_cli_reports_bad_config_and_data_stats():
    run = [sys.executable, "-m", "ctxpick.cli"]
    bad = subprocess.run([*run, "config", "retrieval.pool.k=-2"], capture_output=True, text=True)
    assert bad.returncode != 0 and "pool k must be positive" in bad.stderr
    stats = subprocess.run(
        [*run, "data", "stats", str(SAMPLES / "musique_30.jsonl"), "--format", "musique"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "questions       30" in stats.stdout and "gold units/q" in stats.stdout


def test_judge_rules():
    assert exact_match("The Beatles!", ["beatles"])
    assert not exact_match("Beatles band", ["beatles"])
    assert contains_answer("It was the Beatles band", ["Beatles"])
    assert not contains_answer("Beatlesque", ["Beatles"])
    assert token_f1("new york city", ["New York"]) == pytest.approx(0.8)
    assert token_f1("", ["x"]) == 0.0
    assert abstains("The passages do not mention it") and abstains("Not mentioned.")
    assert rule_judge("not mentioned", ["Not mentioned in the conversation"], unanswerable=True)
    assert not rule_judge("Paris", ["x"], unanswerable=True)
    assert not rule_judge("not mentioned", ["Paris"])
    assert rule_judge("2022", ["2022"])


def test_each_stage_names_its_reading_of_eq8():
    """Stage I rewards recall (Eq. 8 as printed), Stage II compression (as described), whether
    a stage runs on its own or in a recipe; the reward service no longer holds the reading."""
    from ctxpick.config import reward_spec

    for stage, eq8 in (("stage1", "printed"), ("stage2", "described"), ("warmup", "printed")):
        assert reward_spec(compose([f"stage={stage}"])).eq8 == eq8
        assert reward_spec(compose(["experiment=cpu_quality", f"stage={stage}"])).eq8 == eq8
    with pytest.raises(ConfigError, match="stage.eq8 must be one of"):
        compose(["stage.eq8=other"])
    with pytest.raises(ConfigError, match="rewards.eq8"):
        compose(["rewards.eq8=printed"])


def test_the_crossenc_recipe_trains_on_the_crossenc_retrieval_groups_pool():
    """The recipe meant to give the first shipped picker ranks its pool exactly as
    `retrieval=crossenc` (the pool a shipped picker is evaluated and served on) does."""
    from ctxpick.config import inference_pool, picker_spec

    spec = picker_spec(compose(["experiment=cpu_quality", "ablation=qwen_lora_crossenc"]))
    assert spec.pool["retriever"] == "crossenc"
    assert not spec.pool_mismatch(inference_pool(compose(["retrieval=crossenc"])))


def _card_commands(card, cwd):
    """The ``ctxpick`` commands of the model card's bash blocks (the one command, then the same
    run step by step), each as (subcommand, overrides): bash itself runs each block in ``cwd``
    and expands it, with ``ctxpick`` a shell function that prints its arguments."""
    import re

    blocks = re.findall(r"```bash\n(.*?)```", card, re.S)
    assert len(blocks) >= 2, "the card's one command and its steps are its first two bash blocks"
    echo = "ctxpick() { printf '%s\\0' \"$@\"; printf '\\n'; }\n"
    runs = [
        subprocess.run(
            ["bash", "-euc", echo + block], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.splitlines()
        for block in blocks[:2]
    ]
    return [[(line.split("\0")[0], line.split("\0")[1:-1]) for line in run] for run in runs]


def test_the_shipped_pickers_one_command_trains_as_its_cards_steps(tmp_path, monkeypatch):
    """The model card rebuilds `ctxpick-picker-0.5b` with one command (the main job on
    `ablation=ctxpick_picker_0_5b`) and lists the step-by-step commands it was trained with:
    the two write the same data and train each stage with the same configuration into the same
    folders, so either resumes the other, and the picker they train reads as the shipped one
    (its prompt, passage cut and pool)."""
    from dataclasses import replace
    from pathlib import Path

    from ctxpick.config import DemoConfig, picker_spec
    from ctxpick.picker.shipped import SHIPPED
    from ctxpick.picker.spec import PickerSpec
    from ctxpick.pipeline import stage_configs, warmup_data_config

    def same(a, b):
        """Equal but for the folder written (compared apart) and the main job's own keys."""
        return replace(a, output_dir="", demo=DemoConfig()) == replace(
            b, output_dir="", demo=DemoConfig()
        )

    shipped = SHIPPED["ctxpick-picker-0.5b"].folder
    monkeypatch.chdir(tmp_path)
    [[(command, one)], steps] = _card_commands((shipped / "MODEL_CARD.md").read_text(), tmp_path)
    assert command == "demo" and len(one) == 3
    cfg = compose(one)
    root = Path(cfg.output_dir).resolve()
    stages = stage_configs(cfg, one, root, root)
    assert [cmd for cmd, _ in steps] == ["mine", "train", "train"]

    data, by_hand = warmup_data_config(cfg, one, root), compose(steps[0][1])
    assert Path(by_hand.output_dir).resolve() == Path(data.output_dir)
    # Mining reads no rl.mined (its default follows output_dir, named relative here).
    unset = [replace(c, rl=replace(c.rl, mined="")) for c in (by_hand, data)]
    assert same(*unset) and by_hand.mining.max_questions is None
    assert list(stages) == ["warmup", "stage1"]
    for (_, overrides), (name, stage_cfg) in zip(steps[1:], stages.items(), strict=True):
        by_hand = compose(overrides)
        assert Path(by_hand.output_dir).resolve() == root / name
        assert same(by_hand, stage_cfg) and by_hand.seed == 2
    assert stages["stage1"].stage.init_from == str(root / "warmup" / "final")
    assert stages["stage1"].rl.mined == str(root / "warmup_data" / "mined.jsonl")
    spec = picker_spec(stages["stage1"])
    assert replace(spec, constrained=True) == PickerSpec.load(shipped)
