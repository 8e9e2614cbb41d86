"""Shared by the benchmarks: where the real data is, and the bundled fallback."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
SAMPLES = REPO / "ctxpick" / "data" / "samples"


def data_file(shared_rel: str, sample_name: str) -> Path:
    """The full ``../shared/data`` file when present, else the bundled sample."""
    full = SHARED / shared_rel
    return full if full.is_file() else SAMPLES / sample_name
