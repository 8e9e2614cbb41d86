"""Errors that name the file, the record and what is wrong with it."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Reject:
    path: str
    locator: str  # "line 12", "index 3", "row '4367'"
    record_id: str
    problem: str

    def __str__(self) -> str:
        rid = f" (id {self.record_id})" if self.record_id else ""
        return f"{self.path}: {self.locator}{rid}: {self.problem}"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


class DataError(ValueError):
    """A bad file or record; the message names file, record and problem."""

    def __init__(self, reject: Reject) -> None:
        super().__init__(str(reject))
        self.reject = reject


class RecordProblem(ValueError):
    """Raised by a parser for one record; the loader adds file and locator."""

    def __init__(self, problem: str, record_id: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.record_id = record_id
