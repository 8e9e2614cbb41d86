"""Choose a picker's output budget (``max_tokens`` in its ``picker.json``) on validation
questions, never on evaluation ones.

An output cut off by the budget is invalid (unless only an ids-first output's rationale was
cut: :func:`~ctxpick.picker.format.read_pick`), and the picker falls back to the pool's top
``eval.picker_fallback_k``. Decoding is greedy (constrained or not), so an output under budget
``b`` is the first ``b`` tokens of the output under any larger budget: one run at ``--cap``
tokens gives every smaller budget's outputs exactly. The validation questions are the dev-file
questions right after the ones ``demo.eval_sources`` evaluates (each source's ``offset +
limit`` onwards), with the evaluation's chunks and pools. For each budget of the grid it
prints, per dataset, the share of outputs that are invalid as served (read by
:func:`~ctxpick.picker.inference.pick_result`, as serving and evaluation read them) and the
share whose ids-first decision is read although its rationale was cut off (invalid to the
training reward's strict parser; counted "invalid" by this script before 2026-12-06), and the
evidence F1 and mean size of what would be sent (the fallback's passages for the invalid
ones). ``--constrained`` / ``--no-constrained`` decode constrained to the output format or not
(default: as the picker's ``picker.json`` says).
The rule, fixed before the first run: the smallest budget at which no dataset has more than 2%
invalid outputs. None met it in that run (an output that never closes is invalid at any
budget), so a second rule, set after it, takes the smallest budget with no more invalid outputs
on any dataset than the largest. The last line names it.

At the grid's largest budget (the one the levers' rows in RESULTS.md report) each question's
evidence F1, set size and validity (with the parser's reason when invalid, and the output
itself) go to ``<output_dir>/validation_f1.jsonl``. ``--against`` another run's file
(repeatable) prints the paired difference (this picker minus that one) with its 95% bootstrap
interval, per dataset and on the average over datasets (a question's two scores resampled as a
pair, each dataset on its own), so a lever is compared on the same questions with its
uncertainty, not by two point estimates.

Run, from the repository root:
    .venv/bin/python benchmarks/tune_picker_max_tokens.py --picker ctxpick-picker-0.5b \
        experiment=cpu_quality ablation=qwen_lora_crossenc output_dir=outputs/tune_max_tokens
    .venv/bin/python benchmarks/tune_picker_max_tokens.py --picker outputs/RUN/stage1/final \
        --against outputs/tune_max_tokens/validation_f1.jsonl \
        experiment=cpu_quality ablation=qwen_lora_crossenc output_dir=outputs/tune_RUN
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
from common import picker_validation_set
from transformers import AutoTokenizer

from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.ray_pool import EnginePool
from ctxpick.eval.stats import bootstrap_mean, stratified_mean
from ctxpick.picker.diagnostics import set_f1
from ctxpick.picker.inference import generate_picks, pick_result

GRID = (64, 80, 96, 112, 128, 160, 192, 256)
MAX_INVALID = 0.02


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--picker", required=True, help="a picker folder or shipped name")
    parser.add_argument("--cap", type=int, default=max(GRID), help="the budget decoded once")
    parser.add_argument(
        "--against",
        type=Path,
        action="append",
        default=[],
        help="another picker's validation_f1.jsonl, compared paired (repeatable)",
    )
    parser.add_argument(
        "--constrained",
        action=argparse.BooleanOptionalAction,
        help="decode constrained to the output format (default: as its picker.json says)",
    )
    args, overrides = parser.parse_known_args()
    if args.cap < max(GRID):
        parser.error(f"--cap {args.cap}: at least the grid's largest budget, {max(GRID)}")
    references = {path: _read_per_question(path) for path in args.against}
    cfg, folder, spec, items, pools = picker_validation_set(args.picker, overrides)
    saved = Path(cfg.output_dir) / "validation_f1.jsonl"
    if references and not any(r.item.gold_pids for r in items):
        raise SystemExit("no validation question has gold: --against has nothing to pair")
    for path, reference in references.items():  # before the decode, which takes minutes
        if saved.exists() and path.samefile(saved):
            raise SystemExit(
                f"--against {path} is this run's own output, which it overwrites: compare "
                "against another run's file, or give this run another output_dir"
            )
        _check_same_questions(items, reference, path)
    constrained = spec.constrained if args.constrained is None else args.constrained
    print(f"decoding {'constrained' if constrained else 'unconstrained'}", flush=True)
    engine = EnginePool.from_config(folder, cfg.rl.rollout, cfg.seed)
    try:
        outs = generate_picks(
            engine,
            [spec.chat(r.item.example.question, ps) for r, ps in zip(items, pools, strict=True)],
            [min(len(ps), spec.max_passages) for ps in pools],
            SamplingConfig(temperature=0.0, max_tokens=args.cap),
            spec,
            constrained=constrained,
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

    def scored(budget: int) -> list[dict]:
        """Each question as the picker's output cut at ``budget`` tokens would send it."""
        rows = []
        for r, ps, out in zip(items, pools, outs, strict=True):
            tokens = out[0].token_ids
            text = tokenizer.decode(tokens[:budget], skip_special_tokens=True)
            # Cut by this budget, or by the cap itself: not an output that stopped on its own.
            truncated = len(tokens) > budget or out[0].finish_reason == "length"
            finish = "length" if truncated else out[0].finish_reason
            got = pick_result(
                replace(
                    out[0],
                    text=text,
                    token_ids=tokens[:budget],
                    logprobs=out[0].logprobs[:budget],
                    finish_reason=finish,
                ),
                ps,
                spec,
                cfg.eval.picker_fallback,
                cfg.eval.picker_fallback_k,
            )
            kept, why = got.passages, None if got.valid else got.reason
            gold = r.item.gold_pids
            rows.append(
                {
                    "id": r.item.example.id,
                    "dataset": r.item.example.dataset,
                    "f1": set_f1([p.pid for p in kept], gold) if gold else None,
                    "size": len(kept),
                    "invalid": why is not None,
                    "why_invalid": why,
                    # read at </ids>: the budget cut the rationale after the decision
                    "cut": got.rationale_cut,
                    "output": text,
                }
            )
        return rows

    at = {budget: scored(budget) for budget in GRID}
    saved.write_text("".join(json.dumps(row) + "\n" for row in at[max(GRID)]))
    print(f"{saved}: each question at {max(GRID)} tokens", flush=True)
    for path, reference in references.items():
        _print_paired(at[max(GRID)], reference, path)
    chosen, rates = None, {}
    for budget in GRID:
        invalid, f1, size = defaultdict(list), defaultdict(list), defaultdict(list)
        cut = defaultdict(list)
        for row in at[budget]:
            invalid[row["dataset"]].append(row["invalid"])
            cut[row["dataset"]].append(row["cut"])
            size[row["dataset"]].append(row["size"])
            if row["f1"] is not None:
                f1[row["dataset"]].append(row["f1"])
        cells = "  ".join(
            f"{d} {np.mean(v):5.1%} invalid ({np.mean(cut[d]):.1%} read at </ids>)"
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


Key = tuple[str, str]  # (dataset, question id)


def _read_per_question(path: Path) -> dict[Key, dict]:
    """Another run's validation_f1.jsonl, each line checked."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise SystemExit(f"--against {path}: {e}") from e
    rows: dict[Key, dict] = {}
    for n, line in enumerate(lines, 1):
        where = f"--against {path}, line {n}"
        try:
            row = json.loads(line)
        except ValueError as e:
            raise SystemExit(f"{where}: not JSON ({e})") from e
        if not isinstance(row, dict) or not {"id", "dataset", "f1"} <= row.keys():
            raise SystemExit(f"{where}: needs an object with id, dataset and f1")
        if row["f1"] is not None and not isinstance(row["f1"], int | float):
            raise SystemExit(f"{where}: f1 is {row['f1']!r}, neither a number nor null")
        key = (row["dataset"], row["id"])
        if key in rows:
            raise SystemExit(f"{where}: {key[0]} question {key[1]} is listed twice")
        rows[key] = row
    if not rows:
        raise SystemExit(f"--against {path}: no questions in it")
    return rows


def _check_same_questions(items: list, reference: dict[Key, dict], path: Path) -> None:
    """A paired comparison needs every question of this run in the reference, with gold in
    both or in neither."""
    keys = [(r.item.example.dataset, r.item.example.id) for r in items]
    if len(set(keys)) != len(keys):
        raise SystemExit("the validation set lists a question twice: no pairing is possible")
    missing = [k for k in keys if k not in reference]
    if missing:
        raise SystemExit(
            f"--against {path}: {len(missing)} of these {len(keys)} questions are not in it "
            f"(first: {missing[0][0]} {missing[0][1]}); compare runs on the same validation set"
        )
    for r, key in zip(items, keys, strict=True):
        if bool(r.item.gold_pids) != (reference[key]["f1"] is not None):
            here = "gold" if r.item.gold_pids else "no gold"
            raise SystemExit(
                f"--against {path}: {key[0]} question {key[1]} has {here} here, not there "
                "(other chunks or pools?)"
            )


def _print_paired(own: list[dict], reference: dict[Key, dict], path: Path) -> None:
    """This picker minus the reference, on the questions with gold."""
    diff = defaultdict(list)
    for row in own:
        if row["f1"] is not None:
            diff[row["dataset"]].append(row["f1"] - reference[row["dataset"], row["id"]]["f1"])
    cells = [(d, bootstrap_mean(v)) for d, v in diff.items()]
    cells.append(("average over datasets", stratified_mean(list(diff.values()))))
    print(f"evidence F1, this picker minus {path} (paired, 95% bootstrap):")
    for name, e in cells:
        print(f"  {name}: {e.mean:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}] (n={e.n})", flush=True)


if __name__ == "__main__":
    main()
