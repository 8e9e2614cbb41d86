"""Choose ``eval.crossenc_threshold`` on training-split questions, never on evaluation ones.

The ``crossenc_threshold`` baseline keeps every passage whose cross-encoder logit reaches the
threshold (at least one), as a user of a reranker's score cut would. This reads the training
files of the config's ``data.sources`` (with ``experiment=cpu_quality``: ../shared/data/train),
chunks and ranks them exactly as ``ctxpick eval`` does (first stage top ``rerank_n``, then the
cross-encoder), and prints, for a grid of thresholds, the mean evidence F1 against the human
evidence (the mean over datasets of each dataset's mean) and the mean set size. The best
threshold is the last line.

Run, from the repository root:
    .venv/bin/python benchmarks/tune_crossenc_threshold.py experiment=cpu_quality \
        output_dir=outputs/tune_crossenc
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from ctxpick.config import compose
from ctxpick.eval import methods as M
from ctxpick.eval.harness import retrieve
from ctxpick.picker.diagnostics import set_f1

GRID = np.round(np.arange(-8.0, 8.01, 0.5), 2)


def main(overrides: list[str]) -> None:
    cfg = compose([*overrides, "eval.methods=[crossenc_threshold]"])
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)  # rejected records go there
    items = [r for r in retrieve(cfg) if r.item.gold_pids]
    print(f"{len(items)} training-split questions with human evidence", flush=True)
    rows = []
    for t in GRID:
        f1, size = defaultdict(list), []
        for r in items:
            kept = M.baseline("crossenc_threshold", r, threshold=float(t)) or []
            picked = [p.pid for p in kept]
            f1[r.item.example.dataset].append(set_f1(picked, r.item.gold_pids))
            size.append(len(kept))
        rows.append((float(np.mean([np.mean(v) for v in f1.values()])), float(t), np.mean(size)))
        print(f"threshold {t:+5.1f}  evidence F1 {rows[-1][0]:.3f}  |S| {rows[-1][2]:.2f}")
    best = max(rows)
    print(f"best: eval.crossenc_threshold={best[1]} (evidence F1 {best[0]:.3f}, |S| {best[2]:.2f})")


if __name__ == "__main__":
    main(sys.argv[1:])
