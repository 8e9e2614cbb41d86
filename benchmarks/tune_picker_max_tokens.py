"""Choose a picker's output budget (``max_tokens`` in its ``picker.json``) on validation
questions, never on evaluation ones.

An output cut off by the budget does not parse, and the picker falls back to the pool's top
``eval.picker_fallback_k``. Decoding is greedy, so an output under budget ``b`` is the first
``b`` tokens of the output under any larger budget: one run at ``--cap`` tokens gives every
smaller budget's outputs exactly. The validation questions are the dev-file questions right
after the ones ``demo.eval_sources`` evaluates (each source's ``offset + limit`` onwards), with
the evaluation's chunks and pools. For each budget of the grid it prints, per dataset, the
share of outputs that do not parse, and the evidence F1 and mean size of what would be sent
(the fallback's passages for those). The rule, fixed before the first run: the smallest
budget at which no dataset has more than 2% invalid outputs. None met it in that run (an
output that never closes is invalid at any budget), so a second rule, set after it, takes
the smallest budget with no more invalid outputs on any dataset than the largest. The last
line names it.

Run, from the repository root:
    .venv/bin/python benchmarks/tune_picker_max_tokens.py --picker ctxpick-picker-0.5b \
        experiment=cpu_quality ablation=qwen_lora_crossenc output_dir=outputs/tune_max_tokens
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np
from common import picker_validation_set
from transformers import AutoTokenizer

from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.ray_pool import EnginePool
from ctxpick.picker.diagnostics import set_f1
from ctxpick.picker.format import InvalidPick, parse_pick
from ctxpick.picker.inference import generate_picks
from ctxpick.picker.selection import fallback_passages

GRID = (64, 80, 96, 112, 128, 160, 192, 256)
MAX_INVALID = 0.02


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--picker", required=True, help="a picker folder or shipped name")
    parser.add_argument("--cap", type=int, default=max(GRID), help="the budget decoded once")
    args, overrides = parser.parse_known_args()
    if args.cap < max(GRID):
        parser.error(f"--cap {args.cap}: at least the grid's largest budget, {max(GRID)}")
    cfg, folder, spec, items, pools = picker_validation_set(args.picker, overrides)
    engine = EnginePool.from_config(folder, cfg.rl.rollout, cfg.seed)
    try:
        outs = generate_picks(
            engine,
            [spec.chat(r.item.example.question, ps) for r, ps in zip(items, pools, strict=True)],
            [min(len(ps), spec.max_passages) for ps in pools],
            SamplingConfig(temperature=0.0, max_tokens=args.cap),
            spec,
            constrained=False,
        )
    finally:
        engine.shutdown()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    lengths = [len(o[0].token_ids) for o in outs]
    # The cut outputs are decoded from their tokens: say if decoding is not the engine's text.
    differ = sum(
        tokenizer.decode(o[0].token_ids, skip_special_tokens=True) != o[0].text for o in outs
    )
    print(f"{differ} outputs differ from their tokens' decoding", flush=True)
    print(
        f"{len(items)} validation questions; output tokens at cap {args.cap}: "
        f"median {np.median(lengths):.0f}, max {max(lengths)}"
    )
    chosen, rates = None, {}
    for budget in GRID:
        invalid, f1, size = defaultdict(list), defaultdict(list), defaultdict(list)
        for r, ps, out in zip(items, pools, outs, strict=True):
            text = tokenizer.decode(out[0].token_ids[:budget], skip_special_tokens=True)
            shown = ps[: spec.max_passages]
            try:
                kept = [shown[i - 1] for i in parse_pick(text, len(shown), spec.output_format).ids]
                bad = False
            except InvalidPick:
                kept = fallback_passages(ps, cfg.eval.picker_fallback, cfg.eval.picker_fallback_k)
                bad = True
            dataset = r.item.example.dataset
            invalid[dataset].append(bad)
            size[dataset].append(len(kept))
            if r.item.gold_pids:
                f1[dataset].append(set_f1([p.pid for p in kept], r.item.gold_pids))
        cells = "  ".join(
            f"{d} {np.mean(v):5.1%} invalid"
            + (f", F1 {np.mean(f1[d]):.3f}" if f1[d] else "")
            + f", |S| {np.mean(size[d]):.2f}"
            + f" (n={len(v)})"
            for d, v in invalid.items()
        )
        print(f"max_tokens {budget:3d}: {cells}", flush=True)
        rates[budget] = {d: float(np.mean(v)) for d, v in invalid.items()}
        if chosen is None and all(r <= MAX_INVALID for r in rates[budget].values()):
            chosen = budget
    if chosen:
        print(f"chosen: max_tokens={chosen}")
        return
    # Outputs that never close (a loop) are invalid at any budget: the next rule, set after
    # the first run met none, takes the smallest budget that leaves only those.
    top = rates[max(GRID)]
    floor = min(b for b in GRID if all(r <= top[d] for d, r in rates[b].items()))
    print(
        f"no budget up to {max(GRID)} meets the {MAX_INVALID:.0%} rule; the smallest with no "
        f"more invalid outputs than {max(GRID)} tokens on any dataset: max_tokens={floor}"
    )


if __name__ == "__main__":
    main()
