"""A global batch of sequences cut for the learners: whole prompt groups into mini-batches,
each into micro-batches (one prompt and its responses: the prompt-sharing forward of
:mod:`ctxpick.rl.logprobs`) dealt to the data-parallel ranks, and collated into tensors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrainSequence:
    ids: list[int]  # prompt + response token ids
    prompt_len: int  # loss is on ids[prompt_len:]
    advantage: float = 0.0
    sampler_logps: list[float] | None = None  # the rollout engine's logprob of each response token
    group: int = -1  # sequences sharing a prompt share a group id; -1: a group of its own
    weights: list[float] | None = None  # sft: loss weight of each response token (None: 1)


@dataclass(frozen=True)
class MicroBatch:
    """One prompt with up to ``micro_batch_size`` of its responses. A padding micro-batch is a
    zero-weight copy that gives every rank the same number of forward/backward passes:
    DeepSpeed's collectives (gradient reduction, ZeRO-3 gathers) hang otherwise."""

    seqs: list[TrainSequence]
    padding: bool = False


Plan = list[list[MicroBatch]]  # one rank's mini-batches, each a list of micro-batches


def prompt_groups(seqs: list[TrainSequence]) -> list[list[TrainSequence]]:
    """Consecutive sequences with the same ``group`` id (each ``-1`` stands alone)."""
    out: list[list[TrainSequence]] = []
    for s in seqs:
        if out and s.group >= 0 and out[-1][0].group == s.group:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def micro_batches(seqs: list[TrainSequence], size: int) -> list[MicroBatch]:
    """Each prompt group cut into micro-batches of at most ``size`` sequences."""
    return [
        MicroBatch(g[i : i + size]) for g in prompt_groups(seqs) for i in range(0, len(g), size)
    ]


def collate(mb: MicroBatch, device: Any) -> dict[str, Any]:
    """One prompt and its right-padded responses: where their tokens are (``present``), the
    loss mask (``mask``: ``present``, or all zero for a padding micro-batch, which runs the same
    passes but learns nothing), advantages and the sampler's log-probs, aligned with them."""
    import torch

    group = mb.seqs
    width = max(len(s.ids) - s.prompt_len for s in group)
    ids = torch.zeros(len(group), width, dtype=torch.long)
    present = torch.zeros(len(group), width)
    sampler = torch.zeros(len(group), width)
    weight = torch.ones(len(group), width)
    for i, s in enumerate(group):
        if not 0 < s.prompt_len < len(s.ids):
            raise ValueError(f"sequence {i}: prompt_len {s.prompt_len} of {len(s.ids)} tokens")
        if s.ids[: s.prompt_len] != group[0].ids[: group[0].prompt_len]:
            raise ValueError(f"sequence {i} of a micro-batch does not share its prompt")
        n = len(s.ids) - s.prompt_len
        ids[i, :n] = torch.tensor(s.ids[s.prompt_len :])
        present[i, :n] = 1.0
        if s.sampler_logps is not None:
            sampler[i, :n] = torch.tensor(s.sampler_logps)
        if s.weights is not None:
            weight[i, :n] = torch.tensor(s.weights)
    has_sampler = all(s.sampler_logps is not None for s in group)
    return {
        "prompt": torch.tensor(group[0].ids[: group[0].prompt_len]).to(device),
        "ids": ids.to(device),
        "present": present.to(device),
        "mask": (present * (0.0 if mb.padding else 1.0)).to(device),
        "adv": torch.tensor([s.advantage for s in group]).to(device),
        "weight": weight.to(device),
        "sampler": sampler.to(device) if has_sampler else None,
    }


def plan_updates(
    seqs: list[TrainSequence], micro_batch_size: int, ranks: int, mini_batches: int = 1
) -> tuple[list[Plan], list[int]]:
    """Split a global batch into ``mini_batches`` mini-batches of whole prompt groups, each into
    micro-batches dealt round-robin to ``ranks``; ranks short of the most get padding
    micro-batches, so every rank runs the same number of passes whatever the group sizes.
    Returns each rank's plan and each mini-batch's response-token count."""
    groups = prompt_groups(seqs)
    if len(groups) < mini_batches:
        raise ValueError(
            f"{len(groups)} prompt groups cannot fill rl.learner.grpo.mini_batches={mini_batches}"
        )
    plans: list[Plan] = [[] for _ in range(ranks)]
    tokens = []
    for m in range(mini_batches):
        chunk = groups[m * len(groups) // mini_batches : (m + 1) * len(groups) // mini_batches]
        mbs = micro_batches([s for g in chunk for s in g], micro_batch_size)
        shards = [mbs[r::ranks] for r in range(ranks)]
        width = max(len(shard) for shard in shards)
        for plan, shard in zip(plans, shards, strict=True):
            plan.append(shard + [MicroBatch(mbs[0].seqs, padding=True)] * (width - len(shard)))
        tokens.append(sum(len(s.ids) - s.prompt_len for g in chunk for s in g))
    return plans, tokens
