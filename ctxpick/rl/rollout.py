"""Rollout side of a step: picker prompts for a batch, G samples each from the vLLM workers,
and the turn of samples + advantages into learner sequences."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ctxpick.engines.base import Completion, SamplingConfig
from ctxpick.engines.ray_pool import EnginePool
from ctxpick.picker.examples import PickerExample
from ctxpick.picker.format import output_regex
from ctxpick.picker.spec import PickerSpec
from ctxpick.rewards.service import RewardRequest
from ctxpick.rl.learner import TrainSequence


@dataclass
class Group:
    example: PickerExample
    samples: list[Completion]


def sample_groups(
    engines: EnginePool,
    batch: list[PickerExample],
    spec: PickerSpec,
    sampling: SamplingConfig,
    constrained: bool = False,
) -> list[Group]:
    """``sampling.n`` samples per prompt. Constrained decoding allows only ids within each
    prompt's own pool, so prompts are sent in one call per pool size."""
    chats = [spec.chat(ex.question, ex.passages) for ex in batch]
    if not constrained:
        outs = engines.generate(chats, sampling, batch_size=len(chats))
        return [Group(ex, samples) for ex, samples in zip(batch, outs, strict=True)]
    by_size: dict[int, list[int]] = {}
    for i, ex in enumerate(batch):
        by_size.setdefault(len(ex.passages), []).append(i)
    groups: list[Group | None] = [None] * len(batch)
    for size, idx in by_size.items():
        regex = output_regex(min(size, spec.max_passages), spec.output_format)
        outs = engines.generate(
            [chats[i] for i in idx], replace(sampling, regex=regex), batch_size=len(idx)
        )
        for i, samples in zip(idx, outs, strict=True):
            groups[i] = Group(batch[i], samples)
    return groups  # type: ignore[return-value]


def reward_requests(groups: list[Group]) -> list[RewardRequest]:
    return [
        RewardRequest(tuple(c.text for c in g.samples), len(g.example.passages), g.example.gold)
        for g in groups
    ]


def to_sequences(groups: list[Group], advantages: list[float]) -> list[TrainSequence]:
    """One sequence per sample, in group order, carrying its advantage and sampler log-probs."""
    samples = [(k, c) for k, g in enumerate(groups) for c in g.samples]
    return [
        TrainSequence(
            ids=c.prompt_token_ids + c.token_ids,
            prompt_len=len(c.prompt_token_ids),
            advantage=a,
            sampler_logps=c.logprobs if len(c.logprobs) == len(c.token_ids) else None,
            group=k,
        )
        for (k, c), a in zip(samples, advantages, strict=True)
    ]
