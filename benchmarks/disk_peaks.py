"""How much disk each test takes at its peak: a pytest plugin, for keeping the suite runnable on
a machine with little free disk (a GRPO test's checkpoints hold GBs of optimizer state).

It samples the used bytes of the file system holding pytest's temporary folders once a second
and, after each test, appends one line to the log: the test's start, peak and end, in GiB, and
its node id. At the end it prints the tests whose peak or end differs from their start by more
than 0.3 GiB. Other processes on the machine count too: run it on a quiet machine.

Run: PYTHONPATH=benchmarks .venv/bin/pytest -p disk_peaks  (DISK_PEAKS_LOG, default
outputs/disk_peaks.log, names the log; it is appended to)
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

GIB = 1 << 30
SHOWN = 0.3  # GiB: smaller swings are logs and caches
LOG = Path(os.environ.get("DISK_PEAKS_LOG", "outputs/disk_peaks.log"))
ROOT = tempfile.gettempdir()  # pytest's basetemp, Ray's session folders and the test outputs
_peak = {"used": 0, "start": 0}
_rows: list[tuple[float, float, float, str]] = []


def _used() -> int:
    return shutil.disk_usage(ROOT).used


def _sample() -> None:
    while True:
        _peak["used"] = max(_peak["used"], _used())
        time.sleep(1)


def pytest_sessionstart(session: object) -> None:
    LOG.parent.mkdir(parents=True, exist_ok=True)
    threading.Thread(target=_sample, daemon=True).start()


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _peak["start"] = _peak["used"] = _used()


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    start, end = _peak["start"] / GIB, _used() / GIB
    peak = max(_peak["used"] / GIB, end)
    _rows.append((start, peak, end, nodeid))
    with LOG.open("a") as fh:
        fh.write(f"start={start:.2f} peak={peak:.2f} end={end:.2f} GiB  {nodeid}\n")


def pytest_terminal_summary(terminalreporter: object) -> None:
    write = terminalreporter.write_line  # type: ignore[attr-defined]
    write(f"disk: tests whose use of {ROOT}'s file system moved more than {SHOWN} GiB")
    for start, peak, end, nodeid in _rows:
        if max(peak - start, abs(end - start)) > SHOWN:
            write(f"  peak +{peak - start:.2f}  end {end - start:+.2f} GiB  {nodeid}")
