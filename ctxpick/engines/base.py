"""The engine interface shared by mining, rollouts and evaluation."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Protocol

Chat = list[dict[str, str]]


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 64
    n: int = 1
    seed: int = 0  # VLLMEngine draws each prompt's own seed from it (prompt_seeds)
    stop: tuple[str, ...] = ()
    logprobs: bool = False  # also return sampling logprobs and the prompt's token ids
    regex: str | None = None  # constrain the output to this regex (vLLM structured outputs)


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str | None = None
    # Sampling logprob of each generated token, when SamplingConfig.logprobs is set.
    logprobs: list[float] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)  # when SamplingConfig.logprobs


class Engine(Protocol):
    def generate(self, chats: list[Chat], sampling: SamplingConfig) -> list[list[Completion]]:
        """One list of ``sampling.n`` completions per chat, in order."""
        ...


@dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter in PEFT's on-disk format, held in memory: what a rollout engine serving
    the base model needs to serve the learner's policy, and what ``final/adapter`` ships."""

    config: str  # adapter_config.json
    weights: bytes  # adapter_model.safetensors, PEFT's tensor names

    def write(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "adapter_config.json"), "w") as fh:
            fh.write(self.config)
        with open(os.path.join(folder, "adapter_model.safetensors"), "wb") as fh:
            fh.write(self.weights)
