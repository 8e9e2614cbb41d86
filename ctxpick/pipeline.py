"""The main job (`ctxpick demo`, `make demo`): pools and mining -> each training stage in
order -> evaluation of the trained pickers against the baselines. Every phase is the same
code its own command runs, in its own folder under ``output_dir``, so a re-run resumes."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from ctxpick.config import Config, compose
from ctxpick.eval.harness import run_eval
from ctxpick.mining.run import run_mining
from ctxpick.rl.report import plot_training, training_table
from ctxpick.rl.trainer import train


def run_demo(cfg: Config, overrides: list[str]) -> Path | None:
    """``overrides``: the command line's, so every phase sees the same experiment. Returns the
    evaluation report (None with ``demo.evaluate=false``)."""
    root, t0, demo = Path(cfg.output_dir).resolve(), time.time(), cfg.demo
    # An ablation (conf/ablation/) trains on another run's data and may reuse its stages.
    data_root = Path(demo.from_run).resolve() if demo.from_run else root
    configs = stage_configs(cfg, overrides, root, data_root)
    phases = len(configs) + 2
    if demo.from_run:
        print(f"== [1/{phases}] data from {data_root} ==", flush=True)
    else:
        # With its own data for the warm start and the GRPO stages alike, no stage reads the
        # generator's mined sets: mining them would cost ~4 s a question for nothing.
        if demo.rl_data == "mined" or not demo.warmup_data:
            print(f"== [1/{phases}] pools and evidence mining ==", flush=True)
            run_mining(replace(cfg, output_dir=str(root / "mine")))
        else:
            print(f"== [1/{phases}] no mining: every stage trains on the warm-start data ==")
        if demo.warmup_data:
            print("== warm-start data ==", flush=True)
            run_mining(warmup_data_config(cfg, overrides, data_root))

    trained, metrics = {}, {}
    for i, (name, stage_cfg) in enumerate(configs.items(), 2):
        if name in demo.reuse:
            final = data_root / name / "final"
            print(f"== [{i}/{phases}] {name}: reused from {final} ==", flush=True)
        else:
            print(
                f"== [{i}/{phases}] training: {name} ({time.time() - t0:.0f}s so far) ==",
                flush=True,
            )
            final = train(stage_cfg)
            metrics[name] = root / name / "metrics.jsonl"
        trained[name] = (str(final), stage_cfg.stage.kind)
    # The warm start is a picker worth comparing only as the last stage (warm start only).
    last = list(trained)[-1]
    pickers = {n: p for n, (p, kind) in trained.items() if kind == "grpo" or n == last}
    (root / "pickers.json").write_text(json.dumps(pickers, indent=2) + "\n")
    curve = None
    if metrics:
        curve = plot_training(metrics, root / "reward_curve.png")
        table = training_table(metrics)
        (root / "training.md").write_text(table + "\n")
        print(f"\n{table}\n\nreward curve: {curve}", flush=True)
    if not demo.evaluate:
        print(f"pickers: {root / 'pickers.json'} (demo.evaluate=false: no evaluation)")
        return None

    print(f"== [{phases}/{phases}] evaluation ({time.time() - t0:.0f}s so far) ==", flush=True)
    report = run_eval(eval_config(cfg, overrides, root / "eval", pickers)).report
    print(f"\ntraining: {root / 'training.md'}  reward curve: {curve}")
    print(f"evaluation report: {report}\nall outputs: {root}")
    print(f"main job finished in {time.time() - t0:.0f}s", flush=True)
    return report


def warmup_data_config(cfg: Config, overrides: list[str], data_root: Path) -> Config:
    """The mining that writes the warm start's records (``demo.warmup_data``)."""
    folder = data_root / "warmup_data"
    return compose([*overrides, *cfg.demo.warmup_data, f"output_dir={folder}"])


def stage_configs(
    cfg: Config, overrides: list[str], root: Path, data_root: Path
) -> dict[str, Config]:
    """Each stage's config, in order, skipped ones left out: the command line's overrides,
    then the stage's own, then ``demo.stage_overrides``, each stage from the ``final/`` of the
    one before (a reused one's in ``data_root``), on the records its kind trains on."""
    demo, configs, previous = cfg.demo, {}, None
    stages = demo.stages or {"stage1": ["stage=stage1"], "stage2": ["stage=stage2"]}
    for name, own in stages.items():
        if name in demo.skip:
            continue
        chain = [f"stage.init_from={previous}"] if previous else []
        stage_cfg = compose(
            [*overrides, *own, *demo.stage_overrides, *chain, f"output_dir={root / name}"]
        )
        warm_records = stage_cfg.stage.kind == "sft" or demo.rl_data == "warmup_data"
        folder = "warmup_data" if warm_records and demo.warmup_data else "mine"
        mined = str(data_root / folder / "mined.jsonl")
        configs[name] = replace(stage_cfg, rl=replace(stage_cfg.rl, mined=mined))
        previous = (data_root if name in demo.reuse else root) / name / "final"
    return configs


def eval_config(cfg: Config, overrides: list[str], out: Path, pickers: dict[str, str]) -> Config:
    """The main job's evaluation of the ``pickers`` it trained (label -> folder), beside any
    ``eval.pickers`` the command configures (e.g. a shipped picker), on
    ``demo.eval_sources``; a trained stage's label wins over a configured one."""
    eval_cfg = compose([*overrides, *cfg.demo.eval, f"output_dir={out}"])
    return replace(
        eval_cfg,
        eval=replace(eval_cfg.eval, pickers=eval_cfg.eval.pickers | pickers),
        # path=None: the one-file shorthand would otherwise replace the sources again.
        data=replace(
            eval_cfg.data, sources=cfg.demo.eval_sources or eval_cfg.data.sources, path=None
        ),
    )
