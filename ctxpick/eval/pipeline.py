"""The main job (`ctxpick demo`, `make demo`): pools and mining -> each training stage in
order -> evaluation of the trained pickers against the baselines. Every phase is the same
code its own command runs, in its own folder under ``output_dir``, so a re-run resumes."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from ctxpick.config import Config, compose
from ctxpick.eval.harness import run_eval
from ctxpick.mining.run import run_mining
from ctxpick.rl.report import plot_training, training_table
from ctxpick.rl.trainer import train


def run_demo(cfg: Config, overrides: list[str]) -> Path:
    """``overrides``: the command line's, so every phase sees the same experiment."""
    root, t0 = Path(cfg.output_dir).resolve(), time.time()
    stages = cfg.demo.stages or {"stage1": ["stage=stage1"], "stage2": ["stage=stage2"]}
    phases = len(stages) + 2
    print(f"== [1/{phases}] pools and evidence mining ==", flush=True)
    mined = root / "mine" / "mined.jsonl"
    run_mining(replace(cfg, output_dir=str(root / "mine")))

    previous, pickers, metrics = None, {}, {}
    for i, (name, stage_overrides) in enumerate(stages.items(), 2):
        print(f"== [{i}/{phases}] training: {name} ({time.time() - t0:.0f}s so far) ==", flush=True)
        chain = [f"stage.init_from={previous}"] if previous else []
        stage_cfg = compose(
            [*overrides, *stage_overrides, *chain, f"output_dir={root / name}", f"rl.mined={mined}"]
        )
        previous = train(stage_cfg)
        metrics[name] = root / name / "metrics.jsonl"
        if stage_cfg.stage.kind == "grpo":  # the warm start is not a picker worth comparing
            pickers[name] = str(previous)
    curve = plot_training(metrics, root / "reward_curve.png")
    table = training_table(metrics)
    (root / "training.md").write_text(table + "\n")
    print(f"\n{table}\n\nreward curve: {curve}", flush=True)

    print(f"== [{phases}/{phases}] evaluation ({time.time() - t0:.0f}s so far) ==", flush=True)
    eval_cfg = compose([*overrides, *cfg.demo.eval, f"output_dir={root / 'eval'}"])
    eval_cfg = replace(
        eval_cfg,
        eval=replace(eval_cfg.eval, pickers=pickers),
        # path=None: the one-file shorthand would otherwise replace the sources again.
        data=replace(
            eval_cfg.data, sources=cfg.demo.eval_sources or eval_cfg.data.sources, path=None
        ),
    )
    report = run_eval(eval_cfg)
    print(f"\ntraining: {root / 'training.md'}  reward curve: {curve}")
    print(f"evaluation report: {report}\nall outputs: {root}")
    print(f"main job finished in {time.time() - t0:.0f}s", flush=True)
    return report
