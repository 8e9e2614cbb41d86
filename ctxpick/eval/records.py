"""Evaluation records' keys: what produced a method's answer (:func:`fingerprint`) and the
question's own content (:func:`example_digest`). A re-run skips a record only when both match,
so another picker, prompt, budget, fallback or an edited data file never reuses old rows."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ctxpick.config import Config
from ctxpick.data.schema import Example
from ctxpick.eval import methods as M
from ctxpick.paths import file_sha256
from ctxpick.picker.format import READER_VERSION


def record_keys(items: list[M.Retrieved], prints: dict[str, str]) -> dict[str, list[str]]:
    """Each method's record key for each question: the question's id, the method, what
    produced the answer (``prints``: :func:`fingerprint` by label) and the question's own
    content (:func:`example_digest`)."""
    digests = [example_digest(r.item.example) for r in items]
    return {
        label: [
            f"{r.item.example.id}|{label}|{fp}|{d}" for r, d in zip(items, digests, strict=True)
        ]
        for label, fp in prints.items()
    }


def example_digest(example: Example) -> str:
    """The question's content as loaded: its text, answers, documents and evidence. A data
    file edited under the same ids gives new keys, so its old judged rows are not reused."""
    blob = json.dumps(asdict(example), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def fingerprint(cfg: Config, label: str) -> str:
    """What produced a method's answers: the generator and its prompt, the judge, retrieval,
    the token budget, and for a picker its folder's prompt, config and weights and the
    fallback that decides when its output does not parse. The data is keyed per question
    (:func:`example_digest`)."""
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
    # The dtype joins the key only where it is not bf16, the one dtype of every row recorded
    # before it could change: those rows stay reusable where they would be computed alike.
    if (dtype := cfg.model.engine.compute_dtype()) != "bfloat16":
        what["dtype"] = dtype
    if label.startswith("crossenc_threshold"):
        what["crossenc_threshold"] = cfg.eval.crossenc_threshold
    if picker := M.matched_picker(label):  # its sizes are that picker's
        what["picker"] = fingerprint(cfg, f"picker:{picker}")
    if label.startswith("picker:"):
        folder = Path(cfg.eval.pickers[label.removeprefix("picker:")])
        what["picker"] = [
            (f.name, _file_digest(f))
            for f in sorted(folder.iterdir())
            if f.suffix in (".json", ".safetensors")
        ]
        what["picker_fallback"] = [cfg.eval.picker_fallback, cfg.eval.picker_fallback_k]
        if (dtype := cfg.rl.rollout.compute_dtype()) != "bfloat16":
            what["picker_dtype"] = dtype
        what["picker_reader"] = READER_VERSION  # how its outputs are read (read_pick)
    blob = json.dumps(what, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def _file_digest(path: Path) -> str:
    stat = path.stat()
    return _digest(str(path), stat.st_size, stat.st_mtime_ns)


@functools.cache  # a picker's weights are hashed once, not again for each of its matched rows
def _digest(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(path)
