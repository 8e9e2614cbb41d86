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
        # The line in flight when a job was killed has no newline. Complete JSON: terminate it.
        # Torn mid-record: drop that fragment (it holds no record, and readers of the whole
        # file, such as training's, would stop on it); every line before it stays.
        tail = _unterminated_tail(path)
        if tail is not None:
            try:
                json.loads(tail)
            except ValueError:
                log.warning("%s: dropped a torn last line (%d bytes)", path, len(tail))
                with path.open("r+b") as fh:
                    fh.truncate(path.stat().st_size - len(tail))
            else:
                with path.open("ab") as fh:
                    fh.write(b"\n")
        self.fh = path.open("a", encoding="utf-8")

    def write(self, rec: dict[str, Any]) -> None:
        self.fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def _unterminated_tail(path: Path) -> bytes | None:
    """The bytes after the file's last newline, if any (None: absent, empty or terminated);
    read backwards from the end, not the whole file."""
    if not path.exists() or (size := path.stat().st_size) == 0:
        return None
    tail, pos = b"", size
    with path.open("rb") as fh:
        while pos > 0:
            step = min(1 << 16, pos)
            pos -= step
            fh.seek(pos)
            tail = fh.read(step) + tail
            if b"\n" in tail:
                break
    if tail.endswith(b"\n"):
        return None
    return tail[tail.rfind(b"\n") + 1 :]
