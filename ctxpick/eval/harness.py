"""`ctxpick eval`: retrieve -> select -> generate -> judge for every configured method on any
supported dataset file, with the context each method sends. Per-(question, method) records
are appended to ``examples.jsonl`` and a re-run skips the pairs already there."""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ctxpick.config import Config, ConfigError
from ctxpick.data.loaders import load_sources
from ctxpick.data.schema import Passage
from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.models import resolve
from ctxpick.engines.prompts import answer_chat, format_passages
from ctxpick.engines.ray_pool import EnginePool, init_ray, print_progress
from ctxpick.eval import methods as M
from ctxpick.eval.report import (
    MethodResult,
    aggregate,
    plot_accuracy_vs_tokens,
    write_report,
)
from ctxpick.jsonl import JsonlWriter, read_done
from ctxpick.judge.judges import JudgeItem, make_judge
from ctxpick.judge.rules import exact_match, token_f1
from ctxpick.picker.inference import Picker
from ctxpick.retrieval.chunking import Chunker
from ctxpick.retrieval.pools import PoolBuilder
from ctxpick.tracking import Tracker


def method_labels(cfg: Config, dataset: str) -> list[str]:
    ks = cfg.eval.topk_by_dataset.get(dataset, cfg.eval.topk)
    labels = []
    for m in cfg.eval.methods:
        if m in ("bm25", "dense"):
            labels += [f"{m}@{k}" for k in ks]
        elif m == "picker":
            labels += [f"picker:{name}" for name in cfg.eval.pickers]
        else:
            labels.append(m)
    return labels


def all_labels(cfg: Config, items: list[M.Retrieved]) -> list[str]:
    """Every method label any dataset uses, in table order: by method, then by K."""

    def order(label: str) -> tuple[int, int, str]:
        kind, _, k = label.partition("@")
        return M.METHODS.index(kind.partition(":")[0]), int(k or 0), label

    labels = {m for r in items for m in method_labels(cfg, r.item.example.dataset)}
    return sorted(labels, key=order)


def retrieve(cfg: Config) -> list[M.Retrieved]:
    examples = load_sources(
        cfg.data.sources, cfg.data.strict, Path(cfg.output_dir) / "rejects.jsonl"
    )
    chunked = Chunker(cfg.retrieval.chunking).chunk_all(examples)
    pools = PoolBuilder(cfg.retrieval.pool)
    by = cfg.retrieval.pool.retriever
    out = []
    for item in chunked:
        dense = pools.dense_scores(item) if "dense" in cfg.eval.methods or by == "dense" else None
        r = M.Retrieved(item, pools.bm25_scores(item), [], dense, by)
        r.pool = [int(i) for i in M.top_k(r.pool_scores, cfg.retrieval.pool.k)]
        out.append(r)
    return out


def select(
    cfg: Config, items: list[M.Retrieved], recorded: Callable[[str], bool] = lambda label: False
) -> dict[str, list[M.Selection]]:
    """Every method's selection for every question (``passages=None`` where a method does not
    apply to the question's dataset or the question has no gold evidence). A picker whose
    answers are ``recorded`` for every question does not run again: an empty selection stands
    in for each, and the report reads the records."""
    out: dict[str, list[M.Selection]] = {}
    for label in all_labels(cfg, items):
        if label.startswith("picker:"):
            continue
        rows = []
        for r in items:
            t0 = time.time()
            applies = label in method_labels(cfg, r.item.example.dataset)
            chosen = M.baseline(label, r, cfg.eval.adaptive_min_k) if applies else None
            rows.append(M.Selection(chosen, time.time() - t0))
        out[label] = rows
    for name, path in cfg.eval.pickers.items():
        label = f"picker:{name}"
        out[label] = [M.Selection([])] * len(items) if recorded(label) else _pick(cfg, path, items)
    return out


def _pick(cfg: Config, path: str, items: list[M.Retrieved]) -> list[M.Selection]:
    if not (Path(path) / "config.json").exists():
        raise ConfigError(f"eval.pickers: {path} is not a model folder (a stage's final/)")
    try:
        picker = Picker.from_pretrained(
            path, engine=lambda folder: EnginePool.from_config(folder, cfg.rl.rollout, cfg.seed)
        )
    except (OSError, ValueError) as err:  # the prompt is read before any engine starts
        raise ConfigError(f"eval.pickers: {err}") from None
    engines = picker.engine
    t0 = time.time()
    picks = picker.decide(
        [r.item.example.question for r in items],
        [[r.item.passages[i] for i in r.pool] for r in items],
    )
    per_item = (time.time() - t0) / max(len(items), 1)
    engines.shutdown()
    return [
        M.Selection(
            pk.passages,
            per_item,
            {
                "pick_valid": pk.valid,
                "pick_output": pk.text,
                "pick_invalid_reason": pk.reason,
                # for the collapse diagnostics (ctxpick/picker/diagnostics.py)
                "pick_ids": list(pk.ids) if pk.ids is not None else None,
                "shown_pids": [r.item.passages[i].pid for i in r.pool[: picker.spec.max_passages]],
                "gold_pids": r.item.gold_pids,
            },
        )
        for pk, r in zip(picks, items, strict=True)
    ]


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
            M.apply_budget(sel.passages or [], cfg.eval.token_budget, self.count) for _, sel in todo
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
    keys = {
        label: [_record_id(r.item.example.id, label, fp) for r in items]
        for label, fp in prints.items()
    }
    done = read_done(records_path)

    def recorded(label: str) -> bool:
        return all(key in done for key in keys[label])

    print(f"[2/4] selecting: {len(items)} questions", flush=True)
    selections = select(cfg, items, recorded)

    print(f"[3/4] generating with {cfg.model.name} and judging ({cfg.judge.mode})", flush=True)
    todos = {
        label: [
            (r, sel)
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
            records, seconds = answer(label, todo)
            for rec in records:
                rec["fingerprint"] = prints[label]
                rec["id"] = _record_id(rec["example_id"], label, prints[label])
                writer.write(rec)
                done[rec["id"]] = rec
            for ds in {r.item.example.dataset for r, _ in todo}:
                share = sum(r.item.example.dataset == ds for r, _ in todo) / len(todo)
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
    budget = f"token budget {cfg.eval.token_budget}" if cfg.eval.token_budget else "no token budget"
    header = f"Generator: {cfg.model.name}; judge: {cfg.judge.mode}; {budget}."
    table, with_ci = write_report(
        out / "report.md", header, current, results, all_labels(cfg, items)
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


def _token_counter(cfg: Config) -> Callable[[Passage], int]:
    """Context tokens of a passage as the generator's prompt shows it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve(cfg.eval.tokenizer or cfg.model.name))

    @functools.cache  # the budget and the record both count each passage
    def count(p: Passage) -> int:
        return len(tokenizer.encode(format_passages([p]), add_special_tokens=False))

    return count


def _record_id(example_id: str, label: str, fingerprint: str) -> str:
    return f"{example_id}|{label}|{fingerprint}"


def fingerprint(cfg: Config, label: str) -> str:
    """What produced a method's answers: the generator and its prompt, the judge, retrieval,
    the token budget, and for a picker its folder's prompt, config and weights."""
    what: dict[str, Any] = {
        "model": cfg.model.name,
        "generator": asdict(cfg.generator),
        "judge": asdict(cfg.judge),
        "retrieval": asdict(cfg.retrieval),
        "token_budget": cfg.eval.token_budget,
        "tokenizer": cfg.eval.tokenizer,
        "adaptive_min_k": cfg.eval.adaptive_min_k,
        "seed": cfg.seed,
        "label": label,
    }
    if label.startswith("picker:"):
        folder = Path(cfg.eval.pickers[label.removeprefix("picker:")])
        what["picker"] = [
            (f.name, _file_digest(f))
            for f in sorted(folder.iterdir())
            if f.suffix in (".json", ".safetensors")
        ]
    blob = json.dumps(what, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def _file_digest(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


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
        "id": f"{ex.id}|{label}",
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
