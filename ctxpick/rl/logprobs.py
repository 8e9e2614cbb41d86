"""Per-token log-probabilities of a group of responses to one prompt.

Two costs are avoided. The prompt -- most of a picker's tokens -- is run once per group, and
its key/value cache is shared by every response (exact: the same attention, one forward pass
for the prompt instead of G; gradients flow back through the shared cache). And logits are
never materialised as a [batch, tokens, vocab] float32 tensor: hidden states go through the
LM head one chunk of positions at a time, each chunk's logits living only long enough for a
log-softmax, the target's log-prob and the entropy, recomputed in backward (checkpointing).

The LM head is called as a module (not ``hidden @ weight.T``), so under ZeRO-3 its partitioned
weight is gathered by DeepSpeed's hooks on every rank, in forward and in the recompute.
Log-probs are those of the distribution the rollout engine sampled from: logits divided by
the sampling temperature, as vLLM does before sampling.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

# Decoder-only families whose forward is ``lm_head(model(...).last_hidden_state)`` with a
# DynamicCache that can be repeated along the batch: what the shared-prompt pass assumes. Others
# (logit soft-capping, scaled logits, encoder-decoders, GPT-2's ``transformer`` body) would get
# silently wrong log-probs, so they are refused.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def check_supported(model: Any) -> None:
    module = getattr(model, "module", model)
    cfg = getattr(module, "config", None)
    kind = getattr(cfg, "model_type", type(module).__name__)
    scaled = [
        k
        for k in ("final_logit_softcapping", "logit_scale", "logits_scaling")
        if getattr(cfg, k, None) not in (None, 1, 1.0)
    ]
    if kind not in SUPPORTED_MODEL_TYPES or scaled or not hasattr(module, "model"):
        raise ValueError(
            f"model type {kind!r} ({type(module).__name__}) is not supported by the learner's "
            f"shared-prompt log-prob pass (supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            f"{'; it scales its logits: ' + ', '.join(scaled) if scaled else ''})"
        )


def _chunk_logprobs(
    hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    logp_all = torch.log_softmax(head(hidden).float() / temperature, dim=-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1), entropy


def group_logprobs(
    model: Any,
    prompt: torch.Tensor,
    responses: torch.Tensor,
    mask: torch.Tensor,
    chunk: int = 256,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``prompt`` [P] and right-padded ``responses`` [G, L] with ``mask`` [G, L]:
    ``logp[g, t] = log p_T(responses[g, t] | prompt, responses[g, :t])`` at ``temperature`` T
    and that distribution's entropy (no gradient), both [G, L] float32."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")
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
    lm_head = module.get_output_embeddings()
    logps, entropies = [], []
    for s in range(0, hidden.shape[1], chunk):
        h, t = hidden[:, s : s + chunk], responses[:, s : s + chunk]
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_chunk_logprobs, h, lm_head, t, temperature, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(h, lm_head, t, temperature)
        logps.append(lp)
        entropies.append(ent.detach())
    return torch.cat(logps, dim=1), torch.cat(entropies, dim=1)
