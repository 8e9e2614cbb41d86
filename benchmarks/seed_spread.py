"""Seeds of one recipe, evaluated together by one `ctxpick eval`: their mean and spread.

Reads the evaluation folder's records (``examples.jsonl``) and prints, for the runs named, each
run's judged accuracy, evidence F1 and context tokens, and its paired difference against each
baseline, on the average over datasets and per dataset, with the mean, standard deviation and
range over the runs (:mod:`ctxpick.eval.seeds`). The records are checked against the folder's
``results.json`` first: a row written under other settings (``examples.jsonl`` keeps them) would
otherwise enter the spread.

Run, from the repository root (the shipped recipe's three seeds on the 624 dev questions):
    .venv/bin/python benchmarks/seed_spread.py outputs/s16/eval_dev_all_siblings \
        --runs picker:shipped picker:seed0 picker:seed2 --baselines crossenc@2 crossenc@3 full_pool
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from ctxpick.eval.seeds import seed_table


def reported_records(folder: Path, methods: list[str]) -> list[dict]:
    """``methods``' records in ``folder``, exactly those its report counted."""
    records = [
        r
        for r in map(json.loads, (folder / "examples.jsonl").read_text().splitlines())
        if r["method"] in methods
    ]
    counts = Counter((r["dataset"], r["method"]) for r in records)
    reported = {
        (x["dataset"], x["method"]): x["questions"]
        for x in json.loads((folder / "results.json").read_text())
        if x["method"] in methods
    }
    if counts != Counter(reported):
        differ = sorted(k for k in counts.keys() | reported.keys() if counts[k] != reported.get(k))
        raise SystemExit(
            f"{folder}: examples.jsonl holds other rows than results.json reports for "
            f"{differ} (rows from other settings?): evaluate into a fresh output_dir"
        )
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path, help="a `ctxpick eval` output_dir")
    ap.add_argument("--runs", nargs="+", required=True, help="method labels, e.g. picker:seed0")
    ap.add_argument("--baselines", nargs="*", default=[], help="labels to pair each run with")
    args = ap.parse_args()
    records = reported_records(args.folder, [*args.runs, *args.baselines])
    print(seed_table(records, args.runs, args.baselines))


if __name__ == "__main__":
    main()
