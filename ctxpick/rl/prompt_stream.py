"""Where a stage stands (:class:`TrainState`, saved in every checkpoint) and the seeded order
in which it visits its training prompts."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from ctxpick.config import ConfigError
from ctxpick.picker.examples import PickerExample


@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    cursor: int = 0  # position in this epoch's shuffled order
    best_val: float = -math.inf
    best_step: int = 0  # the step whose validation reward is best_val
    bad_evals: int = 0
    stop_reason: str = ""
    val_history: list[dict[str, float]] = field(default_factory=list)


class PromptStream:
    """Seeded, reproducible batches: epoch e visits the examples in ``shuffle(seed, e)`` order;
    a batch never straddles two epochs. The position lives in :class:`TrainState`.

    ``repeats`` oversamples datasets (OpenRLHF's ``--prompt_data_probs``, as whole repeats so
    an epoch stays a fixed order a cursor can resume): each epoch lists a named dataset's
    examples that many times; datasets not named, once."""

    def __init__(
        self,
        examples: list[PickerExample],
        batch_size: int,
        seed: int,
        repeats: dict[str, int] | None = None,
    ) -> None:
        repeats = repeats or {}
        present = sorted({ex.dataset for ex in examples})
        if unknown := sorted(set(repeats) - set(present)):
            raise ConfigError(
                f"rl.dataset_repeats names {unknown}, which no training prompt comes from "
                f"(their datasets: {present})"
            )
        examples = [ex for ex in examples for _ in range(repeats.get(ex.dataset, 1))]
        if len(examples) < batch_size:
            raise ConfigError(
                f"{len(examples)} training prompts but rl.prompts_per_step={batch_size}: mine "
                "more data or lower rl.prompts_per_step"
            )
        self.examples, self.batch_size, self.seed = examples, batch_size, seed

    def next_batch(self, state: TrainState, size: int = 0) -> list[PickerExample]:
        """The next ``size`` prompts (0: a step's; dynamic sampling asks for fewer)."""
        size = size or self.batch_size
        if state.cursor + size > len(self.examples):
            state.epoch, state.cursor = state.epoch + 1, 0
        order = list(range(len(self.examples)))
        random.Random(f"{self.seed}:{state.epoch}").shuffle(order)
        idx = order[state.cursor : state.cursor + size]
        state.cursor += size
        return [self.examples[i] for i in idx]
