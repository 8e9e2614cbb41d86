"""Rollout side of a step: picker prompts for a batch, G samples each from the vLLM workers,
and the turn of samples + advantages into learner sequences."""

from __future__ import annotations

from dataclasses import dataclass

from ctxpick.engines.base import Completion, SamplingConfig
from ctxpick.engines.ray_pool import EnginePool
from ctxpick.picker.examples import PickerExample
from ctxpick.picker.format import output_regex, picker_chat
from ctxpick.rewards.service import RewardRequest
from ctxpick.rl.learner import TrainSequence


@dataclass
class Group:
    example: PickerExample
    samples: list[Completion]


def sample_groups(
    engines: EnginePool,
    batch: list[PickerExample],
    instruction: str,
    sampling: SamplingConfig,
    constrained: bool = False,
) -> list[Group]:
    chats = [picker_chat(instruction, ex.question, ex.passages) for ex in batch]
    if constrained:
        width = max(len(ex.passages) for ex in batch)
        sampling = SamplingConfig(**{**sampling.__dict__, "regex": output_regex(width)})
    outs = engines.generate(chats, sampling, batch_size=len(chats))
    return [Group(ex, samples) for ex, samples in zip(batch, outs, strict=True)]


def reward_requests(groups: list[Group]) -> list[RewardRequest]:
    return [
        RewardRequest(tuple(c.text for c in g.samples), len(g.example.passages), g.example.gold)
        for g in groups
    ]


def to_sequences(groups: list[Group], advantages: list[float]) -> list[TrainSequence]:
    """One sequence per sample, in group order, carrying its advantage and sampler log-probs."""
    samples = [c for g in groups for c in g.samples]
    return [
        TrainSequence(
            ids=c.prompt_token_ids + c.token_ids,
            prompt_len=len(c.prompt_token_ids),
            advantage=a,
            sampler_logps=c.logprobs if len(c.logprobs) == len(c.token_ids) else None,
        )
        for c, a in zip(samples, advantages, strict=True)
    ]
