"""Two or more finished stages side by side, from their own logs (``metrics.jsonl``,
``result.json``): step time and its parts, validation reward at each validation step, and how
many prompts each stage's settings fit into the first stage's wall time of steps.

Made for issue 19's check of the quality recipe with the faster step: the same Stage I (same
seed, data, start and prompts) trained with the whole merged model synced every step, as before
the issue, and with the adapter alone. Step 1 is left out of the means (first generation and
first load).
Run: .venv/bin/python benchmarks/compare_stage_runs.py BEFORE_DIR AFTER_DIR [...]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from statistics import mean

from ctxpick.rl.report import read_metrics

PARTS = ("time/step", "time/sync", "time/rollout", "time/learn")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("stages", nargs="+", type=Path, help="stage output folders, the baseline first")
    args = ap.parse_args()
    table, base_wall = [], None
    for folder in args.stages:
        rows = read_metrics(folder / "metrics.jsonl")
        later = rows[1:]
        if not later:
            raise SystemExit(f"{folder}: needs at least 2 logged steps, has {len(rows)}")
        means = {k: mean(r[k] for r in later) for k in PARTS}  # a missing timing is an error
        wall = sum(r["time/step"] for r in rows)
        base_wall = base_wall or wall
        prompts = sum(r.get("prompts_drawn", 0) for r in rows)
        val = {r["step"]: r["val/reward"] for r in rows if "val/reward" in r}
        table.append((folder, len(rows), means, wall, prompts, val))
    base = table[0][2]["time/step"]
    print(f"means over steps 2.., the baseline {table[0][0]}")
    print(
        "| stage | steps | " + " | ".join(f"{k} s" for k in PARTS) + " | step ratio | "
        "sync share | wall of steps s | prompts | prompts in the baseline's wall | val reward |"
    )
    print("|---" * (len(PARTS) + 8) + "|")
    for folder, n, means, wall, prompts, val in table:
        fit = prompts * base_wall / wall
        vals = ", ".join(f"step {s}: {v:+.3f}" for s, v in sorted(val.items()))
        cells = " | ".join(f"{means[k]:.2f}" for k in PARTS)
        print(
            f"| {folder} | {n} | {cells} | {means['time/step'] / base:.2f}x | "
            f"{means['time/sync'] / means['time/step']:.1%} | {wall:.0f} | {prompts} | "
            f"{fit:.0f} | {vals} |"
        )


if __name__ == "__main__":
    main()
