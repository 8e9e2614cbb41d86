"""The quality recipe and the paper's ablations, as one resumable command (issue 10).

1. The recipe: ``ctxpick demo experiment=cpu_quality`` into ``--out`` (mines a subset of the
   training-split files in ../shared/data/train, warm start on every training question's human
   evidence, Stage I -> Stage II, evaluation on the dev-split files with every baseline).
2. The ablations (``conf/ablation/``), one Hydra multirun from the recipe's data and warm start:
   without Stage I, without the rationale (ids-only output), without the redundancy term
   (gamma = 0), warm start only.
3. One evaluation of every variant in the recipe's evaluation folder: the baselines' and the
   recipe's rows are reused (records are keyed by what produced them), only new pickers run.
4. ``ablations.md`` in ``--out``: the paper's ablation layout, with 95% bootstrap intervals.

Every phase resumes: re-run the same command after an interruption. Sizes are the recipe's
config (conf/experiment/cpu_quality.yaml); pass Hydra overrides after ``--`` to change them
for every phase (e.g. ``-- mining.max_questions=null`` on a GPU machine).

Run: .venv/bin/python benchmarks/bench_quality.py [--out outputs/cpu_quality]
     [--ablations no_stage1,no_rationale,no_redundancy,warmup_only,human_rl,qwen_lora]
     [--all-stages qwen_lora] [-- overrides]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from common import REPO, SHARED

ABLATIONS = {
    "no_stage1": "w/o Stage I",
    "no_rationale": "w/o rationale (ids only)",
    "no_redundancy": "w/o redundancy term (gamma = 0, no margin cut)",
    "warmup_only": "warm start only (no RL)",
    "human_rl": "lever: GRPO on the human evidence",  # not a paper ablation
    "qwen_lora": "lever: Qwen2.5-Coder-0.5B + LoRA picker, GRPO on the human evidence",
}


def ctxpick(*args: str) -> None:
    """One phase as its own process: each starts and stops its own Ray cluster."""
    cmd = [sys.executable, "-m", "ctxpick.cli", *args]
    print("$ " + " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, cwd=REPO, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="outputs/cpu_quality")
    ap.add_argument(
        "--ablations",
        default=",".join(ABLATIONS),
        help="comma-separated subset of: " + ", ".join(ABLATIONS) + " (empty: none)",
    )
    ap.add_argument(
        "--all-stages",
        default="",
        help="comma-separated variants whose every stage (its own warm start included) is "
        "evaluated, not only the last",
    )
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every phase")
    args = ap.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"{SHARED} is absent: the recipe trains and evaluates on ../shared/data")
    out = (REPO / args.out).resolve()
    recipe = ["experiment=cpu_quality", *args.overrides]

    # The recipe's pickers are evaluated below, with every variant's, in the same folder
    ctxpick("demo", *recipe, f"output_dir={out}", "demo.evaluate=false")
    variants = {f"picker:{name}": f"full recipe ({name})" for name in ("stage1", "stage2")}
    pickers = json.loads((out / "pickers.json").read_text())
    chosen = [a for a in args.ablations.split(",") if a]
    if unknown := set(chosen) - set(ABLATIONS):
        sys.exit(f"unknown ablations {sorted(unknown)}; known: {', '.join(ABLATIONS)}")
    if chosen:
        ctxpick(
            "demo",
            "--multirun",
            *recipe,
            f"ablation={','.join(chosen)}",
            f"demo.from_run={out}",
            f"hydra.sweep.dir={out / 'ablations'}",
            "hydra.sweep.subdir=${hydra:runtime.choices.ablation}",
        )
        every = set(args.all_stages.split(",")) - {""}
        for name in chosen:
            folder = out / "ablations" / name
            trained = json.loads((folder / "pickers.json").read_text())
            pickers[name] = list(trained.values())[-1]  # the variant's last stage
            variants[f"picker:{name}"] = ABLATIONS[name]
            if name in every:  # its earlier stages too: where along the way it collapses
                earlier = dict(list(trained.items())[:-1])
                if (folder / "warmup" / "final").is_dir():  # a warm start of its own
                    earlier = {"warmup": str(folder / "warmup" / "final")} | earlier
                for stage, path in earlier.items():
                    pickers[f"{name}.{stage}"] = path
                    variants[f"picker:{name}.{stage}"] = f"{ABLATIONS[name]}: {stage}"

    from ctxpick.config import compose
    from ctxpick.eval.harness import run_eval
    from ctxpick.eval.report import ablation_table
    from ctxpick.pipeline import eval_config

    eval_cfg = eval_config(compose(recipe), recipe, out / "eval", pickers)
    run = run_eval(eval_cfg)
    table = ablation_table(run.records, variants)
    (out / "ablations.md").write_text(
        "# Ablations of the quality recipe\n\n"
        f"Command: `python benchmarks/bench_quality.py {' '.join(sys.argv[1:])}`. "
        "Judged accuracy per dataset and on the average, evidence F1 against the human gold, "
        "context tokens; 95% bootstrap intervals; `n` questions.\n\n" + table + "\n"
    )
    print(f"\n{table}\n\nreport: {run.report}\nablations: {out / 'ablations.md'}", flush=True)


if __name__ == "__main__":
    main()
