"""Optional LoRA for the learner, through peft: low-rank adapters injected in place on chosen
linear layers, everything else frozen. Rollout workers get either the adapter alone, in PEFT's
format (:func:`adapter`: vLLM serves it on the base model it loaded once), or merged, plain
weights under the original names (:func:`full_parameters`: GPU weight transfer, ``lora_sync:
merged``). ``final/`` holds the merged weights, so inference and the next stage never see the
adapters, and the adapter alone in ``final/adapter`` for shipping.

peft's adapters are injected into the model itself (``inject_adapter_in_model``) rather than
wrapping it in a ``PeftModel``: the learner's shared-prompt pass calls the decoder body
(``model.model``) directly, and a merged ``save_pretrained`` needs the plain model class."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ctxpick.engines.base import LoraAdapter

ADAPTER = "default"


def apply_lora(model: nn.Module, rank: int, alpha: float, targets: list[str]) -> int:
    """Inject adapters into every ``nn.Linear`` whose name ends with one of ``targets``;
    freeze the rest. Returns how many layers were wrapped."""
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.lora import LoraLayer

    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0)
    try:
        inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    except ValueError as err:  # peft's NoMatchingPeftModuleError
        raise ValueError(f"lora_targets {targets} match no linear layer of the model") from err
    return sum(isinstance(m, LoraLayer) for m in model.modules())


def full_parameters(model: nn.Module, gather: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every parameter under the model's original names, adapters
    merged, on the model's device. ``gather(params)`` is a context manager that makes
    partitioned parameters whole (ZeRO-3: a collective, so every rank must iterate in step);
    a tensor is valid until the next one is requested."""
    from peft.tuners.lora import LoraLayer

    lora = {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}
    for name, p in model.named_parameters():
        if ".lora_" in name:  # merged into its base weight below
            continue
        owner, _, leaf = name.rpartition(".base_layer.")
        if owner in lora:
            if leaf == "weight":
                with torch.no_grad():
                    yield f"{owner}.weight", p + lora[owner].get_delta_weight(ADAPTER)
            else:
                yield f"{owner}.{leaf}", p.detach()
            continue
        with gather([p]):
            yield name, p.detach()


def merged_state(model: nn.Module, gather: Any) -> dict[str, torch.Tensor]:
    """:func:`full_parameters` as a CPU state dict."""
    return {name: t.to("cpu", copy=True).contiguous() for name, t in full_parameters(model, gather)}


def adapter(
    model: nn.Module, rank: int, alpha: float, targets: list[str], base: str
) -> LoraAdapter:
    """The adapter's tensors (CPU) and config in PEFT's format, for the base model at ``base``:
    what vLLM's and peft's adapter loaders read. The model's parameters must be whole (LoRA is
    not combined with ZeRO-3)."""
    from peft import LoraConfig, get_peft_model_state_dict
    from safetensors.torch import save

    # peft saves a PeftModel's tensors under "base_model.model." + the model's own names.
    state = {
        f"base_model.model.{name}": t.detach().to("cpu", copy=True).contiguous()
        for name, t in get_peft_model_state_dict(model, adapter_name=ADAPTER).items()
    }
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=targets,
        lora_dropout=0.0,
        base_model_name_or_path=base,
        task_type="CAUSAL_LM",
    )
    text = json.dumps(config.to_dict(), indent=2, sort_keys=True, default=sorted)
    return LoraAdapter(config=text, weights=save(state))
