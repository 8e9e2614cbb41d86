"""A sizing lever measured on validation questions, never on evaluation ones: the picker's
set chosen by a vote over sampled picks instead of its one greedy pick.

The trained picker keeps two passages for nearly every question (benchmarks/RESULTS.md): it
reads which two, but it does not size. Sampled picks disagree where it is unsure; a vote over
``--samples`` picks (at each of ``--temperatures``; the rollouts' 1.0 by default) keeps each
passage chosen by at least a share k/N of the valid samples, so the set grows or shrinks
with the picker's own agreement. Only the ids are sampled (the output format puts them first;
each sample stops at ``</ids>``), so the vote costs a few tokens per sample beside the
prompt's prefill, which the samples share.

Rules compared, per dataset, on the validation questions of
``benchmarks/tune_picker_max_tokens.py`` (the dev-file questions after the evaluated ones),
with the evaluation's pools and the served fallback for an invalid greedy output:
- ``greedy``: the picker as served (its whole output at its own ``max_tokens``);
- ``vote>=k/N``: passages chosen by at least a share k/N of the valid picks (a sample that
  closed its ids with a parseable, non-empty list); when none reaches it, the most chosen
  passage; with no valid sample, the greedy rule's set;
- ``mode``: the most frequent sampled set (a tie: the one sampled first), else greedy's.
The rule, fixed before the first run: the vote threshold with the highest mean evidence F1
over the datasets with gold passages is a lever worth evaluating on the dev questions only if
it is more than 1 point above ``greedy`` (the rule the seeds were chosen by); the paired
interval it prints is optimistic, since the threshold was chosen on these same questions.

Run, from the repository root:
    .venv/bin/python benchmarks/tune_picker_votes.py --picker ctxpick-picker-0.5b \
        --temperatures 1.0,1.5 experiment=cpu_quality ablation=qwen_lora_crossenc \
        output_dir=outputs/tune_votes
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict

import numpy as np
from common import picker_validation_set

from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.ray_pool import EnginePool
from ctxpick.eval.stats import stratified_mean
from ctxpick.picker.diagnostics import set_f1
from ctxpick.picker.format import FORMATS, InvalidPick, parse_pick
from ctxpick.picker.inference import pick_result

ADOPT_POINTS = 1.0


def vote(samples: list[tuple[int, ...]], k: int, n: int) -> tuple[int, ...]:
    """Positions chosen by at least k/n of ``samples`` (each a valid, non-empty pick), in
    position order; the most chosen one (the first, on a tie) when none reaches it. Integer
    comparison: k/n as a float can round a threshold up by a vote."""
    counts = Counter(i for s in samples for i in s)
    kept = tuple(sorted(i for i, c in counts.items() if c * n >= k * len(samples)))
    return kept or (min(counts, key=lambda i: (-counts[i], i)),)


def sampled_ids(outs: list, shown: int) -> list[tuple[int, ...]]:
    """The valid, non-empty id lists of samples that closed their ids (stopped at
    ``</ids>``); one cut off by the token budget is not a pick."""
    picks = []
    for c in outs:
        if c.finish_reason != "stop":
            continue
        try:
            ids = parse_pick(c.text + "</ids>", shown, FORMATS["ids"]).ids
        except InvalidPick:
            continue
        if ids:
            picks.append(ids)
    return picks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--picker", required=True, help="a picker folder or shipped name")
    parser.add_argument("--samples", type=int, default=16, help="sampled picks per question")
    parser.add_argument(
        "--temperatures",
        type=lambda v: [float(t) for t in v.split(",")],
        default=[1.0],
        help="comma-separated, e.g. 1.0,1.5",
    )
    args, overrides = parser.parse_known_args()
    if args.samples < 2 or min(args.temperatures) <= 0:
        parser.error("a vote needs --samples >= 2 and temperatures above 0")
    cfg, folder, spec, items, pools = picker_validation_set(args.picker, overrides)
    if not spec.output_format.startswith("<ids>"):
        raise SystemExit(
            f"{folder}: its output format {spec.output_format!r} does not put the ids first; "
            "the vote samples the ids alone"
        )
    if spec.constrained:
        raise SystemExit(f"{folder}: its picker.json decodes constrained; the vote samples freely")
    chats = [spec.chat(r.item.example.question, ps) for r, ps in zip(items, pools, strict=True)]
    engine = EnginePool.from_config(folder, cfg.rl.rollout, cfg.seed)
    try:
        greedy = engine.generate(chats, SamplingConfig(temperature=0.0, max_tokens=spec.max_tokens))
        sampled = {
            t: engine.generate(
                chats,
                SamplingConfig(
                    temperature=t,
                    max_tokens=spec.max_tokens,
                    n=args.samples,
                    seed=cfg.seed,
                    stop=("</ids>",),
                ),
            )
            for t in args.temperatures
        }
    finally:
        engine.shutdown()
    print(f"{len(items)} validation questions; {args.samples} samples a question")
    for t, outs in sampled.items():
        report(cfg, spec, items, pools, greedy, outs, args.samples, t)


def report(cfg, spec, items, pools, greedy, sampled, n: int, temperature: float) -> None:
    """The rules' evidence F1 per dataset at one sampling temperature, and the verdict."""
    rules = ["greedy", "mode", *(f"vote>={k}/{n}" for k in range(1, n + 1))]
    f1, size, valid_share = defaultdict(dict), defaultdict(dict), defaultdict(list)
    fallback_k = cfg.eval.picker_fallback_k
    for r, ps, g, outs in zip(items, pools, greedy, sampled, strict=True):
        shown = ps[: spec.max_passages]
        # Served and evaluated alike: an invalid output keeps the fallback's passages.
        greedy_pick = pick_result(g[0], ps, spec, cfg.eval.picker_fallback, fallback_k)
        picked = [p.pid for p in greedy_pick.passages]
        samples = sampled_ids(outs, len(shown))
        dataset = r.item.example.dataset
        valid_share[dataset].append(len(samples) / len(outs))
        sets = {"greedy": picked}  # with no valid sample every rule keeps the greedy set
        if samples:
            # The most frequent set; a tie goes to the set sampled first.
            mode = Counter(tuple(sorted(s)) for s in samples).most_common(1)[0][0]
            sets["mode"] = [shown[i - 1].pid for i in mode]
            for k in range(1, n + 1):
                sets[f"vote>={k}/{n}"] = [shown[i - 1].pid for i in vote(samples, k, n)]
        if not r.item.gold_pids:
            continue  # no evidence F1 without gold passages (MultiFieldQA)
        for rule in rules:
            kept = sets.get(rule, picked)
            size[rule].setdefault(dataset, []).append(len(kept))
            f1[rule].setdefault(dataset, []).append(set_f1(kept, r.item.gold_pids))

    datasets = sorted(f1["greedy"])
    print(f"\ntemperature {temperature}: share of samples that give a valid, non-empty pick")
    for d, v in sorted(valid_share.items()):
        print(f"  {d}: {np.mean(v):.1%} (n={len(v)})")
    header = "| rule | " + " | ".join(f"{d} F1" for d in datasets) + " | mean F1 | mean |S| |"
    print(header + "\n|" + "---|" * (len(datasets) + 3))
    means = {}
    for rule in rules:
        means[rule] = float(np.mean([np.mean(f1[rule][d]) for d in datasets]))
        cells = " | ".join(f"{np.mean(f1[rule][d]):.3f}" for d in datasets)
        sizes = np.mean([np.mean(size[rule][d]) for d in datasets])
        print(f"| {rule} | {cells} | {means[rule]:.3f} | {sizes:.2f} |")
    best = max((r for r in rules if r.startswith("vote")), key=lambda r: means[r])
    diff = stratified_mean(
        [np.subtract(f1[best][d], f1["greedy"][d]) for d in datasets], seed=cfg.seed
    )
    gain = 100 * (means[best] - means["greedy"])
    print(
        f"best vote rule at T={temperature}: {best}, mean F1 {means[best]:.3f} against greedy "
        f"{means['greedy']:.3f}: {gain:+.1f} points, paired "
        f"[{100 * diff.lo:+.1f}, {100 * diff.hi:+.1f}] (n={diff.n}; optimistic: chosen here)"
    )
    verdict = "worth a dev evaluation" if gain > ADOPT_POINTS else "not adopted"
    print(f"rule (> {ADOPT_POINTS:.0f} point above greedy): {verdict}")


if __name__ == "__main__":
    main()
