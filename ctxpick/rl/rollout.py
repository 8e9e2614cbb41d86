"""Rollout side of a step: picker prompts for a batch, G samples each from the vLLM workers,
and the turn of samples + advantages into learner sequences."""

from __future__ import annotations

from dataclasses import dataclass

from ctxpick.engines.base import Completion, SamplingConfig
from ctxpick.engines.ray_pool import EnginePool
from ctxpick.picker.examples import PickerExample
from ctxpick.picker.inference import generate_picks
from ctxpick.picker.spec import PickerSpec
from ctxpick.rewards.service import RewardRequest
from ctxpick.rl.batching import TrainSequence


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
    """``sampling.n`` samples per prompt (constrained: see :func:`generate_picks`)."""
    chats = [spec.chat(ex.question, ex.passages) for ex in batch]
    sizes = [min(len(ex.passages), spec.max_passages) for ex in batch]
    outs = generate_picks(engines, chats, sizes, sampling, spec, constrained, batch_size=len(chats))
    return [Group(ex, samples) for ex, samples in zip(batch, outs, strict=True)]


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
