"""Does cutting a trained picker's joined adapter to a lower rank change what it picks?

``ctxpick models ship --max-rank R`` bounds the shipped adapter's size by a truncated SVD of
each weight's joined delta and reports the largest relative error in a weight. That error
says nothing about behaviour, so this measures it: for each rank, the chain's adapters are
joined (cut past the rank), merged into the base model as the shipped picker would be, and
asked for greedy picks on the *validation* questions of the stage's mined data (held out of
training; never the evaluation questions). Printed per rank: the adapter's size, the weight
error, valid outputs, the share of questions whose ids, as written, equal the exact adapter's
(a reordered set counts as different: a lower bound on equal sets), mean ``|S|`` and set F1
against the mined minimal sets and against the human evidence (an invalid output counts as
the empty set: this measures the model, not the served fallback).

Run, from the repository root (the stage and data of the picker shipped until 2026-12-05):
    .venv/bin/python benchmarks/rank_cut.py outputs/cpu_quality_crossenc/stage1/final \
        outputs/cpu_quality_crossenc/warmup_data/mined.jsonl --ranks 22 16 8
A shipped picker's folder (its adapter names the base's hub name) is read the same way: its
adapter is then the reference, and its truncated SVD to a lower rank is the exact adapter's,
up to the shipped file's rounding.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from statistics import mean

from ctxpick.engines.models import BUILTINS
from ctxpick.picker.diagnostics import set_f1
from ctxpick.picker.examples import load_picker_examples
from ctxpick.picker.inference import Picker
from ctxpick.picker.shipped import adapter_chain, joined_adapter, merged_folder
from ctxpick.picker.spec import PickerSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "final", type=Path, help="a LoRA stage's final/ (its adapter chain) or a shipped picker"
    )
    ap.add_argument("mined", type=Path, help="the mined.jsonl it was trained on")
    ap.add_argument("--ranks", type=int, nargs="+", required=True, help="ranks to cut to")
    ap.add_argument(
        "--base", default="qwen2.5-coder-0.5b", choices=sorted(BUILTINS), help="built-in base"
    )
    ap.add_argument("--seed", type=int, default=0, help="the run's seed (its pool order)")
    args = ap.parse_args()
    if min(args.ranks) < 1:
        raise SystemExit("--ranks: each at least 1")
    spec = PickerSpec.load(args.final)
    order = (spec.pool or {}).get("order", "pool")  # the passages as training showed them
    val = load_picker_examples(args.mined, spec.max_passages, args.seed, order)["val"]
    if not val:
        raise SystemExit(f"{args.mined}: no validation question")
    print(f"{len(val)} validation questions of {args.mined}", flush=True)
    chain = adapter_chain(args.final, args.base)
    exact: list[tuple[int, ...] | None] = []
    print("rank   MiB  weight err  valid  same set  mean|S|  F1 mined  F1 human", flush=True)
    for rank in [None, *sorted(args.ranks, reverse=True)]:
        adapter, err = joined_adapter(chain, BUILTINS[args.base].hf_name, rank)
        with tempfile.TemporaryDirectory(dir=args.final.parent) as tmp:
            folder = merged_folder(
                args.base, adapter, [args.final / "picker.json"], Path(tmp) / "m"
            )
            picker = Picker.from_pretrained(
                folder, engine="actor", num_cpus=2, count_tokens=lambda t: 0
            )
            try:
                results = picker.decide([ex.question for ex in val], [ex.passages for ex in val])
            finally:
                picker.engine.shutdown()
        ids = [r.ids if r.valid else None for r in results]
        exact = exact or ids
        picked = [list(i or ()) for i in ids]
        print(
            f"{rank or 'exact':>5} {len(adapter.weights) / 2**20:5.1f}  {err:10.3f}"
            f"  {mean(r.valid for r in results):5.0%}"
            f"  {mean(a == b for a, b in zip(ids, exact, strict=True)):8.0%}"
            f"  {mean(len(p) for p in picked):7.2f}"
            f"  {mean(set_f1(p, ex.gold) for p, ex in zip(picked, val, strict=True)):8.3f}"
            f"  {mean(set_f1(p, ex.human_gold) for p, ex in zip(picked, val, strict=True)):8.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
