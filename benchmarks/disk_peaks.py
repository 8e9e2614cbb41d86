"""How much disk each test takes at its peak: a pytest plugin, for keeping the suite runnable on
a machine with little free disk (a GRPO test's checkpoints hold GBs of optimizer state).

It samples the used bytes of the file system holding pytest's temporary folders once a second
and, after each test, appends one line to the log: the test's start, peak and end, in GiB, and
its node id. At the end it prints the tests whose peak or end differs from their start by more
than 0.3 GiB, and the whole run's peak above its start (what the suite needs free, the
set-up's venv and models aside). Other processes on the machine count too: run it on a quiet
machine.

Run: PYTHONPATH=benchmarks .venv/bin/pytest -p disk_peaks  (DISK_PEAKS_LOG, default
outputs/disk_peaks.log, names the log; it is appended to, each run after a line of its own)
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

GIB = 1 << 30
SHOWN = 0.3  # GiB: smaller swings are logs and caches
LOG = Path(os.environ.get("DISK_PEAKS_LOG", "outputs/disk_peaks.log"))
ROOT = tempfile.gettempdir()  # pytest's basetemp, Ray's session folders and the test outputs
# The sampler thread and the hooks both write the peak: a reset between the sampler's read and
# its write would charge the previous test's peak to the next one.
_lock = threading.Lock()
_peak = {"test": 0, "start": 0, "run": 0, "run_start": 0}
_rows: list[tuple[float, float, float, str]] = []


def _used() -> int:
    return shutil.disk_usage(ROOT).used


def _sample() -> None:
    while True:
        used = _used()
        with _lock:
            _peak["test"] = max(_peak["test"], used)
            _peak["run"] = max(_peak["run"], used)
        time.sleep(1)


def pytest_sessionstart(session: pytest.Session) -> None:
    _peak["run"] = _peak["run_start"] = _used()
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("a") as fh:
        fh.write(f"# run of {time.strftime('%Y-%m-%d %H:%M:%S')}, file system of {ROOT}\n")
    threading.Thread(target=_sample, daemon=True).start()


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    with _lock:
        _peak["start"] = _peak["test"] = _used()


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    end = _used()
    with _lock:
        start, peak = _peak["start"] / GIB, max(_peak["test"], end) / GIB
    _rows.append((start, peak, end / GIB, nodeid))
    with LOG.open("a") as fh:
        fh.write(f"start={start:.2f} peak={peak:.2f} end={end / GIB:.2f} GiB  {nodeid}\n")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    write = terminalreporter.write_line
    with _lock:
        run = (_peak["run"] - _peak["run_start"]) / GIB
    write(f"disk: the run's peak was {run:.2f} GiB above its start on {ROOT}'s file system")
    write(f"disk: tests whose use of it moved more than {SHOWN} GiB")
    for start, peak, end, nodeid in _rows:
        if max(peak - start, abs(end - start)) > SHOWN:
            write(f"  peak +{peak - start:.2f}  end {end - start:+.2f} GiB  {nodeid}")
