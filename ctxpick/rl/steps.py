"""What one training step does, on the actors of a :class:`~ctxpick.rl.run.Run`: GRPO's
rollout (:func:`collect`: sample, score, keep the groups with signal) and update
(:func:`learn`), the warm start's supervised step, and greedy validation. The stage's loop
(:mod:`ctxpick.rl.trainer`) decides when each runs, and whether a step's rollouts are
generated while the previous step learns (``rl.async_level``)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

import torch

from ctxpick.config import Config, picker_spec
from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.vllm_engine import chat_prompt_ids
from ctxpick.picker.diagnostics import PickRecord, diagnose
from ctxpick.picker.examples import PickerExample, warm_start_pick
from ctxpick.picker.format import InvalidPick, parse_pick, render_pick
from ctxpick.rewards.reward import RewardSpec, RewardTerms
from ctxpick.rl.batching import TrainSequence
from ctxpick.rl.dynamic_sampling import carries_signal, draw_signal_groups, zero_variance_share
from ctxpick.rl.grpo import group_advantages
from ctxpick.rl.rollout import Group, reward_requests, sample_groups, to_sequences
from ctxpick.rl.run import Run


class StepTimer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):  # noqa: ANN204 - a context manager
        t0 = time.time()
        yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.time() - t0


def sampling(cfg: Config, step: int, greedy: bool = False, draw: int = 0) -> SamplingConfig:
    return SamplingConfig(
        temperature=0.0 if greedy else cfg.picker.temperature,
        max_tokens=cfg.picker.max_tokens,
        n=1 if greedy else cfg.stage.group_size,
        # The step's seed (a resumed step samples the same); each prompt draws its own from it,
        # and so does each draw of a step (dynamic sampling), should a prompt come up twice.
        seed=cfg.seed * 1_000_003 + step + (draw << 32),
        logprobs=True,
    )


def _term_means(terms: list[RewardTerms]) -> dict[str, float]:
    valid = [t for t in terms if t.format_ok]
    return {
        "reward": mean(t.reward for t in terms),
        "coverage": mean(t.coverage for t in terms),
        "redundancy_penalty": mean(t.penalty for t in terms),
        "format_valid": len(valid) / len(terms),
        "recall_valid": mean(t.coverage for t in valid) if valid else 0.0,
        "mean_size": mean(t.size for t in valid) if valid else 0.0,
        "over_margin": mean(float(t.over_margin) for t in terms),
        "reward_timeouts": sum(t.timed_out for t in terms),
    }


Scored = tuple[Group, list[RewardTerms]]


@dataclass
class Rollouts:
    """A step's scored prompt groups: those it trains on and every one drawn. ``version``: the
    policy that sampled them, as the number of optimizer steps its weights had taken."""

    kept: list[Scored]
    drawn: list[Scored]
    version: int
    seconds: dict[str, float] = field(default_factory=dict)  # rollout and reward time

    @property
    def groups(self) -> list[Group]:
        return [g for g, _ in self.drawn]


def collect(
    run: Run,
    batch: list[PickerExample],
    spec: RewardSpec,
    step: int,
    version: int,
    more: Callable[[int], list[PickerExample]] | None = None,
) -> Rollouts:
    """Sample and score ``batch`` with the engines' current policy (``version``); with
    ``rl.dynamic_sampling``, groups without signal are replaced by groups of ``more(n)``
    prompts."""
    cfg, timer = run.cfg, StepTimer()

    def draw(n: int, d: int) -> list[Scored]:
        prompts = batch if d == 0 else more(n)  # type: ignore[misc]
        with timer("rollout"):
            groups = sample_groups(
                run.engines,
                prompts,
                picker_spec(cfg),
                sampling(cfg, step, draw=d),
                cfg.picker.constrained,
            )
        with timer("reward"):
            return list(zip(groups, run.rewards.score(reward_requests(groups), spec), strict=True))

    if cfg.rl.dynamic_sampling and more is not None:
        kept, drawn = draw_signal_groups(draw, _signal, len(batch), cfg.rl.max_prompt_draws)
    else:
        kept = drawn = draw(len(batch), 0)
    return Rollouts(kept, drawn, version, timer.seconds)


def _signal(scored: Scored) -> bool:
    return carries_signal([t.reward for t in scored[1]])


def learn(run: Run, rollouts: Rollouts) -> dict[str, float]:
    """One GRPO update on ``rollouts``; returns the step's metrics."""
    cfg = run.cfg
    rewards = torch.tensor([t.reward for _, ts in rollouts.kept for t in ts])
    adv = group_advantages(rewards, cfg.stage.group_size, cfg.rl.learner.grpo.std_normalize)
    t0 = time.time()
    seqs = to_sequences([g for g, _ in rollouts.kept], adv.tolist())
    stats = run.learners.step("grpo_step", seqs, cfg.picker.temperature)
    terms = [t for _, ts in rollouts.drawn for t in ts]
    return {**_term_means(terms), **stats} | {
        "prompt_tokens": sum(len(g.samples[0].prompt_token_ids) for g, _ in rollouts.kept),
        "zero_variance_groups": zero_variance_share([_signal(s) for s in rollouts.drawn]),
        "prompts_drawn": len(rollouts.drawn),
        "groups_trained": len(rollouts.kept),
        "time/learn": time.time() - t0,
    }


def grpo_step(
    run: Run,
    batch: list[PickerExample],
    spec: RewardSpec,
    step: int,
    more: Callable[[int], list[PickerExample]] | None = None,
) -> tuple[dict[str, float], Rollouts]:
    """An on-policy step: :func:`collect` then :func:`learn`."""
    rollouts = collect(run, batch, spec, step, step, more)
    metrics = learn(run, rollouts)
    return metrics | {f"time/{k}": v for k, v in rollouts.seconds.items()}, rollouts


def sft_step(run: Run, batch: list[PickerExample]) -> dict[str, float]:
    spec, eos = picker_spec(run.cfg), run.tokenizer.eos_token_id
    seqs = []
    for ex in batch:
        prompt = chat_prompt_ids(run.tokenizer, spec.chat(ex.question, ex.passages))
        text = render_pick(
            warm_start_pick(ex, spec.max_passage_words, rationale=run.cfg.stage.rationale),
            spec.output_format,
        )
        target, weights = weighted_target(run.tokenizer, text, run.cfg.stage.id_weight)
        seqs.append(TrainSequence(prompt + target + [eos], len(prompt), weights=[*weights, 1.0]))
    t0 = time.time()
    return run.learners.step("sft_step", seqs) | {"time/learn": time.time() - t0}


def weighted_target(tokenizer: Any, text: str, id_weight: float) -> tuple[list[int], list[float]]:
    """The warm-start target's tokens and their loss weights: ``id_weight`` on the tokens of
    ``<ids>...</ids>`` (the decision), 1 on the rest. Offsets, not separate encodes, find the
    span, so the tokens are exactly the ones the model would write."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    start, stop = text.index("<ids>"), text.index("</ids>") + len("</ids>")
    weights = [id_weight if b < stop and e > start else 1.0 for b, e in enc["offset_mapping"]]
    return list(enc["input_ids"]), weights


def validate(run: Run, val: list[PickerExample], spec: RewardSpec) -> dict[str, float]:
    """Greedy picks on the validation prompts, scored with the stage's reward, and the collapse
    diagnostics (a picker giving the same ids whatever the question shows here first)."""
    picker = picker_spec(run.cfg)
    groups = sample_groups(run.engines, val, picker, sampling(run.cfg, 0, True))
    terms = run.rewards.score(reward_requests(groups), spec)
    flat = [t for ts in terms for t in ts]
    if invalid := Counter(t.reason for t in flat if not t.format_ok):
        # Why greedy outputs fail is what a warm start needs to know (e.g. ids counted on
        # 1, 2, 3, ... until the rationale runs past picker.max_tokens), not just how many do.
        reasons = ", ".join(f"{why} ({n})" for why, n in invalid.most_common(3))
        print(f"    validation: {invalid.total()}/{len(flat)} invalid: {reasons}", flush=True)
        bad = next(
            s.text
            for g, ts in zip(groups, terms, strict=True)
            for s, t in zip(g.samples, ts, strict=True)
            if not t.format_ok
        )
        print(f"    e.g. {bad[:300]!r}", flush=True)
    metrics = _term_means(flat)
    d = diagnose([_pick_record(g, picker.output_format) for g in groups])
    metrics |= {
        "distinct_sets": d.distinct_sets,
        "top_set_share": d.top_set_share,
        "f1_minus_random": mean(d.f1) - mean(d.random_f1) if d.f1 else 0.0,
    }
    return {f"val/{k}": v for k, v in metrics.items()}


def _pick_record(g: Group, fmt: str) -> PickRecord:
    n = len(g.example.passages)
    try:
        ids: tuple[int, ...] | None = parse_pick(g.samples[0].text, n, fmt).ids
    except InvalidPick:
        ids = None
    return PickRecord(ids, n, g.example.gold)
