"""GRPO's maths, kept free of Ray and DeepSpeed so it can be checked by hand.

Advantages are group-normalised rewards; the token loss is the clipped surrogate with decoupled
ε_low / ε_high (DAPO's clip-higher), an optional k3 KL to a frozen reference, and an optional
truncated importance weight correcting for the sampler's distribution differing from the
learner's (e.g. under constrained decoding). Losses are *summed* here; the caller divides by the
number of response tokens in the global batch, which makes the loss a token mean over the whole
batch rather than a mean of per-sequence means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where the maths runs: configs load without it
    import torch


@dataclass
class GRPOConfig:
    eps_low: float = 0.2
    eps_high: float = 0.28
    kl_coef: float = 0.0  # > 0 keeps a frozen reference model in each learner
    std_normalize: bool = True  # Dr. GRPO turns this off
    tis_cap: float | None = None  # cap of the sampler-correction weight; None: no correction
    # PPO-style reuse of a rollout batch: ``update_epochs`` passes over it, each split into
    # ``mini_batches`` optimizer steps, all against the log-probs taken once before the first.
    # 1 and 1 (the default) is strictly on-policy: one update, ratio 1, nothing to clip.
    update_epochs: int = 1
    mini_batches: int = 1

    @property
    def on_policy(self) -> bool:
        return self.update_epochs * self.mini_batches == 1

    def __post_init__(self) -> None:
        if self.update_epochs < 1 or self.mini_batches < 1:
            raise ValueError("grpo needs update_epochs >= 1 and mini_batches >= 1")
        if not (0 < self.eps_low < 1 and self.eps_high > 0):
            raise ValueError("grpo needs 0 < eps_low < 1 and eps_high > 0")
        if self.kl_coef < 0 or (self.tis_cap is not None and self.tis_cap < 1):
            raise ValueError("grpo needs kl_coef >= 0 and tis_cap >= 1 (or null)")


def group_advantages(
    rewards: torch.Tensor, group_size: int, std_normalize: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """``A_i = (r_i - mean(group)) / (std(group) + eps)``; rewards are laid out group by group."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    g = rewards.float().view(-1, group_size)
    adv = g - g.mean(dim=1, keepdim=True)
    if std_normalize:
        adv = adv / (g.std(dim=1, keepdim=True) + eps)
    return adv.view(-1)


def grpo_token_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: GRPOConfig,
    ref_logp: torch.Tensor | None = None,
    sampler_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Summed loss over masked tokens, shapes [B, T] (advantages [B]), and summed statistics
    (``clipped``, ``kl``) for the caller to average over the same token count."""
    import torch

    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(1)
    ratio = torch.exp(logp - old_logp)
    clipped_ratio = ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high)
    surrogate = torch.minimum(ratio * adv, clipped_ratio * adv)
    per_token = -surrogate
    if sampler_logp is not None and cfg.tis_cap is not None:
        weight = torch.exp(old_logp - sampler_logp).clamp(max=cfg.tis_cap).detach()
        per_token = per_token * weight
    kl = torch.zeros_like(logp)
    if ref_logp is not None:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1  # k3: unbiased, always >= 0
        per_token = per_token + cfg.kl_coef * kl
    clipped = ((ratio * adv) > (clipped_ratio * adv)).to(logp.dtype)
    return (per_token * mask).sum(), {
        "clipped": (clipped * mask).sum().detach(),
        "kl": (kl * mask).sum().detach(),
    }
