"""Optional LoRA for the learner: low-rank adapters on chosen linear layers, everything else
frozen. Rollout workers and checkpoints' ``final/`` always get merged, plain weights under the
original names, so vLLM and the next stage never see the adapters."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, dtype=base.weight.dtype))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, dtype=base.weight.dtype))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.T @ self.lora_b.T) * self.scale

    def merged_weight(self) -> torch.Tensor:
        return self.base.weight + self.scale * (self.lora_b @ self.lora_a)


def apply_lora(model: nn.Module, rank: int, alpha: float, targets: list[str]) -> int:
    """Wrap every ``nn.Linear`` whose name ends with one of ``targets``; freeze the rest.
    Returns how many layers were wrapped."""
    model.requires_grad_(False)
    wrapped = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and name.split(".")[-1] in targets:
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            setattr(parent, name.rsplit(".", 1)[-1], LoRALinear(module, rank, alpha))
            wrapped += 1
    if not wrapped:
        raise ValueError(f"lora_targets {targets} match no linear layer of the model")
    return wrapped


def full_parameters(model: nn.Module, gather: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every parameter under the model's original names, adapters
    merged, on the model's device. ``gather(params)`` is a context manager that makes
    partitioned parameters whole (ZeRO-3: a collective, so every rank must iterate in step);
    a tensor is valid until the next one is requested."""
    lora = {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}
    for name, p in model.named_parameters():
        owner = name.rsplit(".", 2 if ".base." in name else 1)[0]
        if owner in lora:
            if name.endswith("base.weight"):
                with torch.no_grad():
                    yield f"{owner}.weight", lora[owner].merged_weight()
            elif name.endswith("base.bias"):
                yield f"{owner}.bias", p.detach()
            continue
        with gather([p]):
            yield name, p.detach()


def merged_state(model: nn.Module, gather: Any) -> dict[str, torch.Tensor]:
    """:func:`full_parameters` as a CPU state dict."""
    return {name: t.to("cpu", copy=True).contiguous() for name, t in full_parameters(model, gather)}
