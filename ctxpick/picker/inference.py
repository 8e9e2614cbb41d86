"""Picker inference: the Python API of a trained picker, and the batched call evaluation uses.

A picker is loaded from its model folder: the weights and ``picker.json``, the prompt and
passage cut it was trained with (:mod:`ctxpick.picker.spec`). An output that fails to parse
falls back to a configured policy (``top_k`` of the retriever order, or ``all`` of it): a
picker that cannot decide must not starve the generator, and the fallback is reported in the
result, never hidden.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ctxpick.data.schema import Passage
from ctxpick.engines.base import Chat, Completion, Engine, SamplingConfig
from ctxpick.engines.prompts import format_passages
from ctxpick.picker.format import InvalidPick, output_regex, parse_pick
from ctxpick.picker.spec import SPEC_FILE, PickerSpec

log = logging.getLogger(__name__)

FALLBACKS = ("top_k", "all")
# What a caller may hand in as a candidate: plain text, or a record with ``text`` and
# optional ``id`` / ``title`` (a retriever's hit).
Candidate = str | Mapping[str, Any]


@dataclass(frozen=True)
class PickResult:
    passages: list[Passage]  # the selected passages, full text, in the order picked
    text: str  # the picker's raw output
    rationale: str
    valid: bool
    reason: str = ""  # why the output was invalid
    ids: tuple[int, ...] | None = None  # 1-based positions picked among those shown


@dataclass(frozen=True)
class Selection:
    """What :meth:`Picker.pick` decided for one question."""

    ids: list[str | int]  # the kept candidates' ids (their 0-based position if they had none)
    indices: list[int]  # their 0-based positions in the request: retriever order
    passages: list[Candidate]  # the kept candidates as given, in retriever order
    rationale: str
    tokens_in: int  # tokens of every candidate (picker tokenizer)
    tokens_kept: int  # tokens of the kept ones
    valid: bool  # the picker's output parsed
    fallback: str | None  # why the fallback policy chose instead of the picker (None: it did)
    budget_cut: bool  # ``token_budget`` dropped picked passages (the last ones in order)
    latency_ms: float  # the engine call this question was part of
    output: str = ""  # the picker's raw output
    batch_size: int = 1  # questions in that engine call

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def apply_budget(
    passages: list[Passage], budget: int | None, count: Callable[[Passage], int]
) -> tuple[list[Passage], bool]:
    """Keep passages in order while their tokens fit in ``budget``; True if any was cut."""
    if budget is None:
        return passages, False
    kept, used = [], 0
    for p in passages:
        n = count(p)
        if used + n > budget:
            return kept, True
        kept.append(p)
        used += n
    return kept, False


def caller_id(candidate: Candidate, index: int) -> str | int:
    """A candidate's id as its caller knows it: its own, else its 0-based position."""
    own = None if isinstance(candidate, str) else candidate.get("id")
    return index if own is None else own


def as_passages(candidates: Sequence[Candidate]) -> list[Passage]:
    """Candidates as passages whose ``doc_index`` is their position in the request."""
    if not candidates:
        raise ValueError("passages: empty list (nothing to pick from)")
    out = []
    for i, c in enumerate(candidates):
        if isinstance(c, str):
            out.append(Passage(str(i), i, 0, len(c), c))
            continue
        if not isinstance(c, Mapping) or not isinstance(c.get("text"), str):
            raise ValueError(f"passages[{i}]: expected a string or a mapping with a 'text' string")
        title = c.get("title") or ""
        if not isinstance(title, str):
            raise ValueError(f"passages[{i}].title: expected a string")
        out.append(Passage(str(caller_id(c, i)), i, 0, len(c["text"]), c["text"], title))
    return out


@dataclass
class Picker:
    engine: Engine
    spec: PickerSpec
    fallback: str = "top_k"  # top_k | all: who decides when the output does not parse
    fallback_k: int = 2
    constrained: bool = False  # constrain decoding to the output format (vLLM structured outputs)
    name: str = ""  # the model's name in results and the audit trail
    count_tokens: Callable[[str], int] = field(default=lambda text: len(text.split()))

    def __post_init__(self) -> None:
        if self.fallback not in FALLBACKS:
            raise ValueError(f"picker fallback {self.fallback!r}: expected one of {FALLBACKS}")
        if self.fallback_k < 1:
            raise ValueError("picker fallback_k: expected >= 1")

    @classmethod
    def from_pretrained(
        cls,
        path_or_alias: str | Path,
        *,
        engine: Callable[[str], Engine] | None = None,
        max_model_len: int = 4096,
        cpu_kv_cache_gb: int = 1,
        seed: int = 0,
        **options: Any,
    ) -> Picker:
        """The one way to load a picker. ``path_or_alias``: a trained model folder
        (``.../final``), a run folder (its ``pickers.json``: the last stage), or a built-in
        model alias (untrained: its config's prompt, and mostly fallbacks). ``engine`` builds
        the engine from the model folder (an :class:`~ctxpick.engines.ray_pool.EnginePool` in
        evaluation and serving); by default an in-process vLLM engine. The prompt is read
        before any engine starts, so a bad folder fails fast."""
        folder, spec = resolve_picker(path_or_alias)
        spec = spec or PickerSpec.load(folder)
        if engine is None:
            from ctxpick.engines.vllm_engine import VLLMEngine

            def engine(folder: str) -> Engine:
                return VLLMEngine(
                    folder, max_model_len=max_model_len, cpu_kv_cache_gb=cpu_kv_cache_gb, seed=seed
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
        ``max_passage_words`` words each, and returns full passages."""
        sampling = SamplingConfig(temperature=0.0, max_tokens=self.spec.max_tokens)
        sizes = [min(len(p), self.spec.max_passages) for p in pools]
        outs = generate_picks(
            self.engine, self.chats(questions, pools), sizes, sampling, self.spec, self.constrained
        )
        results = []
        for out, pool in zip(outs, pools, strict=True):
            ps, text = list(pool[: self.spec.max_passages]), out[0].text
            try:
                pick = parse_pick(text, len(ps), self.spec.output_format)
            except InvalidPick as err:
                results.append(PickResult(ps, text, "", False, str(err)))
                continue
            chosen = [ps[i - 1] for i in pick.ids]
            results.append(PickResult(chosen, text, pick.rationale, True, ids=pick.ids))
        return results

    def pick_many(
        self,
        questions: Sequence[str],
        candidates: Sequence[Sequence[Candidate]],
        token_budgets: Sequence[int | None] | None = None,
        token_counts: Sequence[Sequence[int]] | None = None,
    ) -> list[Selection]:
        """One engine call for every question; ``candidates[i]`` in retriever order.
        ``token_counts[i]``: each candidate's tokens, when the caller has counted them already
        (the service's ingress, for its limits): the engine's thread does not count again."""
        budgets = list(token_budgets) if token_budgets is not None else [None] * len(questions)
        if not len(questions) == len(candidates) == len(budgets):
            raise ValueError("pick_many: questions, candidates and token_budgets differ in length")
        pools = [as_passages(c) for c in candidates]
        counts = token_counts or [passage_tokens(self.count_tokens, ps) for ps in pools]
        t0 = time.perf_counter()
        decisions = self.decide(questions, pools)
        latency = (time.perf_counter() - t0) * 1000
        out = []
        for cands, pool, res, budget, sizes in zip(
            candidates, pools, decisions, budgets, counts, strict=True
        ):
            fallback = None
            if res.valid:
                chosen = sorted(res.passages, key=lambda p: p.doc_index)
            else:
                fallback = f"invalid output ({res.reason}): {self.fallback}"
                chosen = pool[: self.fallback_k] if self.fallback == "top_k" else pool
            kept, cut = apply_budget(chosen, budget, lambda p, n=sizes: n[p.doc_index])
            out.append(
                Selection(
                    ids=[caller_id(cands[p.doc_index], p.doc_index) for p in kept],
                    indices=[p.doc_index for p in kept],
                    passages=[cands[p.doc_index] for p in kept],
                    rationale=res.rationale,
                    tokens_in=sum(sizes),
                    tokens_kept=sum(sizes[p.doc_index] for p in kept),
                    valid=res.valid,
                    fallback=fallback,
                    budget_cut=cut,
                    latency_ms=latency,
                    output=res.text,
                    batch_size=len(questions),
                )
            )
        return out

    def pick(
        self, question: str, passages: Sequence[Candidate], token_budget: int | None = None
    ) -> Selection:
        """The minimal sufficient subset of ``passages`` (retriever order) for ``question``."""
        return self.pick_many([question], [passages], [token_budget])[0]

    async def apick(
        self, question: str, passages: Sequence[Candidate], token_budget: int | None = None
    ) -> Selection:
        """:meth:`pick` off the event loop (the engine call blocks)."""
        import asyncio

        return await asyncio.to_thread(self.pick, question, passages, token_budget)


def token_counter(folder: str) -> Callable[[str], int]:
    """Tokens of a text under the picker's own tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def passage_tokens(count_tokens: Callable[[str], int], passages: Sequence[Passage]) -> list[int]:
    """Each passage's tokens as the generator reads it (its context line)."""
    return [count_tokens(format_passages([p])) for p in passages]


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


def resolve_picker(ref: str | Path) -> tuple[str, PickerSpec | None]:
    """A picker reference as (model folder, spec); the spec is None when the folder carries
    its own ``picker.json`` (read by :meth:`Picker.from_pretrained`)."""
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
    # A built-in base model: the prompt its config trains with, untrained weights.
    from ctxpick.config import compose, picker_spec
    from ctxpick.engines.models import BUILTINS, resolve

    if str(ref) not in BUILTINS:
        raise FileNotFoundError(f"{ref}: not a folder and not a built-in model ({list(BUILTINS)})")
    log.warning("%s is an untrained base model: most of its outputs will fall back", ref)
    return resolve(str(ref)), picker_spec(compose([f"picker.model={ref}"]))
