"""Weights & Biases, offline unless the user asks otherwise."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class Tracker:
    def __init__(
        self, project: str, mode: str, run_dir: str, name: str, config: dict[str, Any]
    ) -> None:
        self.run = None
        if mode == "disabled":
            return
        os.environ.setdefault("WANDB_MODE", mode)
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self.run = wandb.init(project=project, mode=mode, dir=run_dir, name=name, config=config)

    def log(
        self,
        metrics: dict[str, Any],
        step: int | None = None,
        tables: dict[str, tuple[list[str], list[list[Any]]]] | None = None,
        images: dict[str, Path] | None = None,
    ) -> None:
        """``tables``: name -> (columns, rows); ``images``: name -> PNG; logged at the same step."""
        if self.run is None:
            return
        if tables or images:
            import wandb

            metrics = metrics | {
                name: wandb.Table(columns=cols, data=rows)
                for name, (cols, rows) in (tables or {}).items()
            }
            metrics |= {name: wandb.Image(str(path)) for name, path in (images or {}).items()}
        self.run.log(metrics, step=step)

    def summary(self, metrics: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.summary.update(metrics)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
