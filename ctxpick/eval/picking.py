"""A trained picker in an evaluation: its selections made as the service makes them, each on
the pool its ``picker.json`` says it was trained to read. One table can then hold pickers
trained on different orders of the same chunks (the main job's own picker on BM25's order
beside the shipped one on the cross-encoder's), each read as it would be deployed."""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path

from ctxpick.config import Config, ConfigError, inference_pool
from ctxpick.data.schema import Passage
from ctxpick.engines.ray_pool import EnginePool
from ctxpick.eval import methods as M
from ctxpick.picker.inference import Picker
from ctxpick.picker.spec import PickerSpec, pool_settings


def picker_ranking(cfg: Config, folder: str | Path) -> str:
    """The ranking (bm25, dense, crossenc) whose order the picker at ``folder`` was trained on:
    the evaluation's own pool retriever when the picker's ``picker.json`` agrees with it, else
    another ranking this evaluation can compute with the same chunking, query, embedder and
    reranker. A pool none of them reproduces is refused (another cut of the passages reads as
    noise to the picker)."""
    try:
        spec = PickerSpec.load(folder)
    except (OSError, ValueError) as err:
        raise ConfigError(f"eval.pickers: {err}") from None
    own = cfg.retrieval.pool.retriever
    for ranking in (own, *(r for r in M.RANKINGS if r != own)):
        pool = replace(cfg.retrieval.pool, retriever=ranking)
        if not spec.pool_mismatch(pool_settings(pool, cfg.retrieval.chunking, cfg.rl.pool_order)):
            return ranking
    mismatch = "; ".join(spec.pool_mismatch(inference_pool(cfg)))
    trained, here = (spec.pool or {}).get("chunking") or {}, asdict(cfg.retrieval.chunking)
    chunks = [f"retrieval.chunking.{k}={v}" for k, v in trained.items() if here.get(k) != v]
    raise ConfigError(
        f"eval.pickers: {folder} was trained on another pool than retrieval.pool / "
        f"retrieval.chunking give here, and no ranking here reproduces it (trained -> here: "
        f"{mismatch}): set retrieval.* as the picker's picker.json records them"
        + (f" (its chunks: {' '.join(chunks)})" if chunks else "")
    )


def runs_pickers(cfg: Config) -> bool:
    """Whether a configured method needs the pickers: their rows, or their set sizes."""
    return bool({"picker", "matched"} & set(cfg.eval.methods))


def picker_rankings(cfg: Config) -> dict[str, str]:
    """Each configured picker's ranking (:func:`picker_ranking`) by name, for the pickers whose
    ``picker.json`` can be read (a folder without one fails where it is read next: its record
    keys, or :func:`pick`)."""
    if not runs_pickers(cfg):
        return {}
    return {
        name: picker_ranking(cfg, folder)
        for name, folder in cfg.eval.pickers.items()
        if (Path(folder) / "picker.json").is_file()
    }


def pick(cfg: Config, path: str, items: list[M.Retrieved]) -> list[M.Selection]:
    """The picker at ``path`` on every question, on the pool it was trained to read."""
    if not (Path(path) / "config.json").exists():
        raise ConfigError(f"eval.pickers: {path} is not a model folder (a stage's final/)")
    ranking = picker_ranking(cfg, path)
    try:
        picker = Picker.from_pretrained(
            path,
            engine=lambda folder: EnginePool.from_config(folder, cfg.rl.rollout, cfg.seed),
            fallback=cfg.eval.picker_fallback,
            fallback_k=cfg.eval.picker_fallback_k,
            # The selection's picker-token counts go unused here (the harness counts the
            # generator's): no tokenizer to load, no passage to count.
            count_tokens=lambda text: 0,
        )
    except (OSError, ValueError) as err:  # the prompt is read before any engine starts
        raise ConfigError(f"eval.pickers: {err}") from None
    try:
        return picks_as_served(picker, items, ranking)
    finally:
        picker.engine.shutdown()


def picks_as_served(
    picker: Picker, items: list[M.Retrieved], ranking: str | None = None
) -> list[M.Selection]:
    """Each question's passages as the service would send them: through
    :meth:`Picker.pick_many`, the call the service makes, so the fallback on an output that
    does not parse is the served one and the kept passages come in the retriever's order.
    ``ranking``: the order the candidates come in (default: the evaluation's pool)."""
    pools = [ranked_pool(r, ranking) for r in items]
    candidates = [
        [_candidate(r.item.passages[i]) for i in p] for r, p in zip(items, pools, strict=True)
    ]
    t0 = time.time()
    served = picker.pick_many(
        [r.item.example.question for r in items],
        candidates,
        isolate_errors=False,  # an engine failure is no decision of the picker's: never recorded
    )
    per_item = (time.time() - t0) / max(len(items), 1)
    return [
        M.Selection(
            [r.item.passages[pool[i]] for i in sel.indices],
            per_item,
            {
                "pick_valid": sel.valid,
                "pick_output": sel.output,
                "pick_fallback": sel.fallback,
                # for the collapse diagnostics (ctxpick/picker/diagnostics.py): 1-based
                # positions in the pool, of the picker's choice or of the fallback's
                "pick_ids": [i + 1 for i in sel.indices] if sel.valid else None,
                "fallback_ids": None if sel.valid else [i + 1 for i in sel.indices],
                "shown_pids": [r.item.passages[i].pid for i in pool[: picker.spec.max_passages]],
                "gold_pids": r.item.gold_pids,
            },
        )
        for sel, r, pool in zip(served, items, pools, strict=True)
    ]


def ranked_pool(r: M.Retrieved, ranking: str | None = None) -> list[int]:
    """The indices of ``r``'s pool in ``ranking``'s order (default: the evaluation's own)."""
    return r.pool if ranking in (None, r.pool_retriever) else r.top(ranking)


def _candidate(p: Passage) -> dict[str, str]:
    return {"id": p.pid, "text": p.text, "title": p.title}
