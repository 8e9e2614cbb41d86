"""How much disk and memory each test takes at its peak: a pytest plugin, for keeping the suite
runnable on a machine with little free disk (a GRPO test's checkpoints hold GBs of optimizer
state) and 24 GiB of memory (Ray kills a worker past 95% of it, and the actors of two stages
side by side come near that).

It samples, once a second, the used bytes of the file system holding pytest's temporary
folders and the machine's used memory (MemTotal - MemAvailable: what Ray's monitor counts
where no cgroup limit is tighter, page cache aside). After each test it appends one line to
the log: for each, the test's start, peak and end, in GiB, and its node id. At the end it
prints the tests whose peak or end differs from their start by more than 0.3 GiB of disk or
2 GiB of memory, and the run's peak of each above its start (the disk the suite needs free,
the set-up's venv and models aside) and in all (the memory). Other processes on the machine
count too: run it on a quiet machine.

Run: PYTHONPATH=benchmarks .venv/bin/pytest -p resource_peaks  (RESOURCE_PEAKS_LOG, default
outputs/resource_peaks.log, names the log; it is appended to, each run after a line of its own)
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
SHOWN = {"disk": 0.3, "memory": 2.0}  # GiB: smaller swings are logs, caches, one engine call
LOG = Path(os.environ.get("RESOURCE_PEAKS_LOG", "outputs/resource_peaks.log"))
ROOT = tempfile.gettempdir()  # pytest's basetemp, Ray's session folders and the test outputs


def _memory() -> int:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) * 1024


METERS = {"disk": lambda: shutil.disk_usage(ROOT).used, "memory": _memory}
# The sampler thread and the hooks both write the peaks: a reset between the sampler's read and
# its write would charge the previous test's peak to the next one.
_lock = threading.Lock()
_peak = {m: {"test": 0, "start": 0, "run": 0, "run_start": 0} for m in METERS}
_rows: list[tuple[dict[str, tuple[float, float, float]], str]] = []


def _sample() -> None:
    while True:
        for meter, read in METERS.items():
            used = read()
            with _lock:
                peak = _peak[meter]
                peak["test"], peak["run"] = max(peak["test"], used), max(peak["run"], used)
        time.sleep(1)


def pytest_sessionstart(session: pytest.Session) -> None:
    for meter, read in METERS.items():
        _peak[meter]["run"] = _peak[meter]["run_start"] = read()
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("a") as fh:
        fh.write(f"# run of {time.strftime('%Y-%m-%d %H:%M:%S')}, disk: {ROOT}'s file system\n")
    threading.Thread(target=_sample, daemon=True).start()


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    for meter, read in METERS.items():
        used = read()
        with _lock:
            _peak[meter]["start"] = _peak[meter]["test"] = used


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    row = {}
    for meter, read in METERS.items():
        end = read()
        with _lock:
            start, peak = _peak[meter]["start"], max(_peak[meter]["test"], end)
        row[meter] = (start / GIB, peak / GIB, end / GIB)
    _rows.append((row, nodeid))
    fields = "  ".join(
        f"{meter}: start={s:.2f} peak={p:.2f} end={e:.2f}" for meter, (s, p, e) in row.items()
    )
    with LOG.open("a") as fh:
        fh.write(f"{fields} GiB  {nodeid}\n")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    write = terminalreporter.write_line
    with _lock:
        disk = (_peak["disk"]["run"] - _peak["disk"]["run_start"]) / GIB
        memory = _peak["memory"]["run"] / GIB
    write(f"disk: the run's peak was {disk:.2f} GiB above its start on {ROOT}'s file system")
    write(f"memory: the run's peak was {memory:.2f} GiB used")
    for meter, shown in SHOWN.items():
        write(f"{meter}: tests whose use of it moved more than {shown} GiB")
        for row, nodeid in _rows:
            start, peak, end = row[meter]
            if max(peak - start, abs(end - start)) > shown:
                moved = f"peak +{peak - start:.2f}  end {end - start:+.2f}"
                write(f"  start {start:.2f}  {moved} GiB  {nodeid}")
