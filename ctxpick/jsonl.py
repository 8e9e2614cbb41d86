"""Append-only JSONL outputs keyed by id: what makes long jobs resumable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_done(path: Path) -> dict[str, dict[str, Any]]:
    """Records already written, by id. A line torn by a killed driver is cut off, so the file
    stays valid JSONL for the re-run to append to."""
    done: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return done
    good = 0
    with path.open("rb") as fh:
        for raw in fh:
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError:
                break
            if not raw.endswith(b"\n"):
                break
            done[rec["id"]] = rec
            good += len(raw)
    if good != path.stat().st_size:
        with path.open("r+b") as fh:
            fh.truncate(good)
    return done


class JsonlWriter:
    """Append-only JSONL, flushed per record: a killed job loses at most the line in flight."""

    def __init__(self, path: Path) -> None:
        self.fh = path.open("a", encoding="utf-8")

    def write(self, rec: dict[str, Any]) -> None:
        self.fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()
