"""Minimal-sufficient evidence miners.

An :class:`Oracle` answers "does the generator, reading exactly these pool passages, give an
answer the judge accepts?" for a batch of subsets. Both miners return a set that is
*1-minimal*: the oracle accepts it and rejects every set made by removing one passage (sets
keep at least one passage).

``mine_reference`` is the paper's Algorithm 1 verbatim: one generator call at a time.
``mine_fast`` reaches the same guarantee with far fewer generator calls and tokens: it finds
the needed passages one per batched call, lowest-ranked first, by testing every ranked prefix
(plus the passages already found) at once; those prompts share the full-pool prompt's prefix,
so vLLM's prefix cache serves most of their tokens. A final batched round of leave-one-out
subsets certifies the set (and repairs it if the generator is not monotone).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ctxpick.data.schema import Pool
from ctxpick.engines.base import Engine, SamplingConfig
from ctxpick.engines.prompts import answer_chat
from ctxpick.judge.judges import Judge, JudgeItem

Subset = tuple[int, ...]


class Oracle(Protocol):
    calls: int  # engine invocations (one per batch)
    prompts: int  # prompts generated

    def check(self, subsets: Sequence[Subset]) -> list[bool]: ...


@dataclass
class MineResult:
    kept: bool
    selected: Subset
    calls: int
    prompts: int
    rounds: int
    seconds: float
    reason: str = ""


def _result(
    kept: bool, selected: Subset, oracle: Oracle, rounds: int, t0: float, reason: str = ""
) -> MineResult:
    return MineResult(
        kept, selected, oracle.calls, oracle.prompts, rounds, time.time() - t0, reason
    )


def _without(selected: Subset, drop: Sequence[int]) -> Subset:
    return tuple(p for p in selected if p not in set(drop))


def mine_reference(oracle: Oracle, n: int) -> MineResult:
    """Algorithm 1: generate from the whole pool; discard if wrong; then keep removing single
    passages whose removal keeps the answer correct until none does."""
    t0, rounds = time.time(), 1
    selected = tuple(range(n))
    if not oracle.check([selected])[0]:
        return _result(False, (), oracle, rounds, t0, "wrong on full pool")
    removed = True
    while removed:  # passes over the pool until one pass removes nothing
        removed = False
        for p in selected:
            trial = _without(selected, [p])
            if trial:
                rounds += 1
                if oracle.check([trial])[0]:
                    selected, removed = trial, True
    return _result(True, selected, oracle, rounds, t0)


def mine_fast(oracle: Oracle, n: int) -> MineResult:
    t0 = time.time()
    if not oracle.check([tuple(range(n))])[0]:  # alone: a discard costs one call
        return _result(False, (), oracle, 1, t0, "wrong on full pool")
    # Find needed passages one at a time, lowest-ranked first: the shortest ranked prefix that
    # passes together with the passages already required ends in a passage that is needed.
    # All prefixes go in one batched call; each shares the full-pool prompt's prefix, so the
    # engine's prefix cache makes them cheap.
    required: list[int] = []
    hi, rounds = n, 1
    while hi > 0:
        lengths = list(range(0 if required else 1, hi))
        trials = [tuple(sorted({*range(j), *required})) for j in lengths]
        verdicts = oracle.check(trials) if trials else []
        rounds += 1
        passing = [j for j, ok in zip(lengths, verdicts, strict=True) if ok]
        if required and passing and passing[0] == 0:
            break  # the required passages suffice on their own
        shortest = passing[0] if passing else hi  # prefix(hi) + required is known to pass
        required.append(shortest - 1)
        hi = shortest - 1
    selected = tuple(sorted(required))
    # Certify: every single removal must flip the verdict. With a non-monotone generator a
    # removal can still pass; drop what passes (all at once when that passes too) and re-certify.
    while len(selected) > 1:
        rounds += 1
        ok = oracle.check([_without(selected, [p]) for p in selected])
        removable = [p for p, v in zip(selected, ok, strict=True) if v]
        if not removable:
            break
        group = _without(selected, removable)
        if len(removable) > 1 and group and oracle.check([group])[0]:
            selected = group
        else:
            selected = _without(selected, removable[-1:])  # the lowest-ranked removable one
    return _result(True, selected, oracle, rounds, t0)


MINERS: dict[str, Callable[[Oracle, int], MineResult]] = {
    "reference": mine_reference,
    "fast": mine_fast,
}


def is_one_minimal(oracle: Oracle, selected: Subset) -> bool:
    """Certify: the set passes and each single removal (keeping >= 1 passage) fails."""
    trials = [selected] + [_without(selected, [p]) for p in selected if len(selected) > 1]
    verdicts = oracle.check(trials)
    return verdicts[0] and not any(verdicts[1:])


@dataclass
class GeneratorOracle:
    """The real oracle: the generator answers from the chosen passages, the judge grades it.
    Verdicts are memoised per subset, so a subset costs one generator call at most."""

    pool: Pool
    engine: Engine
    judge: Judge
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_tokens=32))
    system: str = ""
    calls: int = 0
    prompts: int = 0
    answers: dict[Subset, str] = field(default_factory=dict)
    _memo: dict[Subset, bool] = field(default_factory=dict)

    def check(self, subsets: Sequence[Subset]) -> list[bool]:
        todo = [s for s in dict.fromkeys(subsets) if s not in self._memo]
        if todo:
            chats = [
                answer_chat(self.pool.question, [self.pool.passages[i] for i in s], self.system)
                for s in todo
            ]
            outs = self.engine.generate(chats, self.sampling)
            self.calls += 1
            self.prompts += len(todo)
            unanswerable = bool(self.pool.meta.get("unanswerable"))
            preds = [o[0].text.strip() for o in outs]
            items = [
                JudgeItem(self.pool.question, tuple(self.pool.answers), p, unanswerable)
                for p in preds
            ]
            for s, pred, verdict in zip(todo, preds, self.judge(items), strict=True):
                self._memo[s], self.answers[s] = verdict, pred
        return [self._memo[s] for s in subsets]
