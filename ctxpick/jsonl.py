"""Append-only JSONL outputs keyed by id: what makes long jobs resumable."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def read_done(path: Path) -> dict[str, dict[str, Any]]:
    """Records already written, by id. A line that is not a JSON record with an ``id`` (a line
    torn by a killed driver, a hand edit) is reported and skipped, never removed: the file is
    only ever appended to, so no record after it is lost."""
    done: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return done
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except ValueError as err:  # JSONDecodeError, or bytes that are not UTF-8
                log.warning("%s:%d: skipped, not valid JSON (%s)", path, lineno, err)
                continue
            if not isinstance(rec, dict) or "id" not in rec:
                log.warning("%s:%d: skipped, not a JSON object with an 'id'", path, lineno)
                continue
            done[rec["id"]] = rec
    return done


class JsonlWriter:
    """Append-only JSONL, flushed per record: a killed job loses at most the line in flight."""

    def __init__(self, path: Path) -> None:
        # A line torn by a crash has no newline: the next record must not be glued onto it.
        torn = path.exists() and path.stat().st_size > 0 and _last_byte(path) != b"\n"
        self.fh = path.open("a", encoding="utf-8")
        if torn:
            self.fh.write("\n")
            self.fh.flush()

    def write(self, rec: dict[str, Any]) -> None:
        self.fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def _last_byte(path: Path) -> bytes:
    with path.open("rb") as fh:
        fh.seek(-1, 2)
        return fh.read(1)
