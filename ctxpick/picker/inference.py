"""Picker inference: the Python API of a trained picker, and the batched call evaluation uses.

A picker is loaded from its model folder: the weights and ``picker.json``, the prompt and
passage cut it was trained with (:mod:`ctxpick.picker.spec`). An output that fails to parse
falls back to a configured policy (``top_k`` of the retriever order, or ``all`` of it): a
picker that cannot decide must not starve the generator, and the fallback is reported in the
result, never hidden.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ctxpick.data.schema import Passage
from ctxpick.engines.base import Chat, Completion, Engine, SamplingConfig
from ctxpick.picker.batcher import Batcher
from ctxpick.picker.format import InvalidPick, output_regex, read_pick
from ctxpick.picker.selection import (
    FALLBACKS,
    Candidate,
    Selection,
    as_passages,
    fallback_passages,
    fallback_selection,
    passage_tokens,
    select_within_budget,
    token_counter,
)
from ctxpick.picker.spec import SPEC_FILE, PickerSpec

log = logging.getLogger(__name__)

ENGINES = ("process", "actor")  # where Picker.from_pretrained runs the vLLM engine


@dataclass(frozen=True)
class PickResult:
    # The selected passages, full text, in the order picked; when the output does not parse,
    # the fallback policy's (``valid`` False).
    passages: list[Passage]
    text: str  # the picker's raw output
    rationale: str
    valid: bool
    reason: str = ""  # why the output was invalid ("" when valid)
    ids: tuple[int, ...] | None = None  # 1-based positions picked among those shown
    rationale_cut: bool = False  # the budget cut the rationale; the ids before it are kept


def pick_result(
    out: Completion, pool: Sequence[Passage], spec: PickerSpec, fallback: str, fallback_k: int
) -> PickResult:
    """What the picker's output ``out`` keeps of ``pool`` (best first; it was shown the first
    ``spec.max_passages``); an invalid output (:func:`read_pick`) keeps the ``fallback``
    policy's."""
    shown, text = list(pool[: spec.max_passages]), out.text
    try:
        pick = read_pick(text, len(shown), spec.output_format, out.finish_reason == "length")
    except InvalidPick as err:
        return PickResult(fallback_passages(pool, fallback, fallback_k), text, "", False, str(err))
    chosen = [shown[i - 1] for i in pick.ids]
    return PickResult(chosen, text, pick.rationale, True, "", pick.ids, pick.cut)


@dataclass
class Picker:
    engine: Engine
    spec: PickerSpec
    fallback: str = "top_k"  # top_k | all: who decides when the output does not parse
    fallback_k: int = 2
    # Constrain decoding to the output format (vLLM structured outputs); None: as the picker's
    # picker.json says (``decodes_constrained`` is the resolved choice).
    constrained: bool | None = None
    name: str = ""  # the model's name in results and the audit trail
    count_tokens: Callable[[str], int] = field(default=lambda text: len(text.split()))
    # Concurrent pick / apick calls share engine calls of up to this many questions; an idle
    # engine waits batch_wait_s for company.
    max_batch_size: int = 32
    batch_wait_s: float = 0.0

    def __post_init__(self) -> None:
        _check_options(self.constrained, self.fallback, self.fallback_k)
        # One engine call at a time (decide): an in-process vLLM engine hands a concurrent
        # call's outputs to whichever call collects first.
        self._engine_lock = threading.Lock()
        self._batcher = Batcher(self._pick_jobs, self.max_batch_size, self.batch_wait_s)

    @property
    def decodes_constrained(self) -> bool:
        return self.spec.constrained if self.constrained is None else self.constrained

    @classmethod
    def from_pretrained(
        cls,
        path_or_alias: str | Path,
        *,
        engine: str | Callable[[str], Engine] = "process",
        num_cpus: float = 1,
        num_gpus: float = 0,
        max_model_len: int = 4096,
        cpu_kv_cache_gb: int = 1,
        seed: int = 0,
        dtype: str = "auto",
        **options: Any,
    ) -> Picker:
        """The one way to load a picker. ``path_or_alias``: a trained model folder
        (``.../final``), a run folder (its ``pickers.json``: the last stage), or a built-in
        model alias (untrained: its config's prompt, and mostly fallbacks). ``engine``:
        ``process`` (a vLLM engine in this process), ``actor`` (a vLLM engine in a Ray actor of
        its own with ``num_cpus`` / ``num_gpus``, replaced if it dies: serving), or a function
        building the engine from the model folder (evaluation's engine pool). ``dtype``
        ``auto``: bf16 where the hardware has a fast path for it, else float32
        (:func:`~ctxpick.engines.vllm_engine.compute_dtype`); ``float32`` also makes greedy
        outputs far less sensitive to how calls are batched (CPU kernels are not
        batch-invariant), at about twice bf16's compute where bf16 has a fast path. The prompt
        is read before any engine starts, so a bad folder fails fast."""
        if not callable(engine) and engine not in ENGINES:
            raise ValueError(
                f"picker engine {engine!r}: expected one of {ENGINES} or a function of the folder"
            )
        if unknown := set(options) - ({f.name for f in fields(cls)} - {"engine", "spec"}):
            raise TypeError(f"Picker.from_pretrained: unknown options {sorted(unknown)}")
        # Checked before an engine starts: a bad option must not cost a model load.
        _check_options(
            options.get("constrained"),
            options.get("fallback", cls.fallback),
            options.get("fallback_k", cls.fallback_k),
        )
        Batcher.check(
            options.get("max_batch_size", cls.max_batch_size),
            options.get("batch_wait_s", cls.batch_wait_s),
        )
        from ctxpick.engines.vllm_engine import check_dtype

        check_dtype(dtype)
        folder, spec = load_spec(path_or_alias)
        if not callable(engine):
            engine = _vllm_engine(
                engine,
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                # one batch of concurrent calls is one engine call
                batch_size=options.get("max_batch_size", cls.max_batch_size),
                max_model_len=max_model_len,
                cpu_kv_cache_gb=cpu_kv_cache_gb,
                seed=seed,
                dtype=dtype,
            )
        options.setdefault("name", str(path_or_alias))
        if "count_tokens" not in options:  # loading a tokenizer costs a second: only if needed
            options["count_tokens"] = token_counter(folder)
        return cls(engine(folder), spec, **options)

    def chats(self, questions: Sequence[str], pools: Sequence[Sequence[Passage]]) -> list[Chat]:
        return [self.spec.chat(q, ps) for q, ps in zip(questions, pools, strict=True)]

    def decide(
        self, questions: Sequence[str], pools: Sequence[Sequence[Passage]]
    ) -> list[PickResult]:
        """``pools[i]`` best first; the picker sees its first ``max_passages``, cut to
        ``max_passage_words`` words each, and returns full passages. An output that does not
        parse returns what the fallback policy keeps of the whole pool: decided here, once, so
        serving and evaluation cannot send different passages for the same output."""
        sampling = SamplingConfig(temperature=0.0, max_tokens=self.spec.max_tokens)
        sizes = [min(len(p), self.spec.max_passages) for p in pools]
        with self._engine_lock:
            outs = generate_picks(
                self.engine,
                self.chats(questions, pools),
                sizes,
                sampling,
                self.spec,
                self.decodes_constrained,
            )
        return [
            pick_result(out[0], pool, self.spec, self.fallback, self.fallback_k)
            for out, pool in zip(outs, pools, strict=True)
        ]

    def pick_many(
        self,
        questions: Sequence[str],
        candidates: Sequence[Sequence[Candidate]],
        token_budgets: Sequence[int | None] | None = None,
        token_counts: Sequence[Sequence[int] | None] | None = None,
        isolate_errors: bool = True,
    ) -> list[Selection]:
        """One engine call for every question; ``candidates[i]`` in retriever order.
        ``token_counts[i]``: each candidate's tokens, when the caller has counted them already
        (the service's ingress, for its limits): the engine's thread does not count again.
        A question the engine fails on (a prompt past its context) gets the fallback policy's
        passages, its ``fallback`` naming the error; the others are decided as usual. With
        ``isolate_errors=False`` an engine error is raised instead (evaluation: a failure is
        not the picker's decision and must not be recorded as one)."""
        n = len(questions)
        budgets = list(token_budgets) if token_budgets is not None else [None] * n
        given = list(token_counts) if token_counts is not None else [None] * n
        if not n == len(candidates) == len(budgets) == len(given):
            raise ValueError(
                "pick_many: questions, candidates, token_budgets and token_counts differ in length"
            )
        pools = [as_passages(c) for c in candidates]
        counts = [
            list(c) if c is not None else passage_tokens(self.count_tokens, ps)
            for c, ps in zip(given, pools, strict=True)
        ]
        t0 = time.perf_counter()
        decisions = self._decide_each(questions, pools, isolate_errors)
        call = {"latency_ms": (time.perf_counter() - t0) * 1000, "batch_size": n}
        out = []
        for cands, res, budget, sizes in zip(candidates, decisions, budgets, counts, strict=True):
            if isinstance(res, Exception):
                reason = f"engine error ({type(res).__name__}: {res}): {self.fallback}"
                out.append(
                    fallback_selection(
                        cands, sizes, budget, self.fallback, self.fallback_k, reason, **call
                    )
                )
                continue
            out.append(
                select_within_budget(
                    cands,
                    sorted(res.passages, key=lambda p: p.doc_index),
                    sizes,
                    budget,
                    rationale=res.rationale,
                    valid=res.valid,
                    fallback=None
                    if res.valid
                    else f"invalid output ({res.reason}): {self.fallback}",
                    output=res.text,
                    rationale_cut=res.rationale_cut,
                    **call,
                )
            )
        return out

    def _decide_each(
        self, questions: Sequence[str], pools: Sequence[Sequence[Passage]], isolate: bool
    ) -> list[PickResult | Exception]:
        """One engine call for all; if it fails (and ``isolate``), one call per question, so
        that a question the engine refuses fails alone."""
        try:
            return list(self.decide(questions, pools))
        except Exception as err:
            if not isolate:
                raise
            if len(questions) == 1:
                return [err]
        out: list[PickResult | Exception] = []
        for question, pool in zip(questions, pools, strict=True):
            try:
                out.extend(self.decide([question], [pool]))
            except Exception as err:
                out.append(err)
        return out

    def pick(
        self, question: str, passages: Sequence[Candidate], token_budget: int | None = None
    ) -> Selection:
        """The minimal sufficient subset of ``passages`` (retriever order) for ``question``.
        Calls from several threads share engine calls (see :meth:`apick`)."""
        return self._submit(question, passages, token_budget, None).result()

    async def apick(
        self,
        question: str,
        passages: Sequence[Candidate],
        token_budget: int | None = None,
        token_counts: Sequence[int] | None = None,
    ) -> Selection:
        """:meth:`pick` without blocking the event loop: concurrent calls go into one engine
        call, up to ``max_batch_size``. A call cancelled before its engine call starts is
        dropped from it. ``token_counts``: as in :meth:`pick_many`."""
        return await asyncio.wrap_future(
            self._submit(question, passages, token_budget, token_counts)
        )

    def _submit(
        self,
        question: str,
        passages: Sequence[Candidate],
        budget: int | None,
        counts: Sequence[int] | None,
    ) -> Future:
        as_passages(passages)  # a bad candidate is its caller's error, not its whole batch's
        if counts is not None and len(counts) != len(passages):
            raise ValueError(f"token_counts: {len(counts)} counts for {len(passages)} passages")
        return self._batcher.submit((question, list(passages), budget, counts))

    def _pick_jobs(self, jobs: list[tuple]) -> list[Selection]:
        questions, candidates, budgets, counts = zip(*jobs, strict=True)
        return self.pick_many(questions, candidates, budgets, counts)


def _check_options(constrained: Any, fallback: str, fallback_k: int) -> None:
    if not (constrained is None or isinstance(constrained, bool)):
        raise ValueError(f"picker constrained {constrained!r}: expected a bool or None")
    if fallback not in FALLBACKS:
        raise ValueError(f"picker fallback {fallback!r}: expected one of {FALLBACKS}")
    if fallback_k < 1:
        raise ValueError("picker fallback_k: expected >= 1")


def _vllm_engine(
    kind: str, *, num_cpus: float, num_gpus: float, batch_size: int, **engine_kwargs: Any
) -> Callable[[str], Engine]:
    def start(folder: str) -> Engine:
        if kind == "process":
            from ctxpick.engines.vllm_engine import VLLMEngine

            return VLLMEngine(folder, **engine_kwargs)
        from ctxpick.engines.ray_pool import EnginePool

        return EnginePool.start(
            folder, 1, num_cpus=num_cpus, num_gpus=num_gpus, batch_size=batch_size, **engine_kwargs
        )

    return start


def generate_picks(
    engine: Engine,
    chats: list[Chat],
    sizes: Sequence[int],
    sampling: SamplingConfig,
    spec: PickerSpec,
    constrained: bool,
    **engine_kwargs: Any,
) -> list[list[Completion]]:
    """Picker outputs for ``chats`` (``sizes[i]``: passages shown in chat i). Constrained
    decoding allows only ids within each prompt's own pool, so prompts go in one call per
    pool size."""
    if not constrained:
        return engine.generate(chats, sampling, **engine_kwargs)
    outs: list[list[Completion] | None] = [None] * len(chats)
    for size in sorted(set(sizes)):
        idx = [i for i, s in enumerate(sizes) if s == size]
        regex = output_regex(size, spec.output_format)
        got = engine.generate(
            [chats[i] for i in idx], replace(sampling, regex=regex), **engine_kwargs
        )
        for i, o in zip(idx, got, strict=True):
            outs[i] = o
    return outs  # type: ignore[return-value]


def load_spec(ref: str | Path) -> tuple[str, PickerSpec]:
    """A picker reference as (model folder, the spec it is asked with): a trained folder's
    ``picker.json``, else a built-in model's config prompt."""
    folder, spec = resolve_picker(ref)
    return folder, spec or PickerSpec.load(folder)


def resolve_picker(ref: str | Path) -> tuple[str, PickerSpec | None]:
    """A picker reference as (model folder, spec); the spec is None when the folder carries
    its own ``picker.json`` (read by :func:`load_spec`)."""
    import json

    path = Path(ref).expanduser()
    if (path / SPEC_FILE).exists():
        return str(path.resolve()), None
    if (path / "pickers.json").exists():
        stages = json.loads((path / "pickers.json").read_text(encoding="utf-8"))
        if not stages:
            raise FileNotFoundError(f"{path}/pickers.json lists no trained stage")
        return resolve_picker(list(stages.values())[-1])
    if path.exists() or str(ref).startswith((".", "/", "~")):
        raise FileNotFoundError(
            f"{ref}: neither a trained picker (no {SPEC_FILE}) nor a run folder (no pickers.json)"
        )
    from ctxpick.engines.models import BUILTINS, resolve
    from ctxpick.picker.shipped import SHIPPED, picker_folder

    if str(ref) in SHIPPED:  # a trained picker in the package: merged into its base once
        return picker_folder(str(ref)), None
    # A built-in base model: the prompt its config trains with, untrained weights.
    if str(ref) not in BUILTINS:
        raise FileNotFoundError(
            f"{ref}: not a folder, a shipped picker ({list(SHIPPED)}) or a built-in model "
            f"({list(BUILTINS)})"
        )
    log.warning("%s is an untrained base model: most of its outputs will fall back", ref)
    return resolve(str(ref)), PickerSpec.builtin(str(ref))
