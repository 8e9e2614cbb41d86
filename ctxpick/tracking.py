"""Weights & Biases, offline unless the user asks otherwise."""

from __future__ import annotations

import os
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

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if self.run is not None:
            self.run.log(metrics, step=step)

    def summary(self, metrics: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.summary.update(metrics)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
