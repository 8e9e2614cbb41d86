"""Per-token log-probabilities without materialising [batch, tokens, vocab] float32 logits.

The model's final hidden states are projected through the LM head one chunk of positions at a
time; each chunk's logits live only long enough to take a log-softmax, gather the target token
and (optionally) the entropy, and are recomputed in backward (checkpointing), so peak memory
holds one chunk.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


def _chunk_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    logp_all = torch.log_softmax((hidden @ weight.T).float(), dim=-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1), entropy


def sequence_logprobs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, chunk: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """``logp[b, t] = log p(input_ids[b, t+1] | input_ids[b, :t+1])`` and the entropy of that
    distribution (no gradient), both [B, T-1] float32."""
    module = getattr(model, "module", model)
    out = module.model(input_ids=input_ids, attention_mask=attention_mask)
    hidden = out.last_hidden_state[:, :-1]
    targets = input_ids[:, 1:]
    weight = module.get_output_embeddings().weight
    logps, entropies = [], []
    for s in range(0, hidden.shape[1], chunk):
        h, t = hidden[:, s : s + chunk], targets[:, s : s + chunk]
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_chunk_logprobs, h, weight, t, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(h, weight, t)
        logps.append(lp)
        entropies.append(ent.detach())
    return torch.cat(logps, dim=1), torch.cat(entropies, dim=1)
