"""Weights & Biases, offline unless the user asks otherwise.

One run per job folder: its id is kept in ``<folder>/wandb_run_id``, so a resumed job continues
the same run (``resume="allow"``) instead of starting a second one. The config and the git
commit go into the run's config. Jobs hand their outputs on as artifacts (mined dataset ->
stage weights -> evaluation report), each run declaring the artifacts it read, so W&B shows the
lineage. Artifacts hold file references, not copies: model weights are not duplicated.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path
from typing import Any

from ctxpick.paths import REPO_ROOT


def git_commit() -> str:
    """The code's commit (with ``-dirty`` when the tree has changes), or ``unknown``."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def artifact_name(path: str | Path) -> str:
    """A stable artifact name for an output folder or file: the same path, the same name."""
    import hashlib

    resolved = str(Path(path).resolve())
    stem = "-".join(Path(resolved).parts[-2:]).replace(".", "_")
    return f"{stem}-{hashlib.sha1(resolved.encode()).hexdigest()[:8]}"


class Tracker:
    def __init__(
        self,
        project: str,
        mode: str,
        run_dir: str,
        name: str,
        config: dict[str, Any],
        group: str | None = None,
    ) -> None:
        self.run, self.inputs = None, []
        if mode == "disabled":
            return
        os.environ.setdefault("WANDB_MODE", mode)
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        id_file = Path(run_dir) / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(6)
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        id_file.write_text(run_id + "\n")
        self.run = wandb.init(
            project=project,
            mode=mode,
            dir=run_dir,
            name=name,
            id=run_id,
            resume="allow",
            group=group,
            config={**config, "git_commit": git_commit()},
        )

    @classmethod
    def for_job(cls, cfg: Any, run_dir: str | Path, name: str) -> Tracker:
        """The run of a job with the ctxpick config ``cfg``: its ``wandb`` settings, the whole
        config as the run's config; a sweep's points share its group, each named by its job
        folder (the ``job`` column of ``sweep.md``)."""
        from dataclasses import asdict

        wb = cfg.wandb
        label = f"{name} {Path(run_dir).name}" if wb.group else name
        return cls(wb.project, wb.mode, str(run_dir), label, asdict(cfg), wb.group or None)

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

    def _artifact(self, path: str | Path, kind: str) -> Any:
        import wandb

        art = wandb.Artifact(artifact_name(path), type=kind, metadata={"inputs": self.inputs})
        art.add_reference(Path(path).resolve().as_uri(), checksum=True)
        return art

    def use_artifact(self, path: str | Path, kind: str) -> None:
        """Declare an input (the mined dataset, a previous stage's weights) for lineage. An
        offline run cannot call W&B's ``use_artifact``; it records the input's artifact name in
        its config and in the metadata of the artifacts it logs, which ``wandb sync`` keeps."""
        if self.run is None or not Path(path).exists():
            return
        self.inputs.append(f"{artifact_name(path)}:{kind}")
        self.run.config.update({"artifact_inputs": self.inputs}, allow_val_change=True)
        if not self.run.offline:
            self.run.use_artifact(self._artifact(path, kind))

    def log_artifact(self, path: str | Path, kind: str) -> None:
        """Declare an output: the mined dataset, a stage's ``final/``, an evaluation report."""
        if self.run is not None:
            self.run.log_artifact(self._artifact(path, kind))

    def summary(self, metrics: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.summary.update(metrics)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
