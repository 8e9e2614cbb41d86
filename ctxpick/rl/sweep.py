"""One comparison table for a Hydra multirun of training stages (e.g. a sweep over
redundancy margins): a Hydra callback that reads each job's result when the sweep ends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback

from ctxpick.table import markdown_table

VAL_KEYS = ("val/reward", "val/coverage", "val/mean_size", "val/format_valid")


def sweep_table(sweep_dir: Path) -> str | None:
    """One row per finished job; the overrides column shows what sets it apart (the overrides
    every job shares are left out)."""
    jobs = sorted(sweep_dir.glob("*/result.json"), key=lambda p: p.parent.name)
    overrides = [
        yaml.safe_load((r.parent / ".hydra" / "overrides.yaml").read_text()) or [] for r in jobs
    ]
    shared = set.intersection(*map(set, overrides)) if len(jobs) > 1 else set()
    rows = []
    for result, job_overrides in zip(jobs, overrides, strict=True):
        state = json.loads(result.read_text())
        last = state["val_history"][-1] if state["val_history"] else {}
        rows.append(
            [
                result.parent.name,
                " ".join(o for o in job_overrides if o not in shared),
                str(state["step"]),
                *(f"{last[k]:.3f}" if k in last else "n/a" for k in VAL_KEYS),
                state["stop_reason"] or "max_steps",
            ]
        )
    if not rows:
        return None
    header = [
        "job",
        "overrides",
        "steps",
        "val reward",
        "val coverage",
        "val passages picked",
        "val format valid",
        "stopped by",
    ]
    return markdown_table([header, *rows])


class SweepTable(Callback):
    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        table = sweep_table(sweep_dir)
        if table:
            (sweep_dir / "sweep.md").write_text(table + "\n")
            print(f"\n{table}\n\nsweep table: {sweep_dir / 'sweep.md'}", flush=True)
