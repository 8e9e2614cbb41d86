"""`ctxpick eval`: retrieve -> select -> generate -> judge for every configured method on any
supported dataset file, with the context each method sends. Per-(question, method) records
are appended to ``examples.jsonl`` and a re-run skips the pairs already there."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from ctxpick.config import Config
from ctxpick.data.loaders import load_sources
from ctxpick.data.schema import Passage
from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.models import resolve
from ctxpick.engines.prompts import answer_chat
from ctxpick.engines.ray_pool import EnginePool, init_ray, print_progress
from ctxpick.eval import methods as M
from ctxpick.eval.picking import pick, picker_ranking, picker_rankings, runs_pickers
from ctxpick.eval.plots import plot_accuracy_vs_tokens
from ctxpick.eval.records import fingerprint, record_keys
from ctxpick.eval.report import MethodResult, aggregate, write_report
from ctxpick.jsonl import JsonlWriter, read_done
from ctxpick.judge.judges import JudgeItem, make_judge
from ctxpick.judge.rules import exact_match, token_f1
from ctxpick.picker.selection import apply_budget, passage_tokens, token_counter
from ctxpick.picker.shipped import SHIPPED, check_shipped, picker_folder
from ctxpick.retrieval.chunking import Chunker
from ctxpick.retrieval.pools import PoolBuilder, with_progress
from ctxpick.tracking import Tracker


def method_labels(cfg: Config, dataset: str) -> list[str]:
    ks = cfg.eval.topk_by_dataset.get(dataset, cfg.eval.topk)
    labels = []
    for m in cfg.eval.methods:
        if m in M.RANKINGS:
            labels += [f"{m}@{k}" for k in ks]
        elif m == "picker":
            labels += [f"picker:{name}" for name in cfg.eval.pickers]
        elif m == "matched":
            labels += [M.matched_label(rk, name) for name in cfg.eval.pickers for rk in M.RANKINGS]
        else:
            labels.append(m)
    return labels


def all_labels(cfg: Config, items: list[M.Retrieved]) -> list[str]:
    """Every method label any dataset uses, in table order: by method, then by K."""

    def order(label: str) -> tuple[int, int, str]:
        if M.matched_picker(label):
            return M.METHODS.index("matched"), 0, label
        kind, _, k = label.partition("@")
        return M.METHODS.index(kind.partition(":")[0]), int(k or 0), label

    labels = {m for r in items for m in method_labels(cfg, r.item.example.dataset)}
    return sorted(labels, key=order)


def retrieve(cfg: Config) -> list[M.Retrieved]:
    # The orders the pickers were trained on; a picker none here reproduces fails before
    # any file is read.
    read = set(picker_rankings(cfg).values())
    examples = load_sources(
        cfg.data.sources, cfg.data.strict, Path(cfg.output_dir) / "rejects.jsonl"
    )
    chunked = Chunker(cfg.retrieval.chunking).chunk_all(examples)
    pools = PoolBuilder(cfg.retrieval.pool)
    by, methods = cfg.retrieval.pool.retriever, set(cfg.eval.methods)

    def wanted(ranking: str, *methods_reading_it: str) -> bool:
        return (
            by == ranking
            or ranking in read
            or bool(methods & {ranking, "matched", *methods_reading_it})
        )

    out = []
    for item in with_progress(chunked, "retrieved"):
        bm25 = pools.bm25_scores(item)
        dense = pools.dense_scores(item) if wanted("dense") else None
        cross = None
        if wanted("crossenc", "crossenc_threshold"):  # over the first stage computed above
            first = dense if cfg.retrieval.pool.rerank_first_stage == "dense" else bm25
            cross = pools.crossenc_scores(item, first)
        reranked = min(cfg.retrieval.pool.rerank_n, len(item.passages))
        r = M.Retrieved(item, bm25, [], dense, by, cross, reranked)
        r.pool = r.top(by, cfg.retrieval.pool.k)
        out.append(r)
    return out


def select(
    cfg: Config,
    items: list[M.Retrieved],
    recorded: Callable[[str], list[dict[str, Any]] | None] = lambda label: None,
) -> dict[str, list[M.Selection]]:
    """Every method's selection for every question (``passages=None`` where a method does not
    apply to the question's dataset or the question has no gold evidence). A picker whose
    answers are ``recorded`` for every question (its rows) does not run again: an empty
    selection stands in for each, and the report reads the records; its matched rows take
    its set sizes from them."""
    labels = all_labels(cfg, items)
    out: dict[str, list[M.Selection]] = {}
    for label in labels:
        if label.startswith("picker:") or M.matched_picker(label):
            continue
        rows = []
        for r in items:
            t0 = time.time()
            applies = label in method_labels(cfg, r.item.example.dataset)
            chosen = (
                M.baseline(label, r, cfg.eval.adaptive_min_k, cfg.eval.crossenc_threshold)
                if applies
                else None
            )
            rows.append(M.Selection(chosen, time.time() - t0))
        out[label] = rows
    for name, path in (cfg.eval.pickers if runs_pickers(cfg) else {}).items():
        label = f"picker:{name}"
        rows = recorded(label)
        if rows is None:
            out[label] = pick(cfg, path, items)
            sizes = [len(sel.passages or []) for sel in out[label]]
        else:
            out[label] = [M.Selection([])] * len(items)
            sizes = [len(row.get("pick_ids") or row.get("fallback_ids") or []) for row in rows]
        for ranking in M.RANKINGS:
            matched = M.matched_label(ranking, name)
            if matched in labels:
                out[matched] = [
                    M.Selection(M.top_passages(r, r.scores(ranking), size))
                    for r, size in zip(items, sizes, strict=True)
                ]
    return out


class _Answerer:
    """Generates from each method's passages and judges the answers, one method per batch
    (so each method's generation and judging time is its own)."""

    def __init__(self, cfg: Config, engines: EnginePool, count: Callable[[Passage], int]) -> None:
        self.cfg, self.engines, self.count = cfg, engines, count
        self.judge = make_judge(cfg.judge, engines)
        self.sampling = SamplingConfig(
            temperature=cfg.generator.temperature,
            max_tokens=cfg.generator.max_tokens,
            seed=cfg.seed,
        )

    def __call__(
        self, label: str, todo: list[tuple[M.Retrieved, M.Selection]]
    ) -> tuple[list[dict[str, Any]], dict[str, float]]:
        cfg = self.cfg
        capped = [
            apply_budget(sel.passages or [], cfg.eval.token_budget, self.count) for _, sel in todo
        ]
        chats = [
            answer_chat(r.item.example.question, ps, cfg.generator.system)
            for (r, _), (ps, _) in zip(todo, capped, strict=True)
        ]
        t0 = time.time()
        outs = self.engines.generate(
            chats, self.sampling, cfg.model.engine.batch_size, print_progress(label)
        )
        t1 = time.time()
        preds = [o[0].text.strip() for o in outs]
        items = [
            JudgeItem(ex.question, tuple(ex.answers), pred, bool(ex.meta.get("unanswerable")))
            for ex, pred in zip((r.item.example for r, _ in todo), preds, strict=True)
        ]
        verdicts = self.judge(items)
        t2 = time.time()
        records = [
            _record(r, label, ps, cut, sel, o[0].prompt_tokens, pred, ok, self.count)
            for (r, sel), (ps, cut), o, pred, ok in zip(
                todo, capped, outs, preds, verdicts, strict=True
            )
        ]
        return records, {"generate": t1 - t0, "judge": t2 - t1}


@dataclass(frozen=True)
class EvalRun:
    report: Path
    records: list[dict[str, Any]]  # the rows the report rests on: this run's settings and questions


def run_eval(cfg: Config) -> EvalRun:
    # A shipped picker's name (`ctxpick models list`) stands for its prepared folder; its pool
    # is checked before it is merged into its base (a GB written for nothing otherwise).
    for ref in cfg.eval.pickers.values():
        if ref in SHIPPED:
            check_shipped(SHIPPED[ref])  # its files first: a changed one is no pool mismatch
            picker_ranking(cfg, SHIPPED[ref].folder)
    pickers = {name: picker_folder(ref) for name, ref in cfg.eval.pickers.items()}
    cfg = replace(cfg, eval=replace(cfg.eval, pickers=pickers))
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    print(f"[1/4] loading, chunking and retrieving ({', '.join(cfg.eval.methods)})", flush=True)
    init_ray(cfg.ray.address, cfg.ray.num_cpus)
    items = retrieve(cfg)
    records_path = out / "examples.jsonl"
    # A re-run skips the (question, method) pairs written by the same settings; rows written
    # under other settings (another picker, prompt, budget, generator) stay in the file but
    # are never reported.
    prints = {label: fingerprint(cfg, label) for label in all_labels(cfg, items)}
    keys = record_keys(items, prints)
    done = read_done(records_path)

    def recorded(label: str) -> list[dict[str, Any]] | None:
        return [done[k] for k in keys[label]] if all(k in done for k in keys[label]) else None

    print(f"[2/4] selecting: {len(items)} questions", flush=True)
    selections = select(cfg, items, recorded)

    print(f"[3/4] generating with {cfg.model.name} and judging ({cfg.judge.mode})", flush=True)
    todos = {
        label: [
            (key, r, sel)
            for r, sel, key in zip(items, rows, keys[label], strict=True)
            if sel.passages is not None and key not in done
        ]
        for label, rows in selections.items()
    }
    timings: dict[tuple[str, str], dict[str, float]] = {}
    if any(todos.values()):  # a re-run with every answer recorded starts no engine
        writer = JsonlWriter(records_path)
        engines = EnginePool.from_config(cfg.model.name, cfg.model.engine, cfg.seed)
        answer = _Answerer(cfg, engines, _token_counter(cfg))
        for label, todo in todos.items():
            if not todo:
                continue
            records, seconds = answer(label, [(r, sel) for _, r, sel in todo])
            for rec, (key, _, _) in zip(records, todo, strict=True):
                rec["fingerprint"] = prints[label]
                rec["id"] = key
                writer.write(rec)
                done[key] = rec
            datasets = [r.item.example.dataset for _, r, _ in todo]
            for ds in set(datasets):
                share = datasets.count(ds) / len(todo)
                timings[(ds, label)] = {k: v * share for k, v in seconds.items()}
        writer.close()
        engines.shutdown()

    print("[4/4] report", flush=True)
    current = [
        done[key]
        for label, rows in selections.items()
        for sel, key in zip(rows, keys[label], strict=True)
        if sel.passages is not None and key in done
    ]
    results = aggregate(current, timings)
    table, with_ci = write_report(
        out / "report.md", report_header(cfg), current, results, all_labels(cfg, items)
    )
    plots = plot_accuracy_vs_tokens(results, out)
    (out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=2))
    tracker = Tracker.for_job(cfg, out, "eval")
    for path in cfg.eval.pickers.values():
        tracker.use_artifact(path, "model")
    columns = [f.name for f in fields(MethodResult)]
    tracker.log(
        {},
        tables={"results": (columns, [list(asdict(r).values()) for r in results])},
        images={p.stem: p for p in plots},
    )
    tracker.log_artifact(out / "report.md", "report")
    tracker.finish()
    print(f"\n{table}\n\nwith 95% confidence intervals:\n\n{with_ci}\n")
    print(f"report: {out / 'report.md'}\nper-example results: {records_path}")
    print("plots: " + ", ".join(str(p) for p in plots))
    print(f"done in {time.time() - t_start:.0f}s", flush=True)
    return EvalRun(out / "report.md", current)


def report_header(cfg: Config) -> str:
    """What the report's numbers rest on besides the methods: generator, judge, budget, the
    fallback's passages, the pool, and the order each picker reads where it is not the pool's."""
    budget = f"token budget {cfg.eval.token_budget}" if cfg.eval.token_budget else "no token budget"
    fallback = cfg.eval.picker_fallback
    if fallback == "top_k":
        fallback = f"top {cfg.eval.picker_fallback_k} of the order the picker reads"
    by = cfg.retrieval.pool.retriever
    own = [f"picker:{n} reads the {r} order" for n, r in picker_rankings(cfg).items() if r != by]
    if own:  # what a paired row against them keeps
        own.append(f"full_pool and adaptive keep the {by} order")
    return (
        f"Generator: {cfg.model.name}; judge: {cfg.judge.mode}; {budget}; "
        f"a picker's invalid output sends: {fallback}; pool: {by} top {cfg.retrieval.pool.k}"
        + "".join(f"; {note}" for note in own)
        + "."
    )


def _token_counter(cfg: Config) -> Callable[[Passage], int]:
    """Context tokens of a passage as the generator's prompt shows it."""
    tokens = token_counter(resolve(cfg.eval.tokenizer or cfg.model.name))

    @functools.cache  # the budget and the record both count each passage
    def count(p: Passage) -> int:
        return passage_tokens(tokens, [p])[0]

    return count


def _record(
    r: M.Retrieved,
    label: str,
    passages: list[Passage],
    cut: bool,
    sel: M.Selection,
    prompt_tokens: int,
    pred: str,
    ok: bool,
    count: Callable[[Passage], int],
) -> dict[str, Any]:
    ex, gold = r.item.example, r.item.gold_pids
    chosen = {p.pid for p in passages}
    recall = precision = None
    if gold:
        hit = len(chosen & set(gold))
        recall = hit / len(gold)
        precision = hit / len(chosen) if chosen else None
    return {
        "example_id": ex.id,
        "dataset": ex.dataset,
        "method": label,
        "question": ex.question,
        "answers": ex.answers,
        "prediction": pred,
        "correct": ok,
        "em": exact_match(pred, ex.answers),
        "f1": token_f1(pred, ex.answers),
        "passages": len(passages),
        "passage_ids": [p.pid for p in passages],
        "context_tokens": sum(count(p) for p in passages),
        "prompt_tokens": prompt_tokens,
        "budget_cut": cut,
        "evidence_recall": recall,
        "evidence_precision": precision,
        "select_s": sel.seconds,
        **sel.extra,
    }
