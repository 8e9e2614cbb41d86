"""Read the containers upstream datasets come in: JSON Lines, a JSON list, or a pandas
column-oriented JSON object ``{field: {row: value}}``; each record comes with a locator that
error messages use."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ctxpick.data.errors import DataError, Reject


def _bad_file(path: Path, problem: str) -> DataError:
    return DataError(Reject(str(path), "file", "", problem))


def read_records(path: str | Path) -> Iterator[tuple[str, Any]]:
    """Yield ``(locator, record)`` for every record in ``path`` whatever its container."""
    path = Path(path)
    if not path.is_file():
        raise _bad_file(path, "no such file")
    with path.open(encoding="utf-8") as fh:
        head = fh.read(1)
        while head and head.isspace():
            head = fh.read(1)
    if not head:
        raise _bad_file(path, "file is empty")
    if head == "[":
        yield from _read_json_list(path)
        return
    if head != "{":
        raise _bad_file(path, f"not JSON or JSON Lines (starts with {head!r})")
    if _is_jsonl(path):
        yield from _read_jsonl(path)
        return
    yield from _read_columns(path)


def _is_jsonl(path: Path) -> bool:
    """True when the first line is a whole JSON value and more lines follow; a file holding a
    single JSON object on one line is read as a document (it may be column-oriented)."""
    with path.open(encoding="utf-8") as fh:
        lines = (line for line in fh if line.strip())
        first = next(lines, None)
        if first is None:
            return False
        try:
            json.loads(first)
        except json.JSONDecodeError:
            return False  # a pretty-printed object spans lines
        return next(lines, None) is not None


def _read_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield f"line {lineno}", json.loads(line)
            except json.JSONDecodeError as err:
                # A broken line is a bad record like any other: the loader decides whether it
                # stops the run (strict) or goes to the rejects report.
                yield (
                    f"line {lineno}",
                    UnparsableRecord(f"invalid JSON: {err.msg} at column {err.colno}"),
                )


def _load_json(path: Path) -> Any:
    try:
        with path.open(encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as err:
        raise _bad_file(path, f"invalid JSON at line {err.lineno}: {err.msg}") from err


def _read_json_list(path: Path) -> Iterator[tuple[str, Any]]:
    for i, rec in enumerate(_load_json(path)):
        yield f"index {i}", rec


def _read_columns(path: Path) -> Iterator[tuple[str, Any]]:
    data = _load_json(path)
    if not isinstance(data, dict) or not data:
        raise _bad_file(path, "expected a JSON object")
    columns = list(data.values())
    if not all(isinstance(c, dict) for c in columns):
        # A single top-level record (e.g. one LoCoMo conversation saved on its own).
        yield "record 0", data
        return
    rows = list(columns[0].keys())
    for row in rows:
        yield f"row {row!r}", {name: col.get(row) for name, col in data.items()}


class UnparsableRecord:
    """Stands in for a JSON Lines record that did not parse."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
