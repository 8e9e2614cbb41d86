"""Per-token log-probabilities of a group of responses to one prompt.

Two costs are avoided. The prompt -- most of a picker's tokens -- is run once per group, and
its key/value cache is shared by every response (exact: the same attention, one forward pass
for the prompt instead of G; gradients flow back through the shared cache). And logits are
never materialised as a [batch, tokens, vocab] float32 tensor: hidden states go through the
LM head one chunk of positions at a time, each chunk's logits living only long enough for a
log-softmax, the target's log-prob and the entropy, recomputed in backward (checkpointing).
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


def group_logprobs(
    model: Any,
    prompt: torch.Tensor,
    responses: torch.Tensor,
    mask: torch.Tensor,
    chunk: int = 256,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``prompt`` [P] and right-padded ``responses`` [G, L] with ``mask`` [G, L]:
    ``logp[g, t] = log p(responses[g, t] | prompt, responses[g, :t])`` and that distribution's
    entropy (no gradient), both [G, L] float32."""
    module = getattr(model, "module", model)
    body = module.model
    g = responses.shape[0]
    head = body(input_ids=prompt[None], use_cache=True)
    cache = head.past_key_values
    cache.batch_repeat_interleave(g)
    attn = torch.cat([mask.new_ones(g, prompt.shape[0]), mask], dim=1)
    tail = body(input_ids=responses, attention_mask=attn, past_key_values=cache, use_cache=True)
    # Position P-1 (the prompt's last token) predicts response token 0.
    hidden = torch.cat(
        [head.last_hidden_state[:, -1:].expand(g, 1, -1), tail.last_hidden_state[:, :-1]], dim=1
    )
    weight = module.get_output_embeddings().weight
    logps, entropies = [], []
    for s in range(0, hidden.shape[1], chunk):
        h, t = hidden[:, s : s + chunk], responses[:, s : s + chunk]
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_chunk_logprobs, h, weight, t, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(h, weight, t)
        logps.append(lp)
        entropies.append(ent.detach())
    return torch.cat(logps, dim=1), torch.cat(entropies, dim=1)
